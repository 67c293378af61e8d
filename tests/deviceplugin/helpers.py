from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deviceplugin.agent import Agent, AgentConfig
from deviceplugin.fake_backend import FakeBackend
from deviceplugin.units import UnitConfig
from deviceplugin.usage import PodView
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as pb


def make_agent(
    plugin_dir: Path, topology: str = "h100-sxm-8x", units: UnitConfig | None = None, **config: Any
) -> tuple[Agent, FakeBackend]:
    backend = FakeBackend.from_topology(topology)
    settings: dict[str, Any] = {
        "node_name": "node-a",
        "plugin_dir": plugin_dir,
        "poll_interval_s": 0.05,
        "query_interval_s": 0,
        "event_timeout_s": 0.2,
        "units": units or UnitConfig(),
    }
    settings.update(config)
    return Agent(AgentConfig(**settings), backend, backend), backend


def captured_request(vectors: Path, method: str) -> bytes:
    """The request a real kubelet sent to `method`, as captured: the file `NNN-<method>.pb`
    (NNN numbers the calls in the order it made them)."""
    (path,) = vectors.glob(f"[0-9][0-9][0-9]-{method}.pb")
    return path.read_bytes()


@contextmanager
def running(agent: Agent) -> Iterator[Agent]:
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def health_by_device(message: pb.ListAndWatchResponse) -> dict[str, set[str]]:
    """device key -> the set of health strings its units have."""
    out: dict[str, set[str]] = {}
    for device in message.devices:
        key = device.ID.split("::")[0]  # where dcgm-exporter cuts a shared device's ID
        out.setdefault(key, set()).add(device.health)
    return out


class StaticPods:
    """A usage loop's pod source that knows a fixed set of pods (as the API server would
    list them)."""

    def __init__(self, views: list[PodView]) -> None:
        self.views = {v.uid: v for v in views}

    def pods(self, wanted: set[str]) -> dict[str, PodView]:
        return {uid: self.views[uid] for uid in wanted if uid in self.views}
