"""tessera on a real node: kubelet, containerd (each release given, in turn) with its own
shim and runc, tessera's node agent as the kubelet's device plugin and the NRI hook, joined
to the control plane of test_control_plane.py.

Checked per release: the kubelet's pod-resources API names, for a fractional pod and a
multi-GPU pod, exactly each container's record GPUs (the agent's preferred allocation
follows the record); pods asking for a share, for whole GPUs with an RDMA NIC, with
several containers, and with nothing, all reach Running; every container's OCI spec (read
back from containerd) holds exactly the device nodes its record grants and exactly its
record's GPU UUIDs in the environment, and HAMi-core's limits, region tmpfs and library
mount as the hook plans them (runc takes them, the container runs); a VF's netdev moves
into the pod's network namespace and comes back when the pod goes; forged, garbage and
unsigned records end in CreateContainerError saying why; restarting the kubelet and
containerd loses no pod and no device. Needs root (mknod, runc, ip links).
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kube_edge.client import pod_path
from protos.kubelet.podresources.v1 import api_pb2 as prpb
from protos.kubelet.podresources.v1 import api_pb2_grpc as prpb_grpc
from tessera import resources as rn
from tessera.allocation import ContainerAllocation
from tessera_edge.host_paths import NRI_GATE_DESTINATION as GATE
from tests.e2e import binaries, grafana
from tests.e2e import node_chaos as C  # noqa: N812 - read as 'chaos.'
from tests.e2e import pods as P  # noqa: N812 - read as 'pods.' everywhere
from tests.e2e import prometheus as prom
from tests.e2e.controlplane import ROOT, ControlPlane, free_port, keyring, wait_for
from tests.e2e.node import (
    IMAGE,
    PEER_SUFFIX,
    PLUGIN_DIR,
    Node,
    device_root,
    enforces_required_plugins,
    links,
    node_host_or_skip,
)

pytestmark = pytest.mark.e2e
binaries.skip_module_unless(*binaries.CONTROL_PLANE, "kubelet", "runc")
BUSYBOX = node_host_or_skip("e2e node suite")

RUN_TIMEOUT = 180.0
"""Seconds from pod creation to Running: bind, device plugin Allocate, sandbox, NRI."""

GPU_CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
"""The control devices the private device root has (no nvidia-modeset there)."""
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
"""Where the NVIDIA container stack reads which GPUs a container sees."""
GPU_UUID = re.compile(r"GPU-[0-9a-fA-F-]+")
NO_CNI = (
    "needs the CNI plugins bridge, host-local and loopback for a pod network namespace"
    f" (${binaries.CNI_VAR}, or Debian's containernetworking-plugins in /usr/lib/cni)"
)


@pytest.fixture(scope="module", params=binaries.containerd_releases(), ids=lambda p: p.name)
def node(request: pytest.FixtureRequest, control_plane: ControlPlane) -> Iterator[Node]:
    release: Path = request.param
    cp = control_plane
    if PLUGIN_DIR.joinpath("kubelet.sock").exists():
        pytest.fail(f"another kubelet owns {PLUGIN_DIR} (one kubelet per host)")
    name = f"real-{release.name.replace('.', '-').lower()}"
    started = time.monotonic()
    n = Node.h100(cp, name, release, BUSYBOX, cni=binaries.cni_plugins())
    devices = device_root(n.work / "host", gpus=8, uverbs=36)
    # pods the control-plane tests left Pending would land on this fresh node
    for obj in cp.admin.list(pod_path(P.NS)).get("items") or []:
        P.delete_now(cp.admin, obj["metadata"]["name"])
    try:
        n.start_network()
        n.start_containerd()
        n.import_image()
        n.start_hook(devices)
        n.start_kubelet()
        n.start_agent()

        def advertised() -> bool:
            alloc = cp.admin.get(f"/api/v1/nodes/{name}")["status"].get("allocatable") or {}
            return int(alloc.get(rn.GPU, "0")) > 0 and int(alloc.get(rn.RDMA, "0")) > 0

        wait_for(advertised, 120, f"{name} advertising tessera resources", every=1)
        network = f"pod network from {n.cni}" if n.cni else "host network only"
        print(f"node {name} ({release.name}) up in {time.monotonic() - started:.1f}s, {network}")
        yield n
    finally:
        for obj in cp.admin.list(pod_path(P.NS)).get("items") or []:
            if obj["spec"].get("nodeName") == name:
                P.delete_now(cp.admin, obj["metadata"]["name"])
        n.stop()
        cp.remove_node(name)


def _running(cp: ControlPlane, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cp.check_alive()
        obj = cp.admin.get(pod_path(P.NS, name))
        return obj if obj.get("status", {}).get("phase") == "Running" else None

    return wait_for(check, RUN_TIMEOUT, f"pod {name} Running", every=1)


def _oci_spec(n: Node, container_id: str) -> dict[str, Any]:
    info = json.loads(n.ctr("containers", "info", container_id).stdout)
    return dict(info.get("Spec") or info.get("spec") or {})


def _oci_devices(spec: dict[str, Any]) -> set[str]:
    return {
        d["path"]
        for d in (spec.get("linux") or {}).get("devices") or []
        if d["path"].startswith(("/dev/nvidia", "/dev/infiniband"))
    }


def _oci_env(spec: dict[str, Any]) -> list[tuple[str, str]]:
    pairs = [e.partition("=") for e in (spec.get("process") or {}).get("env") or []]
    return [(k, v) for k, _, v in pairs]


def _check_env(env: list[tuple[str, str]], c: ContainerAllocation | None) -> None:
    """NVIDIA_VISIBLE_DEVICES once, holding the record's GPU UUIDs in record order (none
    without GPUs), and no other GPU's UUID anywhere in the environment."""
    uuids = [g.uuid for g in c.gpus] if c else []
    assert [v for k, v in env if k == VISIBLE] == ([",".join(uuids)] if uuids else [])
    assert {u for _, v in env for u in GPU_UUID.findall(v)} == set(uuids)


def _check_isolation(spec: dict[str, Any], c: ContainerAllocation | None, lib: str) -> None:
    """HAMi-core's environment and mounts as the hook plans them, taken by the real runtime:
    each GPU's limits numbered in host index order, the region's tmpfs, the library
    read-only; nothing of it for a container without GPUs."""
    env = dict(_oci_env(spec))
    mounts = {m["destination"]: m for m in spec.get("mounts") or []}
    hami = {k for k in env if k.startswith("CUDA_DEVICE_") or k == "LD_PRELOAD"}
    if c is None or not c.gpus:
        assert not hami and "/run/tessera-vgpu" not in mounts and lib not in mounts
        return
    ordered = sorted(c.gpus, key=lambda g: g.index)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["LD_PRELOAD"] == lib
    for i, g in enumerate(ordered):
        assert env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{g.memory_mib}m"
        assert env.get(f"CUDA_DEVICE_SM_LIMIT_{i}") == (str(g.core) if 0 < g.core < 100 else None)
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/run/tessera-vgpu/cudevshr.cache"
    region = mounts["/run/tessera-vgpu"]
    assert region["type"] == "tmpfs" and "size=8m" in region["options"], region
    assert mounts[lib]["source"] == lib and "ro" in mounts[lib]["options"], mounts[lib]


