"""Recovery: the rebuild rule, restarts that change no decision, and crashes mid-burst
(in-process and as a SIGKILLed process) that leave no double allocation and no leak.

The invariant is checked from the API objects alone: the records that count (recovery
rule) never overcommit a device, and a restarted scheduler accounts exactly those."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from kube_edge import config
from kube_edge.client import KubeClient
from kube_edge.loop_client import LoopClient
from scheduler_plugin.service import Service
from scheduler_plugin.state.values import Holds, Invalid, Nothing
from scheduler_plugin.watches.recovery import judge, rebuild
from tessera import resources as rn
from tessera.allocation import PodAllocation
from tessera.model import NodeInventory
from tessera.record import Keyring, decode, encode
from tessera_testbed.apiserver import FakeApiServer
from tests.keyfiles import write_private
from tests.scheduler.helpers import (
    KEYRING,
    ROOT,
    Http,
    Served,
    options,
    pod,
    populate,
    running,
    schedule,
    share,
    wait_for,
)

NODES = ["a", "b", "c"]
SHAPES = [share(30, 30), share(50, 50), {rn.GPU: 100}, share(20, 40), {rn.GPU: 200}, share(70, 60)]


def burst(n: int, prefix: str = "p") -> list[dict[str, Any]]:
    return [pod(f"{prefix}{i}", SHAPES[i % len(SHAPES)], uid=f"uid-{prefix}{i}") for i in range(n)]


# --- the rule -------------------------------------------------------------------------------


def _bound_pod(
    node: str = "n",
    *,
    phase: str = "Running",
    key: Keyring | None = KEYRING,
    record_node: str | None = None,
) -> tuple[dict[str, Any], PodAllocation]:
    obj = pod("x", {rn.GPU: 100}, uid="u1")
    obj["spec"]["nodeName"] = node
    obj["status"]["phase"] = phase
    from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation

    alloc = PodAllocation(
        "u1",
        "default",
        "x",
        record_node or node,
        (ContainerAllocation("main", (GpuGrant("GPU-n-0", 0, 0, 100, 81920),)),),
    )
    obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = encode(alloc, key)
    return obj, alloc


def test_the_rebuild_rule() -> None:
    obj, alloc = _bound_pod()
    assert judge(obj, KEYRING) == Holds(alloc)
    unbound = dict(obj, spec=dict(obj["spec"], nodeName=None))
    assert isinstance(judge(unbound, KEYRING), Nothing)  # interrupted between record and bind
    for phase in ("Succeeded", "Failed"):
        assert isinstance(judge(_bound_pod(phase=phase)[0], KEYRING), Nothing)
    deleting = _bound_pod()[0]
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert isinstance(judge(deleting, KEYRING), Holds)  # still running until it is gone
    assert isinstance(judge(_bound_pod(record_node="m")[0], KEYRING), Invalid)
    from tessera.record import Keyring

    other = Keyring.generate("k1")
    assert isinstance(judge(_bound_pod(key=other)[0], KEYRING), Invalid)
    renamed = _bound_pod()[0]
    renamed["metadata"]["name"] = "y"
    assert isinstance(judge(renamed, KEYRING), Invalid)


# --- invariants from API objects --------------------------------------------------------------


def check_no_double_allocation(fake: FakeApiServer) -> dict[str, int]:
    """Sum what the counting records hold per GPU; none may exceed the GPU. Returns the
    compute used per GPU."""
    inventories = {
        o["metadata"]["name"]: NodeInventory.from_dict(o["spec"], node_name=o["metadata"]["name"])
        for o in fake.items("nodedevices")
    }
    core: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    for obj in fake.items("pods"):
        verdict = judge(obj, KEYRING)
        assert not isinstance(verdict, Invalid), verdict
        if isinstance(verdict, Holds):
            for c in verdict.allocation.containers:
                for g in c.gpus:
                    core[g.uuid] += g.core
                    mem[g.uuid] += g.memory_mib
    for inv in inventories.values():
        for gpu in inv.gpus:
            assert core[gpu.uuid] <= 100, (gpu.uuid, core[gpu.uuid])
            assert mem[gpu.uuid] <= gpu.memory_mib, (gpu.uuid, mem[gpu.uuid])
    rebuilt = rebuild(inventories.values(), fake.items("pods"), KEYRING)
    assert rebuilt.invalid == {}
    return dict(core)


def check_accounts_exactly(fake: FakeApiServer, service: Service) -> None:
    """No leak: the scheduler holds exactly what the API objects say (once settled)."""
    inventories = [
        NodeInventory.from_dict(o["spec"], node_name=o["metadata"]["name"])
        for o in fake.items("nodedevices")
    ]

    def same() -> bool:
        expected = rebuild(inventories, fake.items("pods"), KEYRING).state.snapshot()
        snapshot = service.cache.snapshot()
        return not snapshot.inflight and snapshot.accounts == expected

    wait_for(same, timeout=10)


def drain(fake: FakeApiServer, service: Service) -> None:
    """Delete every pod: nothing may stay allocated."""
    for obj in fake.items("pods"):
        fake.delete("pods", obj["metadata"]["name"], obj["metadata"]["namespace"])

    def empty() -> bool:
        snapshot = service.cache.snapshot()
        return not snapshot.allocations and not snapshot.pending

    wait_for(empty)
    served = Served.over(fake, service)
    for name in NODES:
        summary = served.node_summary(name)
        assert all(g["core"]["used"] == 0 for g in summary["gpus"]), summary


def placements(fake: FakeApiServer) -> dict[str, tuple[Any, ...]]:
    result = {}
    for obj in fake.items("pods"):
        text = obj["metadata"].get("annotations", {}).get(rn.ALLOCATION_ANNOTATION)
        if text and obj["spec"].get("nodeName"):
            alloc = decode(text, KEYRING)
            result[obj["metadata"]["name"]] = (
                alloc.node,
                tuple((g.uuid, g.core, g.memory_mib) for c in alloc.containers for g in c.gpus),
            )
    return result


# --- a restart changes no decision -------------------------------------------------------------


def test_a_restart_makes_exactly_the_decisions_it_would_have_made() -> None:
    pods = burst(18)
    results = []
    for restart_at in (None, 7):
        with FakeApiServer() as fake:
            populate(fake, NODES, gpus=4)
            service = Service(options(), KubeClient.for_host(fake.url), KEYRING).start()
            assert service.wait_ready()
            for i, obj in enumerate(pods):
                if i == restart_at:
                    service.stop(release=False)
                    service = Service(options(), KubeClient.for_host(fake.url), KEYRING).start()
                    assert service.wait_ready()
                    check_accounts_exactly(fake, service)
                Served.over(fake, service).schedule(dict(obj), NODES)
            service.stop()
            results.append(placements(fake))
    assert results[0] == results[1]
    assert len(results[0]) >= 12  # most fit: the comparison covers real decisions


# --- crashes in-process ---------------------------------------------------------------------------


class Crash(BaseException):
    """Not an Exception: no handler in the service runs, as if the process died."""


class CrashingClient(KubeClient):
    """Dies at the n-th pod write; with `land`, that write reaches the API server first."""

    def __init__(self, url: str, crash_at: int, land: bool) -> None:
        super().__init__(config.for_host(url))
        self.crash_at = crash_at
        self.land = land
        self.writes = 0
        self.dead = threading.Event()
        self._count = threading.Lock()

    def dies_at(self, method: str, path: str) -> tuple[bool, bool]:
        """(whether this write dies, whether it reaches the API server first)."""
        if method not in ("PATCH", "POST") or "/pods/" not in path:
            return False, False
        with self._count:
            self.writes += 1
            n = self.writes
        if self.dead.is_set() or n >= self.crash_at:
            first = not self.dead.is_set()
            self.dead.set()
            return True, first and self.land
        return False, False

    def request(self, method: str, path: str, body: Any = None, *args: Any, **kw: Any) -> Any:
        dies, lands = self.dies_at(method, path)
        if lands:
            super().request(method, path, body, *args, **kw)
        if dies:
            raise Crash()
        return super().request(method, path, body, *args, **kw)


def _crash_on_the_loop_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Binds await their writes on the extender's event loop (kube_edge.loop_client): the
    same death there."""
    real = LoopClient.request

    async def request(self: LoopClient, method: str, path: str, *args: Any, **kw: Any) -> Any:
        client = self.client
        dies, lands = (
            client.dies_at(method, path) if isinstance(client, CrashingClient) else (False, False)
        )
        if lands:
            await real(self, method, path, *args, **kw)
        if dies:
            raise Crash()
        return await real(self, method, path, *args, **kw)

    monkeypatch.setattr(LoopClient, "request", request)


