"""The usage loop on the node: NVML's process lists (a stand-in pynvml), the processes'
cgroups and names from a /proc tree built here, pods and their signed records from an API
server, and what comes out: rows used beside granted, the over-grant warning once, the
heartbeat's annotation and the agent's /metrics."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backend import GpuProcess
from deviceplugin.fake_backend import FakeBackend
from deviceplugin.inventory import InventoryConfig, InventoryPublisher
from deviceplugin.metrics import agent_registry
from deviceplugin.nvml_backend import NvmlBackend
from deviceplugin.record_pods import list_node_pods
from deviceplugin.usage import MIB, PodView
from deviceplugin.usage_monitor import ApiPods, UsageMonitor, pod_view, process_owner
from kube_edge.client import KubeClient
from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.record import Keyring, encode
from tessera.usage import decode_usage
from tessera_cli.metrics import serve_metrics
from tessera_edge.keyfiles import KeyringSource
from tessera_testbed.apiserver import FakeApiServer
from tests.deviceplugin import fake_pynvml as nv
from tests.deviceplugin.helpers import StaticPods, make_agent, running
from tests.deviceplugin.test_metrics import _free_port, _scrape

NODE = "node-a"
POD_UID = "8d3e5b1c-2f4a-4b6c-9d0e-1f2a3b4c5d6e"
OTHER_UID = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
CID = "a" * 64
OTHER_CID = "b" * 64


def _cgroup(pod_uid: str, container_id: str) -> str:
    pod = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/"
        f"cri-containerd-{container_id}.scope\n"
    )


def proc_tree(root: Path, processes: dict[int, tuple[str, str]]) -> Path:
    """A /proc with `comm` and `cgroup` for each pid."""
    for pid, (comm, cgroup) in processes.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "cgroup").write_text(cgroup)
    return root


# --- NVML ----------------------------------------------------------------------------------


def _nvml(**lists: Any) -> nv.FakeNvml:
    gpu = nv.FakeGpu("GPU-a", "NVIDIA H100", "00000000:18:00.0", 81559, minor=0, **lists)
    return nv.FakeNvml([gpu])


def test_nvml_lists_compute_graphics_and_mps_clients_once_each(tmp_path: Path) -> None:
    fake = _nvml(
        compute=[nv.ProcessInfo(10, 4 * MIB), nv.ProcessInfo(11, None)],
        graphics=[nv.ProcessInfo(10, 5 * MIB)],  # the same process: one context, not two
        mps=[nv.ProcessInfo(12, 2 * MIB)],
        samples=[
            nv.ProcessUtilizationSample(10, 100, 40),
            nv.ProcessUtilizationSample(10, 200, 60),
            nv.ProcessUtilizationSample(11, 150, 7),
        ],
    )
    backend = NvmlBackend(fake, sysfs_root=tmp_path)
    backend.discover()
    (reading,) = backend.processes()
    assert reading.uuid == "GPU-a" and reading.error == ""
    assert reading.processes == (
        GpuProcess(10, 5 * MIB, 50, False),  # the mean of its samples
        GpuProcess(11, None, 7, False),
        GpuProcess(12, 2 * MIB, None, True),
    )
    # only samples newer than the last read count; none left is the driver's NOT_FOUND
    (again,) = backend.processes()
    assert [p.sm_percent for p in again.processes] == [None, None, None]
    fake.gpus[0].samples.append(nv.ProcessUtilizationSample(11, 300, 90))
    (third,) = backend.processes()
    assert [p.sm_percent for p in third.processes] == [None, 90, None]


def test_an_unreadable_process_list_is_an_error_of_that_gpu(tmp_path: Path) -> None:
    fake = _nvml(fail={"nvmlDeviceGetComputeRunningProcesses": nv.NVML_ERROR_GPU_IS_LOST})
    backend = NvmlBackend(fake, sysfs_root=tmp_path)
    backend.discover()
    (reading,) = backend.processes()
    assert reading.processes == ()
    assert "nvmlDeviceGetComputeRunningProcesses" in reading.error
    assert "GPU is lost" in reading.error


def test_optional_lists_the_driver_refuses_are_left_out(tmp_path: Path) -> None:
    fake = _nvml(
        compute=[nv.ProcessInfo(10, MIB)],
        fail={
            "nvmlDeviceGetMPSComputeRunningProcesses": nv.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetGraphicsRunningProcesses": nv.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetProcessUtilization": nv.NVML_ERROR_NOT_SUPPORTED,
        },
    )
    backend = NvmlBackend(fake, sysfs_root=tmp_path)
    backend.discover()
    (reading,) = backend.processes()
    assert reading.processes == (GpuProcess(10, MIB, None, False),)


# --- /proc ----------------------------------------------------------------------------------


def test_a_process_is_its_containers_the_hosts_or_the_mps_servers(tmp_path: Path) -> None:
    proc = proc_tree(
        tmp_path,
        {
            1: ("python", _cgroup(POD_UID, CID)),
            2: ("nvidia-cuda-mps-server", "0::/system.slice/mps.service\n"),
            3: ("sshd", "0::/user.slice/user-0.slice\n"),
            # as a container with its own cgroup namespace reads a host process's file
            4: ("python", "0::/../../" + _cgroup(OTHER_UID, OTHER_CID)[4:]),
        },
    )
    assert process_owner(proc, 1).kind == "container"
    assert (process_owner(proc, 1).pod_uid, process_owner(proc, 1).container_id) == (POD_UID, CID)
    assert process_owner(proc, 2).kind == "mps-server"
    assert process_owner(proc, 3).kind == "host"
    assert process_owner(proc, 4).pod_uid == OTHER_UID
    assert process_owner(proc, 99).kind == "host"  # gone between the two reads


# --- pods and records -------------------------------------------------------------------------


def _pod(ring: Keyring | None, uid: str = POD_UID, grant: GpuGrant | None = None) -> dict[str, Any]:
    grant = grant or GpuGrant("GPU-a", 0, 0, 30, 4096)
    record = PodAllocation(uid, "ml", "trainer-3", NODE, (ContainerAllocation("main", (grant,)),))
    return {
        "metadata": {
            "name": "trainer-3",
            "namespace": "ml",
            "uid": uid,
            "annotations": {rn.ALLOCATION_ANNOTATION: encode(record, ring)},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{CID}"}],
        },
    }


def test_a_pod_view_takes_grants_only_from_a_record_that_verifies() -> None:
    ring = Keyring.generate()
    view = pod_view(_pod(ring), NODE, ring.verifier(), require_integrity=True)
    assert view is not None
    assert view.containers == {CID: "main"}
    assert view.grants is not None and view.grants["main"]["GPU-a"].memory_mib == 4096
    forged = pod_view(_pod(None), NODE, ring.verifier(), require_integrity=True)
    assert forged is not None and forged.grants is None  # listed, but nothing granted
    elsewhere = _pod(ring)
    elsewhere["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = encode(
        PodAllocation(POD_UID, "ml", "trainer-3", "node-b", ()), ring
    )
    other_node = pod_view(elsewhere, NODE, ring.verifier(), require_integrity=True)
    assert other_node is not None and other_node.grants is None
    assert pod_view({"metadata": "x"}, NODE, None, require_integrity=False) is None


def test_pods_are_listed_again_only_for_a_new_pod_and_not_too_often() -> None:
    ring = Keyring.generate()
    now = [0.0]
    calls: list[int] = []

    def listing() -> list[dict[str, Any]]:
        calls.append(1)
        return [_pod(ring)]

    pods = ApiPods(listing, NODE, KeyringSource.fixed(ring.verifier()), 30.0, lambda: now[0])
    assert set(pods.pods({POD_UID})) == {POD_UID}
    assert set(pods.pods({POD_UID})) == {POD_UID} and len(calls) == 1  # known: no listing
    assert pods.pods({OTHER_UID}) == {} and len(calls) == 1  # unknown, but too soon
    now[0] = 31.0
    assert pods.pods({OTHER_UID}) == {} and len(calls) == 2


def test_an_api_server_that_fails_leaves_pods_unnamed_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]

    def failing() -> list[dict[str, Any]]:
        raise RuntimeError("connection refused")

    pods = ApiPods(failing, NODE, None, 30.0, lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="deviceplugin.usage_monitor"):
        for step in range(3):
            now[0] = 31.0 * step
            assert pods.pods({POD_UID}) == {}
    said = [r for r in caplog.records if "cannot name the pods" in r.getMessage()]
    assert len(said) == 1 and pods.error == "connection refused"


# --- the loop ---------------------------------------------------------------------------------


def _fake_node(tmp_path: Path) -> tuple[FakeBackend, str, Path]:
    backend = FakeBackend.from_topology("t4-4x")
    gpu = backend.gpu(2).uuid
    backend.set_processes(
        gpu,
        (
            GpuProcess(100, 6144 * MIB, 80),  # the share's process, over its 4 GiB and 30 %
            GpuProcess(101, 512 * MIB, None),  # a host process
            GpuProcess(102, 1024 * MIB, 5),  # a pod without a tessera record
        ),
    )
    proc = proc_tree(
        tmp_path / "proc",
        {
            100: ("python", _cgroup(POD_UID, CID)),
            101: ("Xorg", "0::/system.slice/display.service\n"),
            102: ("python", _cgroup(OTHER_UID, OTHER_CID)),
        },
    )
    return backend, gpu, proc


def _views(gpu: str) -> list[PodView]:
    grant = GpuGrant(gpu, 2, 2, 30, 4096)
    return [
        PodView(POD_UID, "ml", "trainer-3", {CID: "main"}, {"main": {gpu: grant}}),
        PodView(OTHER_UID, "other", "theirs", {OTHER_CID: "app"}, None),
    ]


def test_a_reading_puts_each_process_where_it_belongs_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend, gpu, proc = _fake_node(tmp_path)
    index = {g.uuid: g.index for g in backend.discover().gpus}
    monitor = UsageMonitor(backend, lambda: index, StaticPods(_views(gpu)), proc_root=proc)
    with caplog.at_level(logging.WARNING, logger="deviceplugin.usage_monitor"):
        for _ in range(4):
            snapshot = monitor.read_once()
    (use,) = snapshot.containers
    assert (use.namespace, use.pod, use.container, use.gpu, use.gpu_index) == (
        "ml",
        "trainer-3",
        "main",
        gpu,
        2,
    )
    assert (use.used_bytes, use.granted_memory_mib, use.sm_percent, use.granted_core) == (
        6144 * MIB,
        4096,
        80,
        30,
    )
    assert {(o.owner, o.used_bytes) for o in snapshot.other} == {
        ("host", 512 * MIB),
        ("other-pod", 1024 * MIB),
    }
    warnings = [r.getMessage() for r in caplog.records if "over its grant" in r.getMessage()]
    assert len(warnings) == 2, warnings  # memory at once, compute after 3 readings; once each
    assert "pod=ml/trainer-3 container=main" in warnings[0]
    assert "6,144 MiB" in warnings[0] and "4,096 MiB" in warnings[0]
    assert monitor.watch.counts == {"memory": 1, "compute": 1}
    report = decode_usage(monitor.annotation() or "")
    assert [(c.pod, c.memory_mib, c.sm_percent) for c in report.containers] == [
        ("trainer-3", 6144, 80)
    ]
    assert {o.owner for o in report.unattributed} == {"host", "other-pod"}


def test_pods_and_records_come_from_the_api_server(tmp_path: Path) -> None:
    backend, gpu, proc = _fake_node(tmp_path)
    ring = Keyring.generate()
    index = {g.uuid: g.index for g in backend.discover().gpus}
    with FakeApiServer() as api:
        api.create("pods", _pod(ring, grant=GpuGrant(gpu, 2, 2, 30, 4096)))
        client = KubeClient.for_host(api.url)
        pods = ApiPods(
            lambda: list_node_pods(client, NODE, 5.0), NODE, KeyringSource.fixed(ring.verifier())
        )
        monitor = UsageMonitor(backend, lambda: index, pods, proc_root=proc)
        snapshot = monitor.read_once()
    (use,) = snapshot.containers
    assert (use.pod, use.granted_memory_mib) == ("trainer-3", 4096)
    assert pods.listings == 1


def test_a_failing_gpu_list_is_reported_and_the_others_still_read(tmp_path: Path) -> None:
    backend, gpu, proc = _fake_node(tmp_path)
    broken = backend.gpu(0).uuid
    backend.set_processes(broken, error="nvmlDeviceGetComputeRunningProcesses: GPU is lost")
    index = {g.uuid: g.index for g in backend.discover().gpus}
    snapshot = UsageMonitor(
        backend, lambda: index, StaticPods(_views(gpu)), proc_root=proc
    ).read_once()
    assert snapshot.errors == (f"{broken}: nvmlDeviceGetComputeRunningProcesses: GPU is lost",)
    assert len(snapshot.containers) == 1


# --- what the agent exports -------------------------------------------------------------------


def test_the_agents_metrics_show_used_beside_granted(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path / "plugins", topology="t4-4x")
    backend, gpu, proc = _fake_node(tmp_path)
    agent.backend = backend
    agent.usage = UsageMonitor(
        backend, agent.gpu_indexes, StaticPods(_views(gpu)), proc_root=proc, interval_s=60
    )
    port = _free_port()
    with running(agent):
        serve_metrics(agent_registry(agent), port, "127.0.0.1")
        samples = _scrape(port)
    labels = {"container": "main", "gpu": "2", "namespace": "ml", "node": "node-a"}
    ident = tuple(sorted({**labels, "pod": "trainer-3", "uuid": gpu}.items()))
    assert samples[("tessera_container_gpu_memory_used_bytes", ident)] == 6144 * MIB
    assert samples[("tessera_container_gpu_memory_granted_bytes", ident)] == 4096 * MIB
    assert samples[("tessera_container_gpu_sm_used_ratio", ident)] == 0.8
    assert samples[("tessera_container_gpu_core_granted_ratio", ident)] == 0.3
    pods = {dict(k[1]).get("pod") for k in samples if k[0].startswith("tessera_container_gpu")}
    assert pods == {"trainer-3"}  # the host process and the other pod are no pod's rows
    host = (("gpu", "2"), ("node", "node-a"), ("owner", "host"), ("uuid", gpu))
    assert samples[("tessera_gpu_unattributed_memory_used_bytes", host)] == 512 * MIB
    assert samples[("tessera_gpu_over_grant_total", (("kind", "memory"), ("node", "node-a")))] == 1


def test_the_heartbeat_carries_the_reading_and_drops_it_when_there_is_none() -> None:
    with FakeApiServer() as api:
        publisher = InventoryPublisher(
            KubeClient.for_host(api.url), InventoryConfig(node_name=NODE)
        )
        publisher.heartbeat('{"v":1,"at":"2026-11-27T14:10:03Z","c":[],"o":[]}')
        lease = api.get("leases", f"{rn.HEARTBEAT_LEASE_PREFIX}{NODE}", "tessera-system")
        assert lease["metadata"]["annotations"][rn.USAGE_ANNOTATION].startswith('{"v":1')
        publisher.heartbeat('{"v":1,"at":"2026-11-27T14:10:13Z","c":[],"o":[]}')
        lease = api.get("leases", f"{rn.HEARTBEAT_LEASE_PREFIX}{NODE}", "tessera-system")
        assert "14:10:13" in lease["metadata"]["annotations"][rn.USAGE_ANNOTATION]
        publisher.heartbeat(None)
        lease = api.get("leases", f"{rn.HEARTBEAT_LEASE_PREFIX}{NODE}", "tessera-system")
        assert rn.USAGE_ANNOTATION not in (lease["metadata"].get("annotations") or {})