def _granted(c: ContainerAllocation | None) -> set[str]:
    if c is None:
        return set()
    paths: set[str] = set()
    if c.gpus:
        paths |= set(GPU_CONTROL) | {f"/dev/nvidia{g.minor}" for g in c.gpus}
    if c.rdma:
        paths.add("/dev/infiniband/rdma_cm")
        for r in c.rdma:
            minors = [v.uverbs_minor for v in r.vfs] if r.vfs else [r.uverbs_minor]
            paths |= {f"/dev/infiniband/uverbs{m}" for m in minors}
    return paths


def _pinned(n: Node, name: str, pod_network: bool = False, **kwargs: Any) -> dict[str, Any]:
    """A pod for node `n`; with `pod_network` (and a CNI network there) in its own network
    namespace instead of the host's."""
    obj = P.pod(name, **kwargs)
    obj["spec"]["nodeSelector"] = {"kubernetes.io/hostname": n.name}
    obj["spec"]["hostNetwork"] = not (pod_network and n.cni)
    for c in obj["spec"]["containers"] + obj["spec"].get("initContainers", []):
        c["image"] = IMAGE
        c["imagePullPolicy"] = "Never"
    return obj


_ALL_GPUS = {"name": VISIBLE, "value": "all"}

WORKLOADS: dict[str, dict[str, Any]] = {
    # asks for every GPU itself: the record's UUID must replace that
    "n-share": {"containers": [P.container("main", {rn.GPU: "25"}, env=[_ALL_GPUS])]},
    "n-whole-rdma": {
        "limits": {rn.GPU: "200", rn.RDMA: "100"},
        "annotations": {rn.RDMA_AFFINITY_ANNOTATION: "numa"},
    },
    "n-vf": {
        "limits": {rn.GPU_CORE: "30", rn.GPU_MEMORY: "10", rn.RDMA: "50"},
        "pod_network": True,
    },
    "n-multi": {
        "containers": [
            P.container("a", {rn.GPU: "50"}),
            P.container("b", {rn.GPU_CORE: "100"}),
            P.container("plain", {}),
        ]
    },
    "n-plain": {"limits": {}},
}


def _pod_resources(n: Node) -> dict[tuple[str, str], dict[str, dict[str, list[str]]]]:
    """The kubelet's pod-resources List: (namespace, pod) -> container -> resource -> IDs."""
    with grpc.insecure_channel(f"unix://{n.pod_resources_socket}") as channel:
        stub: Any = prpb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        answer = stub.List(prpb.ListPodResourcesRequest(), timeout=10)
    out: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
    for pod in answer.pod_resources:
        containers = out.setdefault((pod.namespace, pod.name), {})
        for c in pod.containers:
            # the kubelet answers one ContainerDevices per device ID: gather them per resource
            held = containers.setdefault(c.name, {})
            for d in c.devices:
                held.setdefault(d.resource_name, []).extend(d.device_ids)
    return out


def test_pod_resources_name_each_containers_record_gpus(node: Node) -> None:
    """First on the empty node: the records' GPUs (pinned with the gpu-uuid hint) are not
    the ones the fewest-devices default would pick (GPU 0, then GPU 1)."""
    cp = node.cp
    spec = cp.admin.get(f"/apis/tessera.dev/v1alpha1/nodedevices/{node.name}")["spec"]
    uuids = [g["uuid"] for g in sorted(spec["gpus"], key=lambda g: g["index"])]
    pods = {
        f"pr-frac-{node.name}": ({rn.GPU_CORE: "30", rn.GPU_MEMORY: "10"}, uuids[5:6]),
        f"pr-multi-{node.name}": ({rn.GPU: "200"}, uuids[6:8]),
    }
    for name, (limits, pinned) in pods.items():
        obj = _pinned(node, name, limits=limits)
        obj["metadata"].setdefault("annotations", {})[rn.GPU_UUID_ANNOTATION] = ",".join(pinned)
        cp.admin.create(pod_path(P.NS), obj)
    keys = keyring(cp.integrity_dir)
    try:
        for name, (limits, pinned) in pods.items():
            record = P.record(_running(cp, name), keys)
            (entry,) = record.containers
            assert [g.uuid for g in entry.gpus] == pinned, name
            listed = _pod_resources(node)[(P.NS, name)][entry.name]
            assert set(listed) == set(limits), (name, listed)
            for resource, ids in listed.items():
                assert resource in rn.GPU_RESOURCES
                # dcgm-exporter's reading: the ID up to its first '::' is the GPU's UUID
                assert {i.split("::")[0] for i in ids} == set(pinned), (name, resource, ids)
                assert len(ids) == int(limits[resource])
    finally:
        for name in pods:
            P.delete_now(cp.admin, name)


def test_pods_run_with_exactly_their_devices(node: Node) -> None:
    cp = node.cp
    for name, args in WORKLOADS.items():
        cp.admin.create(pod_path(P.NS), _pinned(node, f"{name}-{node.name}", **args))
    keys = keyring(cp.integrity_dir)
    for name in WORKLOADS:
        obj = _running(cp, f"{name}-{node.name}")
        annotations = obj["metadata"].get("annotations") or {}
        record = P.record(obj, keys) if rn.ALLOCATION_ANNOTATION in annotations else None
        by_name = {c.name: c for c in record.containers} if record else {}
        for status in obj["status"]["containerStatuses"]:
            spec = _oci_spec(node, status["containerID"].split("://", 1)[1])
            granted = by_name.get(status["name"])
            where = (name, status["name"])
            assert _oci_devices(spec) == _granted(granted), where
            _check_env(_oci_env(spec), granted)
            _check_isolation(spec, granted, str(node.hami_core_library))


