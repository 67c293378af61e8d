"""tessera on a real node: kubelet, containerd (each release given, in turn) with its own
shim and runc, tessera's node agent as the kubelet's device plugin and the NRI hook, joined
to the control plane of test_control_plane.py.

Checked per release: pods asking for a share, for whole GPUs with an RDMA NIC, with
several containers, and with nothing, all reach Running; every container's OCI spec (read
back from containerd) holds exactly the device nodes its record grants; forged, garbage
and unsigned records end in CreateContainerError saying why; restarting the kubelet and
containerd loses no pod and no device. Needs root (mknod, runc).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_edge.client import pod_path
from tessera import resources as rn
from tessera.allocation import ContainerAllocation
from tests.e2e import binaries
from tests.e2e import pods as P  # noqa: N812 - read as 'pods.' everywhere
from tests.e2e.controlplane import ControlPlane, keyring, topology_for, wait_for
from tests.e2e.node import IMAGE, PLUGIN_DIR, Node, device_root

pytestmark = pytest.mark.e2e
binaries.skip_module_unless(*binaries.CONTROL_PLANE, "kubelet", "runc")
if not binaries.containerd_releases():
    pytest.skip(
        f"e2e node suite needs containerd releases (${binaries.CONTAINERD_VAR}, or"
        f" containerd-* folders under ${binaries.FOLDER_VAR})",
        allow_module_level=True,
    )
BUSYBOX = Path(os.environ.get("TESSERA_E2E_BUSYBOX") or shutil.which("busybox") or "")
if os.geteuid() != 0 or not BUSYBOX.is_file():
    pytest.skip(
        "e2e node suite needs root and a static busybox ($TESSERA_E2E_BUSYBOX)",
        allow_module_level=True,
    )

RUN_TIMEOUT = 180.0
"""Seconds from pod creation to Running: bind, device plugin Allocate, sandbox, NRI."""

GPU_CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
"""The control devices the private device root has (no nvidia-modeset there)."""


@pytest.fixture(scope="module", params=binaries.containerd_releases(), ids=lambda p: p.name)
def node(request: pytest.FixtureRequest, control_plane: ControlPlane) -> Iterator[Node]:
    release: Path = request.param
    cp = control_plane
    if PLUGIN_DIR.joinpath("kubelet.sock").exists():
        pytest.fail(f"another kubelet owns {PLUGIN_DIR} (one kubelet per host)")
    name = f"real-{release.name.replace('.', '-').lower()}"
    bins = binaries.require("kubelet", "runc")
    started = time.monotonic()
    n = Node(
        cp,
        name,
        release,
        bins["kubelet"],
        bins["runc"],
        BUSYBOX,
        topology_for(name, "h100-sxm-8x", cp.work),
    )
    devices = device_root(n.work / "host", gpus=8, uverbs=36)
    # pods the control-plane tests left Pending would land on this fresh node
    for obj in cp.admin.list(pod_path(P.NS)).get("items") or []:
        P.delete_now(cp.admin, obj["metadata"]["name"])
    try:
        n.start_containerd()
        n.import_image()
        n.start_hook(devices)
        n.start_kubelet()
        n.start_agent()

        def advertised() -> bool:
            alloc = cp.admin.get(f"/api/v1/nodes/{name}")["status"].get("allocatable") or {}
            return int(alloc.get(rn.GPU, "0")) > 0 and int(alloc.get(rn.RDMA, "0")) > 0

        wait_for(advertised, 120, f"{name} advertising tessera resources", every=1)
        print(f"node {name} ({release.name}) up in {time.monotonic() - started:.1f}s")
        yield n
    finally:
        for obj in cp.admin.list(pod_path(P.NS)).get("items") or []:
            if obj["spec"].get("nodeName") == name:
                P.delete_now(cp.admin, obj["metadata"]["name"])
        n.stop()


def _running(cp: ControlPlane, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cp.check_alive()
        obj = cp.admin.get(pod_path(P.NS, name))
        return obj if obj.get("status", {}).get("phase") == "Running" else None

    return wait_for(check, RUN_TIMEOUT, f"pod {name} Running", every=1)


def _oci_devices(n: Node, container_id: str) -> set[str]:
    info = json.loads(n.ctr("containers", "info", container_id).stdout)
    spec = info.get("Spec") or info.get("spec") or {}
    return {
        d["path"]
        for d in (spec.get("linux") or {}).get("devices") or []
        if d["path"].startswith(("/dev/nvidia", "/dev/infiniband"))
    }


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


def _pinned(n: Node, name: str, **kwargs: Any) -> dict[str, Any]:
    obj = P.pod(name, **kwargs)
    obj["spec"]["nodeSelector"] = {"kubernetes.io/hostname": n.name}
    for c in obj["spec"]["containers"] + obj["spec"].get("initContainers", []):
        c["image"] = IMAGE
        c["imagePullPolicy"] = "Never"
    return obj


WORKLOADS: dict[str, dict[str, Any]] = {
    "n-share": {"limits": {rn.GPU: "25"}},
    "n-whole-rdma": {
        "limits": {rn.GPU: "200", rn.RDMA: "100"},
        "annotations": {rn.RDMA_AFFINITY_ANNOTATION: "numa"},
    },
    "n-vf": {"limits": {rn.GPU_CORE: "30", rn.GPU_MEMORY: "10", rn.RDMA: "50"}},
    "n-multi": {
        "containers": [
            P.container("a", {rn.GPU: "50"}),
            P.container("b", {rn.GPU_CORE: "100"}),
            P.container("plain", {}),
        ]
    },
    "n-plain": {"limits": {}},
}


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
            cid = status["containerID"].split("://", 1)[1]
            assert _oci_devices(node, cid) == _granted(by_name.get(status["name"])), (
                name,
                status["name"],
            )


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