def _run_burst(
    port: int, fake: FakeApiServer, pods: list[dict[str, Any]], workers: int = 4
) -> None:
    queue = list(pods)
    lock = threading.Lock()

    def worker() -> None:
        http = Http(port)
        while True:
            with lock:
                if not queue:
                    return
                obj = queue.pop(0)
            try:
                if "resourceVersion" not in obj["metadata"]:
                    obj = fake.create("pods", obj)
                schedule(http, fake, obj, NODES)
            except (OSError, AssertionError, ValueError):
                http = Http(port)  # the server died under us; keep trying until the queue ends

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_crash_at_a_random_point_of_a_burst_leaks_nothing(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    crash_at = rng.randint(2, 14)  # a 24-pod burst on 6 GPUs makes ~16 pod writes
    land = rng.random() < 0.5
    monkeypatch.setattr(
        threading,
        "excepthook",
        lambda args: (
            None
            if args.exc_type is Crash
            else sys.__excepthook__(args.exc_type, args.exc_value, args.exc_traceback)
        ),
    )
    _crash_on_the_loop_too(monkeypatch)
    pods = burst(24)
    with FakeApiServer() as fake:
        populate(fake, NODES, gpus=2)
        fake.latency = 0.002
        client = CrashingClient(fake.url, crash_at, land)
        service = Service(options(), client, KEYRING).start()
        assert service.wait_ready()
        _run_burst(service.server.port, fake, pods)
        assert client.dead.is_set()
        service.stop(release=False)
        check_no_double_allocation(fake)

        with running(fake) as again:
            check_accounts_exactly(fake, again)
            bound = set(placements(fake))
            rest = [
                fake.get("pods", p["metadata"]["name"])
                if p["metadata"]["name"] in {o["metadata"]["name"] for o in fake.items("pods")}
                else p
                for p in pods
                if p["metadata"]["name"] not in bound
            ]
            _run_burst(again.server.port, fake, rest)
            used = check_no_double_allocation(fake)
            check_accounts_exactly(fake, again)
            assert sum(used.values()) > 0
            drain(fake, again)


# --- crash as a process -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(kubeconfig: str, keyfile: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "scheduler_plugin.cli",
        "--kubeconfig",
        kubeconfig,
        "--listen",
        f"127.0.0.1:{port}",
        "--health-listen=127.0.0.1:0",
        "--insecure-allow-unauthenticated",  # /debug/pods below, without a token
        "--no-leader-elect",
        "--integrity-key-file",
        str(keyfile),
        "--status-interval",
        "0.5",
        "--log-level",
        "warning",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for a signalled replica (killing it after 10 s) and close its stderr pipe."""
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    if proc.stderr is not None:
        proc.stderr.close()


def _wait_ready(proc: subprocess.Popen[bytes], port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
        try:
            if Http(port).get("/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("tessera-scheduler did not become ready")


def test_sigkill_during_a_burst_then_restart(tmp_path: Path) -> None:
    rng = random.Random(7)
    keyfile = write_private(KEYRING, tmp_path / "record-keys")
    pods = burst(30)
    with FakeApiServer() as fake:
        populate(fake, NODES, gpus=4)
        fake.latency = 0.02  # slow enough that the kill lands in the middle of the burst
        kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))
        port = _free_port()
        proc = _start(kubeconfig, keyfile, port)
        try:
            _wait_ready(proc, port)
            runner = threading.Thread(target=_run_burst, args=(port, fake, pods))
            runner.start()
            kill_after = rng.randint(2, 6)
            wait_for(lambda: len(placements(fake)) >= kill_after, timeout=30)
            proc.send_signal(signal.SIGKILL)
            _reap(proc)
            runner.join(60)
            check_no_double_allocation(fake)

            port = _free_port()
            proc = _start(kubeconfig, keyfile, port)
            _wait_ready(proc, port)
            names = {o["metadata"]["name"]: o for o in fake.items("pods")}
            bound = set(placements(fake))
            rest = [
                names.get(p["metadata"]["name"], p)
                for p in pods
                if p["metadata"]["name"] not in bound
            ]
            _run_burst(port, fake, rest)
            used = check_no_double_allocation(fake)
            assert len(placements(fake)) > len(bound) and sum(used.values()) > 0
            status, _body = Http(port).get("/debug/pods")
            assert status == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            _reap(proc)