def _vf_pod(node: Node, name: str = "") -> tuple[str, list[str], str]:
    """The VF pod's name (n-vf's unless named), its record's VF netdevs and its network
    namespace (from the OCI spec of its container: the sandbox's, or the host's '' when it
    uses host networking)."""
    cp = node.cp
    name = name or f"n-vf-{node.name}"
    obj = cp.admin.get(pod_path(P.NS, name))
    alloc = P.record(obj, keyring(cp.integrity_dir))
    netdevs = [vf.netdev for c in alloc.containers for r in c.rdma for vf in r.vfs]
    cid = obj["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    namespaces = (_oci_spec(node, cid).get("linux") or {}).get("namespaces") or []
    netns = next((ns.get("path", "") for ns in namespaces if ns["type"] == "network"), "")
    return name, netdevs, netns


def test_vf_netdev_moves_into_the_pod_network_namespace(node: Node) -> None:
    name, netdevs, netns = _vf_pod(node)
    assert netdevs, f"{name}'s record names no VF netdev"
    assert all(n in node.vf_netdevs for n in netdevs), netdevs
    if not node.cni:
        # a host-network pod has no namespace of its own: its VFs stay in the host's
        assert not netns
        assert set(netdevs) <= links()
        pytest.skip(NO_CNI)
    assert netns, f"{name} has no network namespace of its own"
    assert not set(netdevs) & links(), "the VF netdev is still in the host namespace"
    assert set(netdevs) <= links(netns), "the VF netdev is not in the pod's namespace"
    assert {n + PEER_SUFFIX for n in netdevs} <= links(), "the VF was deleted, not moved"


def _forge(cp: ControlPlane, node: Node, name: str, text: str) -> None:
    """A pod carrying a record the scheduler never wrote. The admission policy refuses
    it; with the policy's binding removed (a cluster without it) the node must refuse."""
    obj = _pinned(node, name, limits={})
    obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION] = text
    obj["spec"]["nodeName"] = node.name
    cp.admin.create(pod_path(P.NS), obj)


