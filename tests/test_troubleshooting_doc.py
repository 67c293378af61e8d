"""docs/troubleshooting.md quotes what operators see; every quote here is produced by the
code that writes it (not copied from it), so a reworded message breaks this test before it
misleads anyone."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from kubectl_tessera.explain import explain, render_explanation
from nri_hook.adjust import DeviceNode, Settings, decode_record, plan_container
from nri_hook.cli import build_parser, check_isolation
from nri_hook.config import NriHookConfig
from nri_hook.errors import RejectError
from scheduler_plugin.state.heartbeats import HeartbeatTracker
from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.record import Keyring, encode
from tessera_cli import ConfigError, config_from
from tessera_edge.topology_file import load_topology
from tessera_testbed.inventory import heartbeat_lease
from tests.kubectl.conftest import nodedevices

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "troubleshooting.md").read_text()
KEYRING = Keyring.generate("k1")
NODE = "NODE"


def _in_doc(text: str) -> None:
    """`text` appears in the page as written, line breaks aside."""
    assert " ".join(text.split()) in " ".join(DOC.split()), text


def _bound(name: str, node: str, topology: str, gpus: range) -> dict[str, Any]:
    inventory = load_topology(topology, node_name=node)
    grants = tuple(
        GpuGrant(g.uuid, g.index, g.minor, 100, g.memory_mib)
        for g in inventory.gpus
        if g.index in gpus
    )
    uid = f"uid-{name}"
    alloc = PodAllocation(uid, "ml", name, node, (ContainerAllocation("main", gpus=grants),))
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid,
            "annotations": {rn.ALLOCATION_ANNOTATION: encode(alloc, KEYRING)},
        },
        "spec": {"nodeName": node, "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }


def test_the_explain_example_is_what_explain_prints() -> None:
    (example,) = re.findall(r"```\n(Pod ml/train: .*?)```", DOC, re.S)
    pod = {
        "metadata": {"name": "train", "namespace": "ml", "uid": "uid-train"},
        "spec": {
            "schedulerName": "tessera",
            "containers": [{"name": "main", "resources": {"limits": {rn.GPU: "400"}}}],
        },
        "status": {"phase": "Pending"},
    }
    nodes = [nodedevices("h100", "h100-sxm-8x"), nodedevices("t4", "t4-4x")]
    held = [_bound("a", "h100", "h100-sxm-8x", range(6)), _bound("b", "t4", "t4-4x", range(1))]
    leases = [heartbeat_lease("h100"), heartbeat_lease("t4")]
    got = explain(pod, nodes, held, leases, time.time(), policy=rn.DEFAULT_POLICY)
    assert render_explanation(got) + "\n" == example


def _reject(text: str, *, node: str = "gpu-3", uid: str = "uid-1") -> str:
    with pytest.raises(RejectError) as refused:
        decode_record(text, KEYRING.verifier(), require_integrity=True, pod_uid=uid, node=node)
    return refused.value.message


def test_each_create_container_error_row_quotes_the_hooks_message() -> None:
    gpu = GpuGrant("GPU-0f0f0f0f-0000-0000-0000-000000000000", 3, 3, 30, 8192)
    alloc = PodAllocation("uid-1", "ml", "job", "gpu-7", (ContainerAllocation("main", (gpu,)),))
    elsewhere = _reject(encode(alloc, KEYRING))
    assert elsewhere.startswith("allocation record belongs elsewhere: ")
    _in_doc("`allocation record belongs elsewhere: ...`")
    assert _reject("{").startswith("invalid allocation record: ")
    _in_doc("`invalid allocation record: ...`")
    here = PodAllocation("uid-1", "ml", "job", "gpu-3", alloc.containers)
    forged = encode(here, Keyring.generate("k1"))  # same key ID, another key
    assert _reject(forged).startswith("allocation record integrity check failed: ")
    _in_doc("`integrity check failed: ...`")
    assert "unknown key id" in _reject(encode(here, Keyring.generate("k2")))
    _in_doc("`unknown key id`")

    with pytest.raises(RejectError) as missing:
        plan_container(here, "main", Settings(), Host())
    assert "device node /dev/nvidia3 is missing on this node" in missing.value.message
    _in_doc("`device node /dev/nvidiaN is missing on this node`")
    layer = Settings(isolation="hami-core", hami_core_library="/usr/local/vgpu/libvgpu.so")
    with pytest.raises(RejectError) as no_layer:
        plan_container(here, "main", layer, AllDevices())
    quoted = "isolation layer hami-core: the HAMi-core library /usr/local/vgpu/libvgpu.so"
    assert quoted in no_layer.value.message
    _in_doc(f"`{quoted} (--hami-core-library) is missing on this node`")


class Host:
    """A node without /dev/nvidia3 and without any isolation layer's files."""

    def device(self, path: str) -> DeviceNode | None:
        return None if path == "/dev/nvidia3" else DeviceNode(path, "c", 195, 0, 0o666)

    def gpu_minors(self) -> None:
        return None

    def exists(self, path: str) -> bool:
        return False


class AllDevices(Host):
    def device(self, path: str) -> DeviceNode | None:
        return DeviceNode(path, "c", 195, 0, 0o666)


def test_the_hook_that_will_not_start_is_quoted_as_it_exits() -> None:
    config = config_from(NriHookConfig, build_parser().parse_args([]))
    with pytest.raises(ConfigError) as refused:
        check_isolation(config)
    _in_doc(f"tessera-nri-hook: error: {refused.value}")


def test_the_silent_agent_reason_is_the_trackers() -> None:
    tracker = HeartbeatTracker(rn.DEFAULT_HEARTBEAT_NAMESPACE, grace=10)
    now = time.time()
    tracker.observe(heartbeat_lease(NODE, renewed=now - 400, duration_s=40), now)
    problem = tracker.problem(NODE, now)
    assert problem is not None
    quoted = problem.split(" not renewed for ")[0] + " not renewed for"
    _in_doc(f"`{quoted} ...s`")


def test_the_fence_reason_and_event_are_the_schedulers() -> None:
    from scheduler_plugin.state import problems
    from scheduler_plugin.views import events

    source = Path(problems.__file__).read_text()
    assert '"node is fenced: a running pod carries an untrusted allocation record' in source
    _in_doc("`tessera: node is fenced: ...")
    assert '"UntrustedAllocationRecord"' in Path(events.__file__).read_text()
    _in_doc("`UntrustedAllocationRecord`")


def test_the_fail_closed_gate_and_its_refusals_are_quoted_as_written(tmp_path: Path) -> None:
    import asyncio

    from nri_hook.devices import HostDevices
    from nri_hook.enforce import Enforcer, EnforcerConfig
    from tessera_edge.host_paths import NRI_GATE_DESTINATION
    from tessera_edge.keyfiles import KeyringSource
    from tessera_testbed.containerd import make_container, make_pod
    from tessera_ttrpc import RpcError
    from tests.keyfiles import write_public

    _in_doc(f"`{NRI_GATE_DESTINATION}`")
    enforcer = Enforcer(
        EnforcerConfig(node_name=NODE),
        KeyringSource(write_public(KEYRING, tmp_path / "keys")),
        HostDevices(tmp_path),
    )
    pod = make_pod("job", namespace="ml")
    container = make_container(pod, "main")
    container.mounts.add(destination=NRI_GATE_DESTINATION, source="/dev/null", type="bind")
    with pytest.raises(RpcError) as refused:
        asyncio.run(enforcer.create_container(pod, container))
    reason = refused.value.message.split('"main": ', 1)[1]
    _in_doc(reason.split(";")[0])