def test_forged_garbage_and_unsigned_records_fail_container_creation(node: Node) -> None:
    cp = node.cp
    real = cp.admin.get(pod_path(P.NS, f"n-share-{node.name}"))
    genuine = real["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION]
    doc = json.loads(genuine)
    unsigned = json.dumps({k: v for k, v in doc.items() if k not in ("integrity", "sig", "mac")})
    cases = {
        f"x-copied-{node.name}": genuine,  # another pod's record: wrong UID
        f"x-garbage-{node.name}": "{not json",
        f"x-unsigned-{node.name}": unsigned,
    }
    binding = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/"
    policy = "tessera-allocation-record-writer"
    saved = cp.admin.get(binding + policy)
    cp.admin.request("DELETE", binding + policy)
    try:
        time.sleep(2)
        for name, text in cases.items():
            _forge(cp, node, name, text)
    finally:
        saved["metadata"] = {"name": policy, "labels": saved["metadata"].get("labels", {})}
        cp.apply([saved])
    for name in cases:

        def refused(name: str = name) -> str | None:
            obj = cp.admin.get(pod_path(P.NS, name))
            for status in obj.get("status", {}).get("containerStatuses") or []:
                waiting = (status.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") == "CreateContainerError":
                    return str(waiting.get("message"))
            assert obj["status"].get("phase") != "Running", f"{name} runs with a forged record"
            return None

        message = wait_for(refused, RUN_TIMEOUT, f"{name} refused by the NRI hook", every=1)
        assert "tessera" in message.lower() or "record" in message.lower(), message
    # while such pods run the scheduler fences the node (their device use is unknown)
    for name in cases:
        P.delete_now(cp.admin, name)


def test_the_hook_reports_a_privileged_container(node: Node) -> None:
    """The device rules real containerd gives a privileged container open every device,
    GPUs included, whatever tessera decided: the hook says so for that container."""
    cp = node.cp
    name = f"x-privileged-{node.name}"
    obj = _pinned(node, name)
    obj["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    cp.admin.create(pod_path(P.NS), obj)
    try:
        _running(cp, name)
        log = node.procs["nri-hook"].log

        def warned() -> str | None:
            lines = log.read_text(errors="replace").splitlines()
            return next((x for x in lines if "own device rules" in x and name in x), None)

        line = wait_for(warned, 30, "the NRI hook's warning for the privileged container", every=1)
        assert "container=main" in line and "did not give it" in line, line
        plain = f"n-plain-{node.name}"
        assert not any(plain in x for x in log.read_text().splitlines() if "own device" in x)
    finally:
        P.delete_now(cp.admin, name)


def _containers_running(obj: dict[str, Any]) -> bool:
    """Whether every container of the pod runs (its phase reads Running as soon as a
    container that failed to start is due a restart, so the phase does not tell)."""
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (c.get("state") or {}) for c in statuses)


def _not_started_because(obj: dict[str, Any]) -> str:
    """Why the kubelet could not create or start the pod's containers, as it reports it
    (waiting CreateContainerError/RunContainerError, or a StartError termination)."""
    said: list[str] = []
    status = obj.get("status") or {}
    for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        for state in (c.get("state") or {}, c.get("lastState") or {}):
            for kind in ("waiting", "terminated"):
                part = state.get(kind) or {}
                if part.get("message"):
                    said.append(f"{c['name']}: {part.get('reason')}: {part['message']}")
    return "\n".join(said)


def _held_back(node: Node, name: str, says: str) -> str:
    """Wait until the kubelet reports why `name`'s container did not start, containing
    `says`; it must never run meanwhile. Returns what the kubelet said."""
    cp = node.cp

    def refused() -> str | None:
        obj = cp.admin.get(pod_path(P.NS, name))
        assert not _containers_running(obj), f"{name} runs without the hook"
        said = _not_started_because(obj)
        return said if says in said else None

    said = wait_for(refused, RUN_TIMEOUT, f"{name} held back for want of the hook", every=1)
    print(f"without the hook, {name}: {said}")
    time.sleep(5)
    assert not _containers_running(cp.admin.get(pod_path(P.NS, name)))
    return said


def _runs_with_its_record(node: Node, name: str) -> None:
    """Once the hook is back, the kubelet's retry (its back-off, 10 s doubling, decides
    when) runs `name`'s one container with exactly its record's devices and no gate."""
    cp = node.cp

    def started() -> dict[str, Any] | None:
        obj = cp.admin.get(pod_path(P.NS, name))
        return obj if _containers_running(obj) else None

    obj = wait_for(started, RUN_TIMEOUT, f"{name}'s container started", every=1)
    (entry,) = P.record(obj, keyring(cp.integrity_dir)).containers
    (status,) = obj["status"]["containerStatuses"]
    spec = _oci_spec(node, status["containerID"].split("://", 1)[1])
    assert _oci_devices(spec) == _granted(entry)
    _check_env(_oci_env(spec), entry)
    assert GATE not in {m["destination"] for m in spec.get("mounts") or []}


REQUIRED_BY_CONTAINER = f"{rn.NRI_REQUIRED_PLUGINS_ANNOTATION}/container.main"
"""The container-scope form of NRI's required-plugins key, which containerd prefers to
the pod-scope one the scheduler writes: a tenant can lift the requirement for their own
container with it."""


def test_without_the_hook_containers_given_devices_wait_for_it(node: Node) -> None:
    """Fail closed: with the NRI hook down, a container the kubelet gave tessera devices
    does not start (runc refuses the node agent's gate, naming it); a pod without tessera
    devices starts; once the hook is back the kubelet's retry runs the container with
    exactly its record's devices and without the gate. Where containerd enforces NRI's
    required plugins, the GPU pod lifts the scheduler's requirement for its container (as
    any tenant may), so that it reaches the gate: the gate still holds it."""
    cp = node.cp
    hook = node.procs["nri-hook"]
    hook.kill()
    gpu, plain = f"gate-gpu-{node.name}", f"gate-plain-{node.name}"
    obj = _pinned(node, gpu, limits={rn.GPU: "100"})
    if enforces_required_plugins(node.release):
        obj["metadata"]["annotations"][REQUIRED_BY_CONTAINER] = "[]"
    try:
        cp.admin.create(pod_path(P.NS), obj)
        cp.admin.create(pod_path(P.NS), _pinned(node, plain, limits={}))
        _running(cp, plain)
        _held_back(node, gpu, GATE)
    finally:
        hook.start()
    _runs_with_its_record(node, gpu)
    for name in (gpu, plain):
        P.delete_now(cp.admin, name)


def test_containerd_refuses_a_record_pods_containers_without_the_hook(node: Node) -> None:
    """containerd 2.2+: the scheduler binds a pod with a record requiring the hook
    (`required-plugins.noderesource.dev/pod`), and with the hook down containerd's default
    validator refuses to create its container at all (CreateContainerError naming the
    required plugin; runc never sees it, so no gate is needed); a pod without tessera
    devices runs; once the hook is back the container is created through it."""
    if not enforces_required_plugins(node.release):
        pytest.skip(
            f"containerd {node.release.name} has no NRI default validator (2.2 and later): "
            "there the node agent's gate alone holds such containers back"
        )
    cp = node.cp
    hook = node.procs["nri-hook"]
    hook.kill()
    gpu, plain = f"required-gpu-{node.name}", f"required-plain-{node.name}"
    try:
        cp.admin.create(pod_path(P.NS), _pinned(node, gpu, limits={rn.GPU: "100"}))
        cp.admin.create(pod_path(P.NS), _pinned(node, plain, limits={}))
        _running(cp, plain)
        plain_annotations = cp.admin.get(pod_path(P.NS, plain))["metadata"].get("annotations")
        assert rn.NRI_REQUIRED_PLUGINS_POD_ANNOTATION not in (plain_annotations or {})
        said = _held_back(node, gpu, 'required plugin "tessera" not present')
        assert "CreateContainerError" in said and GATE not in said, said
        obj = cp.admin.get(pod_path(P.NS, gpu))
        required = obj["metadata"]["annotations"][rn.NRI_REQUIRED_PLUGINS_POD_ANNOTATION]
        assert required == '["tessera"]', required
        (status,) = obj["status"]["containerStatuses"]
        assert not status.get("containerID") and not status.get("lastState"), status
    finally:
        hook.start()
    _runs_with_its_record(node, gpu)
    for name in (gpu, plain):
        P.delete_now(cp.admin, name)


def test_kubelet_and_containerd_restarts_lose_nothing(node: Node) -> None:
    cp = node.cp
    names = [f"{w}-{node.name}" for w in WORKLOADS]
    before = {n: cp.admin.get(pod_path(P.NS, n))["status"]["containerStatuses"] for n in names}
    for proc in ("kubelet", "containerd"):
        node.procs[proc].stop()
        node.procs[proc].start()
        time.sleep(10)
        for name in names:
            obj = _running(cp, name)
            restarts = {s["name"]: s["restartCount"] for s in obj["status"]["containerStatuses"]}
            assert restarts == {s["name"]: s["restartCount"] for s in before[name]}, (proc, name)
    cp.admin.create(
        pod_path(P.NS), _pinned(node, f"after-restarts-{node.name}", limits={rn.GPU: "100"})
    )
    obj = _running(cp, f"after-restarts-{node.name}")
    P.record(obj, keyring(cp.integrity_dir))


def test_vf_netdev_returns_to_the_host_when_the_pod_goes(node: Node) -> None:
    """After both restarts: the hook knows the moved VFs again from containerd's list."""
    name, netdevs, _ = _vf_pod(node)
    if not node.cni:
        pytest.skip(NO_CNI)
    P.delete_now(node.cp.admin, name)

    def back() -> bool:
        node.cp.check_alive()
        return set(netdevs) <= links()

    wait_for(back, RUN_TIMEOUT, f"{name}'s VF netdevs {netdevs} back in the host", every=1)


# --- a real Prometheus -----------------------------------------------------------------------

SCRAPE_INTERVAL = 2.0
EVALUATION_INTERVAL = 0.5
"""Prometheus's intervals in this suite: short, so that the cases take seconds. Rules are
evaluated four times a scrape, so an alert's state follows a scrape within half a second."""
SILENT_ALERT = "TesseraNodeAgentSilent"
SILENT_FOR = 20.0
"""The heartbeat alert's `for:` here. Its shipped 10 minutes is more than a case can
wait, so Prometheus loads the shipped rule file as it is and, beside it, a file holding
that one alert with only its `for:` shortened (written by prometheus.with_shorter_for;
prometheus.changed_fields checks that nothing else differs). The shipped rule, on the same
series, must be pending while its twin fires."""
DASHBOARD = ROOT / "deploy" / "grafana" / "tessera-dashboard.json"
GRAFANA_MAX_DATA_POINTS = 1000
"""Grafana's max data points for a panel is its width in pixels: about 1,000 here. With
the dashboard's 6 hours that makes `$__interval` 20s; the data source's scrape interval
setting is this Prometheus's, 2 s, so `$__rate_interval` is 22s."""
NO_GPU_PROCESS = (
    "a container's GPU use: the suite's containers are busybox on the fake backend, so the"
    " node agent's usage loop finds no GPU process to attribute"
)
NO_MPS = "the MPS daemon: the node runs hami-core, so no MPS supervisor is scraped"
NOT_FILLED = {
    ("Decisions by outcome", "B"): "bind failures: none here (the counter has no series"
    " until a bind fails)",
    ("GPU isolation gaps (NRI hook)", "A"): "hooks without an isolation layer: this hook runs"
    ' hami-core, so no series has layer="none"',
    ("GPU shares: used vs granted (node agents)", "A"): NO_GPU_PROCESS,
    ("GPU shares: used vs granted (node agents)", "B"): NO_GPU_PROCESS,
    ("GPU shares: used vs granted (node agents)", "C"): NO_GPU_PROCESS,
    ("Shares over their grant (node agents)", "B"): NO_GPU_PROCESS,
    ("Fenced and unusable nodes", "D"): "unusable nodes by reason: a node that takes pods"
    " has no series, and this one does",
    ("Node layers and plugins (node agents, NRI hooks, MPS)", "D"): NO_MPS,
    ("Node layers and plugins (node agents, NRI hooks, MPS)", "E"): NO_MPS,
}
"""The dashboard queries this node's traffic leaves without data, and why; every other
query must answer data (a finite value) once the case's pods have run."""
NOT_FILLED_WITHOUT_CNI = {
    ("RDMA VF moves (NRI hook)", "A"): "VF moves: without the CNI plugins the VF share runs"
    " in the host's network namespace, where its VF already is",
}


@pytest.fixture(scope="module")
def prometheus(node: Node) -> Iterator[prom.Prometheus]:
    """Debian's Prometheus scraping both tessera-scheduler replicas (health port), this
    node's agent and its NRI hook (metrics ports), with the shipped rule file and the
    heartbeat alert's twin; started once all four targets answer."""
    executable = prom.binary()
    if executable is None:
        pytest.skip(prom.missing("the node suite's Prometheus cases"))
    cp = node.cp
    work = node.work / "prometheus"
    work.mkdir(exist_ok=True)
    shipped = yaml.safe_load(prom.RULES.read_text())
    twin = prom.with_shorter_for(shipped, SILENT_ALERT, prom.duration(SILENT_FOR))
    group, _ = prom.find_alert(shipped, SILENT_ALERT)
    assert prom.changed_fields(shipped, twin) == [f"{group['name']}/{SILENT_ALERT}: for"]
    twin_file = work / "heartbeat-alert-short-for.yaml"
    twin_file.write_text(yaml.safe_dump(twin, sort_keys=False))
    jobs = {
        prom.SCHEDULER_JOB: [f"127.0.0.1:{port}" for port in cp.health_ports.values()],
        prom.AGENT_JOB: [f"127.0.0.1:{node.metrics_ports['agent']}"],
        prom.HOOK_JOB: [f"127.0.0.1:{node.metrics_ports['nri-hook']}"],
    }
    config = prom.scrape_config(
        jobs,
        scrape_interval=SCRAPE_INTERVAL,
        evaluation_interval=EVALUATION_INTERVAL,
        rule_files=(prom.RULES, twin_file),
    )
    targets = sum(len(t) for t in jobs.values())
    with prom.running(executable, work, config, free_port()) as running:

        def all_up() -> bool:
            up = running.targets_up()
            return len(up) == targets and all(up.values())

        wait_for(all_up, 60, f"Prometheus scraping its {targets} targets", every=1)
        yield running


def test_the_shipped_rules_evaluate_on_the_real_series(prometheus: prom.Prometheus) -> None:
    """Every alert of the shipped rule file is loaded and evaluates without an error on what
    the real programs export; none fires on this healthy node."""
    shipped = [
        r["alert"] for g in yaml.safe_load(prom.RULES.read_text())["groups"] for r in g["rules"]
    ]

    def evaluated() -> list[dict[str, Any]] | None:
        rules = [r for r in prometheus.alert_rules() if r["file"] == str(prom.RULES)]
        return rules if rules and all(r["health"] != "unknown" for r in rules) else None

    rules = wait_for(evaluated, 30, "every shipped rule evaluated once", every=1)
    assert sorted(r["name"] for r in rules) == sorted(shipped)
    failing = [f"{r['name']}: {r.get('lastError')}" for r in rules if r["health"] != "ok"]
    assert not failing, failing
    firing = [r["name"] for r in rules if r["state"] == "firing"]
    assert not firing, f"alerts firing on a healthy node: {firing}"
    pending = [r["name"] for r in rules if r["state"] == "pending"]
    print(f"{len(rules)} shipped alerting rules evaluated without error; pending: {pending}")


def _dashboard_queries() -> dict[tuple[str, str], str]:
    """(panel, refId) -> the panel query as Grafana sends it, for this suite's Prometheus."""
    dashboard = json.loads(DASHBOARD.read_text())
    view = grafana.View(
        range_s=grafana.default_range_s(dashboard),
        max_data_points=GRAFANA_MAX_DATA_POINTS,
        scrape_interval_s=SCRAPE_INTERVAL,
    )
    return {(q.panel, q.ref): grafana.substitute(q, view) for q in grafana.panel_queries(dashboard)}


def _node_allocation(node: Node) -> float:
    """The node's allocated compute in GPUs, from tessera-scheduler's published status."""
    status = node.cp.admin.get(f"/apis/tessera.dev/v1alpha1/nodedevices/{node.name}")["status"]
    used = sum(int(g["core"]["used"]) for g in status["allocation"]["gpus"])
    return used / rn.UNITS_PER_DEVICE


def _dashboard_gaps(
    node: Node,
    prometheus: prom.Prometheus,
    sent: dict[tuple[str, str], str],
    not_filled: dict[tuple[str, str], str],
) -> list[str]:
    """What the dashboard does not show yet: queries that must have data and have none,
    and the figures that must equal the cluster's (each GPU once, one leader)."""
    answers = {key: prometheus.query(expr) for key, expr in sent.items()}
    gaps = [
        f"{panel}/{ref}: no data ({sent[(panel, ref)]})"
        for (panel, ref), result in answers.items()
        if (panel, ref) not in not_filled and not prom.finite(result)
    ]
    for ref in ("A", "B"):
        values = prom.finite(answers[("Scheduler replicas", ref)])
        if values != [1.0]:
            gaps.append(f"Scheduler replicas/{ref}: {values}, not one")
    rows = [s for s in answers[("Allocation per GPU", "A")] if s["metric"].get("node") == node.name]
    gpus = [s["metric"]["gpu"] for s in rows]
    if sorted(gpus) != sorted(set(gpus)) or len(gpus) != 8:
        gaps.append(f"Allocation per GPU: {node.name}'s rows name GPUs {sorted(gpus)}")
    per_node = {
        s["metric"].get("node"): float(s["value"][1]) for s in answers[("Allocation per node", "A")]
    }
    expected = _node_allocation(node)
    if not math.isclose(per_node.get(node.name, -1.0), expected, abs_tol=1e-9):
        gaps.append(
            f"Allocation per node: {node.name} {per_node.get(node.name)}, status {expected}"
        )
    return gaps


def test_every_dashboard_query_answers_and_this_traffic_fills_its_panels(
    node: Node, prometheus: prom.Prometheus
) -> None:
    """Each query of every Grafana panel, as Grafana sends it, answers without an error.
    After a GPU share and (with a pod network) a VF share have run on the node and tessera
    has refused a pod (a GPU UUID hint naming no GPU of the node), every panel that traffic
    fills has data, all but NOT_FILLED's, and the figures count each GPU once with two
    replicas scraped."""
    cp = node.cp
    not_filled = NOT_FILLED | ({} if node.cni else NOT_FILLED_WITHOUT_CNI)
    share, refused, vf = (f"prom-{kind}-{node.name}" for kind in ("share", "refused", "vf"))
    cp.admin.create(pod_path(P.NS), _pinned(node, share, limits={rn.GPU: "25"}))
    obj = _pinned(node, refused, limits={rn.GPU: "100"})
    obj["metadata"]["annotations"][rn.GPU_UUID_ANNOTATION] = (
        "GPU-00000000-0000-0000-0000-000000000000"
    )
    cp.admin.create(pod_path(P.NS), obj)
    if node.cni:
        cp.admin.create(pod_path(P.NS), _pinned(node, vf, **WORKLOADS["n-vf"]))
    netdevs: list[str] = []
    try:
        sent = _dashboard_queries()
        assert set(not_filled) <= set(sent), set(not_filled) - set(sent)
        errors = []
        for (panel, ref), expr in sent.items():
            try:
                prometheus.query(expr)
            except prom.PrometheusError as exc:
                errors.append(f"{panel}/{ref}: {exc} ({expr})")
        assert not errors, "\n".join(errors)
        _running(cp, share)
        if node.cni:
            _running(cp, vf)
            netdevs = _vf_pod(node, vf)[1]
        wait_for(lambda: P.pending_reason(cp.admin, refused), RUN_TIMEOUT, f"{refused} refused")
        deadline = time.monotonic() + 60
        while gaps := _dashboard_gaps(node, prometheus, sent, not_filled):
            assert time.monotonic() < deadline, "\n".join(gaps)
            time.sleep(SCRAPE_INTERVAL / 2)
    finally:
        for name in (share, refused, vf) if node.cni else (share, refused):
            P.delete_now(cp.admin, name)
    with_data = {key for key, expr in sent.items() if prom.finite(prometheus.query(expr))}
    print(
        f"dashboard: {len(sent)} panel queries, all answered; {len(with_data)} with data; "
        f"{len(not_filled)} not filled by this traffic: {sorted(not_filled)}, of which with "
        f"data from earlier traffic: {sorted(with_data & set(not_filled))}"
    )
    # the VF goes home before the next case
    wait_for(lambda: set(netdevs) <= links(), RUN_TIMEOUT, f"{vf}'s VF {netdevs} back", every=1)


def _silent_nodes(cp: ControlPlane) -> float | None:
    """The nodes with a tessera_scheduler_node_unusable{reason="agent_silent"} series on the
    leading tessera-scheduler's own /metrics: the heartbeat alert's condition, read before
    Prometheus scrapes it (None while no replica leads)."""
    leader = cp.leader()
    if leader is None:
        return None
    url = f"http://127.0.0.1:{cp.health_ports[leader.name]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    silent = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "tessera_scheduler_node_unusable"
                and sample.labels.get("reason") == "agent_silent"
            ):
                silent += sample.value
    return silent


def _silent_rules(prometheus: prom.Prometheus) -> tuple[dict[str, Any], dict[str, Any]]:
    """The heartbeat alert's rule as shipped, and its twin with the shorter `for:`."""
    rules = [r for r in prometheus.alert_rules() if r["name"] == SILENT_ALERT]
    (shipped,) = [r for r in rules if r["file"] == str(prom.RULES)]
    (twin,) = [r for r in rules if r["file"] != str(prom.RULES)]
    return shipped, twin


def _instant(text: str) -> float:
    """A Prometheus RFC 3339 time (nanoseconds, `Z`) as a Unix time."""
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).timestamp()


def test_the_heartbeat_alert_fires_for_a_dead_node_agent_and_resolves_when_it_is_back(
    node: Node, prometheus: prom.Prometheus
) -> None:
    """SIGKILL the node agent: once tessera-scheduler reports the node silent (its Lease
    past duration and grace), the heartbeat alert is pending and fires within its `for:`
    plus two scrape intervals, not before its `for:`, once (the ready replica's), while
    the shipped rule on the same series is pending; once the agent is back and the
    scheduler says so, the alert resolves within two scrape intervals."""
    cp = node.cp
    agent = node.procs["agent"]

    def quiet() -> bool:
        shipped, twin = _silent_rules(prometheus)
        return _silent_nodes(cp) == 0 and not shipped["alerts"] and not twin["alerts"]

    wait_for(quiet, 60, f"no silent node and {SILENT_ALERT} inactive before the kill", every=1)
    leader = cp.leader()
    assert leader is not None
    instance = f"127.0.0.1:{cp.health_ports[leader.name]}"
    seen: dict[str, float] = {}
    killed = time.time()
    agent.kill()
    try:
        deadline = killed + 8 + 2 + SILENT_FOR + 60  # Lease, grace, for:, a margin
        while "firing" not in seen:
            assert time.time() < deadline, f"{SILENT_ALERT} not firing: {seen}"
            now = time.time()
            if "silent" not in seen and (_silent_nodes(cp) or 0) > 0:
                seen["silent"] = now
            shipped, twin = _silent_rules(prometheus)
            for alert in twin["alerts"]:
                seen.setdefault(alert["state"], now)
            time.sleep(0.2)
    finally:
        back = time.time()
        agent.start()
    assert "silent" in seen and "pending" in seen, seen
    assert [a["state"] for a in shipped["alerts"]] == ["pending"], shipped["alerts"]
    (alert,) = twin["alerts"]
    assert alert["labels"]["instance"] == instance and alert["labels"]["severity"] == "warning"
    assert alert["labels"]["node"] == node.name, alert["labels"]
    assert alert["annotations"]["summary"].startswith(f"Node {node.name} "), alert["annotations"]
    listed = [
        a
        for a in prometheus.alerts()
        if a["labels"]["alertname"] == SILENT_ALERT and a["state"] == "firing"
    ]
    assert len(listed) == 1, listed
    bound = SILENT_FOR + 2 * SCRAPE_INTERVAL
    assert seen["firing"] - seen["silent"] <= bound, (seen, bound)
    assert seen["firing"] - _instant(alert["activeAt"]) >= SILENT_FOR, (seen, alert)

    def resolved() -> bool:
        """The twin and the shipped rule (two groups, each evaluated on its own tick) both
        without an alert."""
        if "clear" not in seen and _silent_nodes(cp) == 0:
            seen["clear"] = time.time()
        if "clear" in seen and not any(r["alerts"] for r in _silent_rules(prometheus)):
            seen["resolved"] = time.time()
        return "resolved" in seen

    wait_for(resolved, 60, f"{SILENT_ALERT} resolved once the agent is back", every=0.2)
    assert seen["resolved"] - seen["clear"] <= 2 * SCRAPE_INTERVAL, seen
    print(
        f"heartbeat alert, from the agent's SIGKILL: the scheduler saw the node silent at "
        f"+{seen['silent'] - killed:.1f}s, pending +{seen['pending'] - killed:.1f}s, firing "
        f"+{seen['firing'] - killed:.1f}s ({seen['firing'] - seen['silent']:.1f}s after silent;"
        f" for: {SILENT_FOR:g}s + 2 scrapes = {bound:g}s); agent back at "
        f"+{back - killed:.1f}s, the scheduler saw it at +{seen['clear'] - killed:.1f}s, "
        f"resolved +{seen['resolved'] - killed:.1f}s ({seen['resolved'] - seen['clear']:.1f}s"
        f" after)"
    )

    def advertised() -> bool:
        alloc = cp.admin.get(f"/api/v1/nodes/{node.name}")["status"].get("allocatable") or {}
        return int(alloc.get(rn.GPU, "0")) > 0

    wait_for(advertised, 120, f"{node.name} advertising its GPUs again", every=1)


# --- node chaos ------------------------------------------------------------------------------


def _check_chaos_env(env: list[tuple[str, str]], c: ContainerAllocation | None) -> None:
    """The record's GPUs in NVIDIA_VISIBLE_DEVICES and HAMi-core's per-GPU limits, exactly."""
    _check_env(env, c)
    values = dict(env)
    limits = {k: v for k, v in values.items() if k.startswith("CUDA_DEVICE_")}
    if c is None or not c.gpus:
        assert not limits and "LD_PRELOAD" not in values
        return
    for i, g in enumerate(sorted(c.gpus, key=lambda g: g.index)):
        assert values[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{g.memory_mib}m"
    assert f"CUDA_DEVICE_MEMORY_LIMIT_{len(c.gpus)}" not in values


def _chaos_state(n: Node) -> dict[str, dict[str, Any]]:
    objs = n.cp.admin.list(pod_path(P.NS), labelSelector=C.LABEL).get("items") or []
    return {o["metadata"]["name"]: o for o in objs}


def _settled(obj: dict[str, Any]) -> str | None:
    """'running', 'failed: <why>' or 'pending: <why>' once the pod's state needs nothing
    more from the node; None while it is on its way."""
    status = obj.get("status") or {}
    if not obj["spec"].get("nodeName"):
        why = P.unschedulable_message(obj)
        return f"pending: {why}" if why else None
    if status.get("phase") == "Running" and all(
        c.get("ready") for c in status.get("containerStatuses") or []
    ):
        return "running"
    if status.get("phase") == "Failed":
        return (
            f"failed: {status.get('reason')}: {status.get('message')} {_not_started_because(obj)}"
        )
    return None


def _usage_matches_live_records(n: Node, records: dict[str, Any]) -> str | None:
    """The scheduler's published per-GPU compute use on the node against the sum of the
    records of its pods that still hold devices; '' when equal, else what differs."""
    live = [r for r in records.values() if r is not None]
    core, _, conflicts = P.ledger(live)
    assert conflicts == [], conflicts
    path = f"/apis/tessera.dev/v1alpha1/nodedevices/{n.name}"
    status = n.cp.admin.get(path).get("status") or {}
    diff = [
        f"{g['uuid']}: scheduler {g['core']['used']}, records {core.get((n.name, g['uuid']), 0)}"
        for g in (status.get("allocation") or {}).get("gpus") or []
        if g["core"]["used"] != core.get((n.name, g["uuid"]), 0)
    ]
    return "; ".join(diff)


def test_node_chaos_never_starts_a_container_with_wrong_devices(node: Node) -> None:
    """Pods of every kind created and deleted continuously while the NRI hook, the node
    agent, containerd and the kubelet are SIGKILLed at random moments and restarted. Every
    container that ran reported what it saw: exactly its record's devices, environment and
    VF netdevs. Afterwards every pod runs or failed saying why, the kubelet's pod-resources
    and the scheduler's usage agree with the records, and every VF is back in the host."""
    cp = node.cp
    rng = random.Random(C.SEED)
    plan = C.KillPlan(rng)
    keys = keyring(cp.integrity_dir)
    seen = node.work / "seen"
    seen.mkdir(exist_ok=True)
    refund = C.VfRefund(node.vf_netdevs)
    for obj in cp.admin.list(pod_path(P.NS)).get("items") or []:
        if obj["spec"].get("nodeName") == node.name or not obj["spec"].get("nodeName"):
            P.delete_now(cp.admin, obj["metadata"]["name"])
    records: dict[str, Any] = {}  # pod UID -> record (None: none) of every pod ever seen
    pod_network: dict[str, bool] = {}
    deadline: dict[str, float] = {}
    restarts: list[tuple[float, str]] = []
    kinds = list(C.KINDS)
    created = 0
    started = time.monotonic()
    last_create = 0.0
    next_kill = started + plan.gap()

    crashed: dict[str, int] = dict.fromkeys(C.PROGRAMS, 0)

    def supervise() -> None:
        """Restart a program that exited on its own, as systemd or the DaemonSet would (the
        kubelet exits when it starts while containerd is down)."""
        pending = {name for _, name in restarts}
        for name in C.PROGRAMS:
            if name not in pending and not node.procs[name].running():
                crashed[name] += 1
                node.procs[name].start()

    def remember(obj: dict[str, Any]) -> None:
        uid = obj["metadata"]["uid"]
        pod_network[uid] = not obj["spec"].get("hostNetwork")
        if uid in records and records[uid] is not None:
            return
        has = rn.ALLOCATION_ANNOTATION in (obj["metadata"].get("annotations") or {})
        records[uid] = P.record(obj, keys) if has else None

    while created < C.PODS or not plan.done:
        now = time.monotonic()
        assert now - started < 1800, f"storm too long: {created} pods, kills {plan.kills}"
        if now >= next_kill and not plan.done:
            victim = plan.next_victim()
            proc = node.procs[victim]
            if proc.running():
                proc.kill()
                plan.kills[victim] += 1
                restarts.append((now + rng.uniform(0, 3), victim))
            next_kill = now + plan.gap()
        for when, name in [r for r in restarts if r[0] <= now]:
            restarts.remove((when, name))
            node.procs[name].start()
        supervise()
        refund.check()
        state = _chaos_state(node)
        for name, listed_obj in state.items():
            obj = listed_obj
            if now >= deadline.get(name, float("inf")) and not obj["spec"].get("nodeName"):
                obj = cp.admin.get(pod_path(P.NS, name))  # bound since the list?
            if obj["spec"].get("nodeName"):
                remember(obj)
            if now >= deadline.get(name, float("inf")):
                # as kubectl delete does: the pod goes once the kubelet has stopped it, so
                # the kubelet's units are free before the scheduler hands its devices out
                cp.admin.request("DELETE", pod_path(P.NS, name))
                del deadline[name]
        live = sum(1 for name in state if name in deadline)
        # one pod a second at most: the agent cannot tell apart pods created in the same
        # second with the same demands (docs/deviceplugin.md), whose units then follow no
        # record; what runs is the same either way. Pods are created until the kills are
        # done too, so that the storm ends with pods on the node for the checks after it.
        if live < C.LIVE and now - last_create >= 1.05:
            last_create = now
            kind = kinds[created % len(kinds)]
            args = copy.deepcopy(C.KINDS[kind])
            name = f"chaos-{kind}-{created:04d}-{node.name}"
            obj = C.chaos_pod(_pinned(node, name, **args), seen)
            cp.admin.create(pod_path(P.NS), obj)
            deadline[name] = time.monotonic() + rng.uniform(*C.LIFETIME)
            created += 1
        time.sleep(rng.uniform(0.3, 1.0))
    for _, name in restarts:
        node.procs[name].start()
    restarts.clear()
    storm = time.monotonic() - started
    print(
        f"node chaos storm on {node.name}: {created} pods, kills {plan.kills}, {storm:.0f}s; "
        f"exited on their own and restarted: {crashed}"
    )
    # the storm is over: the pods left settle
    final: dict[str, str] = {}

    calm = [0]

    def all_settled() -> bool:
        """Every pod settled, three looks in a row (a pod Pending for a moment, while the
        kubelet re-registers the agent's resources, is not yet settled)."""
        calm[0] = calm[0] + 1 if looks_settled() else 0
        return calm[0] >= 3

    gpu_count = len(
        cp.admin.get(f"/apis/tessera.dev/v1alpha1/nodedevices/{node.name}")["spec"]["gpus"]
    )

    def looks_settled() -> bool:
        supervise()
        refund.check()
        cp.check_alive()
        # the kubelet advertises every GPU again (after its restart, the agent's resources
        # read 0 until the agent registers again, and pods bound for then wait Pending)
        allocatable = cp.admin.get(f"/api/v1/nodes/{node.name}")["status"].get("allocatable")
        if int((allocatable or {}).get(rn.GPU, "0")) != gpu_count * rn.UNITS_PER_DEVICE:
            return False
        state = _chaos_state(node)
        for obj in state.values():
            if obj["spec"].get("nodeName"):
                remember(obj)
        final.clear()
        for name, obj in state.items():
            if obj["metadata"].get("deletionTimestamp"):
                return False  # the kubelet has yet to stop it
            outcome = _settled(obj)
            if outcome is None:
                return False
            final[name] = outcome
        return True

    wait_for(all_settled, C.SETTLE, "the pods left after the storm to run or fail", every=3)
    failed = {n: o for n, o in final.items() if o.startswith("failed")}
    for name, outcome in failed.items():
        assert outcome.split(":", 2)[2].strip(), f"{name} failed without a reason: {outcome}"

    # the kubelet's pod-resources against every running pod's record
    def pod_resources() -> tuple[dict[tuple[str, str], dict[str, dict[str, list[str]]]]] | None:
        supervise()  # the kubelet may have exited on its own again
        try:
            return (_pod_resources(node),)
        except grpc.RpcError:
            return None  # the kubelet is (re)starting

    (listed,) = wait_for(pod_resources, 120, "the kubelet's pod-resources List", every=2)
    state = _chaos_state(node)
    miscounted: list[str] = []
    elsewhere: list[str] = []
    for name, outcome in final.items():
        if outcome != "running":
            continue
        alloc = records[state[name]["metadata"]["uid"]]
        by_name = {c.name: c for c in alloc.containers} if alloc else {}
        for spec in state[name]["spec"]["containers"]:
            limits = (spec.get("resources") or {}).get("limits") or {}
            held = listed.get((P.NS, name), {}).get(spec["name"], {})
            asked = {r: int(v) for r, v in limits.items() if r.startswith(rn.DOMAIN)}
            if {r: len(ids) for r, ids in held.items()} != asked:
                miscounted.append(f"{name}/{spec['name']}: pod-resources {held}, asked {asked}")
            entry = by_name.get(spec["name"])
            gpus = {i.split("::")[0] for r in rn.GPU_RESOURCES for i in held.get(r, [])}
            if entry is not None and entry.gpus and gpus != {g.uuid for g in entry.gpus}:
                elsewhere.append(f"{name}/{spec['name']}: units on {sorted(gpus)}, record {entry}")
    # the kubelet counts exactly what each container asked for; its units name the record's
    # GPUs where the agent could follow the record (docs/deviceplugin.md), counted here
    assert not miscounted, "\n".join(miscounted)
    # the scheduler's usage equals the sum of the live records
    holding = {
        o["metadata"]["uid"]: records.get(o["metadata"]["uid"])
        for o in state.values()
        if o["spec"].get("nodeName") and (o.get("status") or {}).get("phase") not in ("Failed",)
    }
    wait_for(
        lambda: _usage_matches_live_records(node, holding) == "",
        120,
        "the scheduler's usage to equal the live records",
        every=2,
    )
    # every container that ever ran
    reports, partial = C.read_reports(seen)
    judge = C.Judge(_granted, _check_chaos_env, records, pod_network)
    for report in reports:
        judge.judge(report)
    ran_pods = len({r.pod_uid for r in reports})
    kubelet_log = node.procs["kubelet"].log.read_text(errors="replace")
    gated = sum(
        1 for line in kubelet_log.splitlines() if "RunContainerError" in line and GATE in line
    )
    required = sum(
        1
        for line in kubelet_log.splitlines()
        if "CreateContainerError" in line and "required plugin" in line
    )
    hook_log = node.procs["nri-hook"].log.read_text(errors="replace")
    refused = sum(1 for line in hook_log.splitlines() if "refusing create" in line)
    print(
        f"node chaos on {node.name}: {len(reports)} container starts reported by {ran_pods} "
        f"pods ({partial} reports cut short), final states: "
        f"{sum(o == 'running' for o in final.values())} running, {len(failed)} failed, "
        f"{sum(o.startswith('pending') for o in final.values())} pending; "
        f"{refund.refunds} VF pairs given back as the kernel gives back a VF; "
        f"{gated} container starts refused by runc for the gate, {required} creations "
        f"refused by containerd for want of the hook, {refused} creations "
        f"refused by the hook; pod-resources of {len(elsewhere)} running containers name "
        "other GPUs than their record's"
    )
    for line in elsewhere:
        print(f"  {line[:300]}")
    for name, outcome in failed.items():
        print(f"  {name}: {outcome[:300]}")
    assert not judge.problems, "\n".join(judge.problems[:50])
    assert any(o == "running" for o in final.values()), "no pod left to check after the storm"
    assert ran_pods >= C.PODS // 4, f"only {ran_pods} pods ran: the storm proves little"
    # all gone: every VF netdev back in the host namespace, none left in a pod's
    for name in _chaos_state(node):
        cp.admin.request("DELETE", pod_path(P.NS, name))

    def vfs_home() -> bool:
        refund.check()
        return not _chaos_state(node) and set(node.vf_netdevs) <= links()

    wait_for(vfs_home, C.SETTLE, "every VF netdev back in the host namespace", every=2)
