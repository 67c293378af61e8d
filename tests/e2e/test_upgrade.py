"""Rolling upgrade and rollback, previous release to this checkout and back, with pods
running on a real kubelet and containerd (the newest release given).

Each case installs the previous release in second-scheduler mode (Helm, or kubectl apply
-k of its overlay), runs its programs as its installed objects say (tests/e2e/upgrade.py),
starts pods of several kinds, then follows docs/operations.md, "Upgrading and rolling
back": the new release's objects, then its programs one workload at a time (the
tessera-scheduler Deployment, the node agent and NRI hook DaemonSets) in the case's order,
then the rollback (the previous objects, then the programs in the reverse order). Helm goes
scheduler first and rolls back nodes first; kustomize the other way (ORDERS).

Checked after every step, on every pod that ran: its containers are the same ones (IDs,
restart counts), still running, and hold in /proc/<pid>/root/dev exactly the device nodes
their record grants; every record reads with both releases' readers; no GPU or NIC is
handed out past its capacity; a pod created in every phase places and runs with its
record's devices, and one created while no scheduler runs waits unbound until the new
one places it. Needs root (mknod, runc).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_edge.client import pod_path
from tessera import resources as rn
from tessera.allocation import ContainerAllocation, PodAllocation
from tessera_edge.host_paths import NRI_GATE_DESTINATION
from tests.deploy import install_modes as im
from tests.e2e import binaries
from tests.e2e import pods as P  # noqa: N812 - read as 'pods.' everywhere
from tests.e2e import upgrade as U  # noqa: N812
from tests.e2e.controlplane import (
    ADMIN_TOKEN,
    ControlPlane,
    free_port,
    keyring,
    make_integrity_key,
    wait_for,
)
from tests.e2e.node import IMAGE, Node, device_root, node_host_or_skip

pytestmark = pytest.mark.e2e
binaries.skip_module_unless(*binaries.CONTROL_PLANE, "kubelet", "runc")
BUSYBOX = node_host_or_skip("the upgrade suite")

MODE = "second-scheduler"
NODE = "upgrade-node"
RUN_TIMEOUT = 180.0
"""Seconds from a pod's creation to Running (a new scheduler's election and sync included)."""
HELM_TIMEOUT = 180
GPU_CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")

WORKLOADS: dict[str, dict[str, Any]] = {
    "share": {"limits": {rn.GPU: "25"}},
    "whole-rdma": {"limits": {rn.GPU: "200", rn.RDMA: "100"}},
    "multi": {
        "containers": [
            P.container("a", {rn.GPU: "50"}),
            P.container("b", {rn.GPU_CORE: "100"}),
            P.container("plain", {}),
        ]
    },
}


@dataclass
class Cluster:
    cp: ControlPlane
    node: Node
    devices: Path
    previous: U.Release
    new: U.Release
    kubeconfig: Path
    pods: list[str] = field(default_factory=list)
    on: dict[str, U.Release] = field(default_factory=dict)
    """Which release each workload (scheduler, hook, agent) runs now."""
    held: list[str] = field(default_factory=list)
    """Pods created while the gate held them on an upgrade: they must run once the hook is
    upgraded too."""

    def gated(self) -> bool:
        """This release's agent with the previous release's hook: the agent's fail-closed
        gate is in every device container and the hook there does not remove it."""
        return self.on.get("agent") is self.new and self.on.get("hook") is self.previous


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """etcd, kube-apiserver and one real node (containerd, kubelet); no tessera program:
    each case installs and runs its own."""
    bins = binaries.require(*binaries.CONTROL_PLANE, "kubelet", "runc")
    im.kubectl_or_skip()
    work = Path(
        tempfile.mkdtemp(prefix="tessera-e2e-upgrade-", dir=os.environ.get("TESSERA_E2E_WORKDIR"))
    )
    cp = ControlPlane(work, bins)
    node: Node | None = None
    try:
        cp.start_api()
        cp.apply([{"kind": "ServiceAccount", "metadata": {"name": "default"}}])
        ca = {"ca.crt": cp.cluster_ca.path.read_text()}  # what the controller manager publishes
        cp.apply([{"kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"}, "data": ca}])
        cp.integrity_dir.mkdir()
        make_integrity_key(cp.integrity_dir)
        previous = U.previous_release(work)
        node = Node.h100(cp, NODE, binaries.containerd_releases()[-1], BUSYBOX)
        devices = device_root(node.work / "host", gpus=8, uverbs=36)
        node.install_layer(devices)  # a stand-in for HAMi-core's library, as node.py has it
        node.start_containerd()
        node.import_image()
        node.start_kubelet()
        yield Cluster(
            cp,
            node,
            devices,
            previous,
            U.this_release(),
            cp.kubeconfig("operator", token=ADMIN_TOKEN),
        )
    finally:
        if node is not None:
            node.stop()
        print(f"upgrade e2e exit codes: {cp.stop()}")
        if not os.environ.get("TESSERA_E2E_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


# --- installing a release's objects ------------------------------------------------------


def _helm(c: Cluster) -> tuple[Any, Any]:
    helm = im.helm_or_skip()
    return helm, helm.Configuration(namespace=U.NAMESPACE, kubeconfig=str(c.kubeconfig))


def _kubectl(c: Cluster, *args: str) -> str:
    done = subprocess.run(
        ["kubectl", *args],
        env=dict(os.environ, KUBECONFIG=str(c.kubeconfig)),
        capture_output=True,
        text=True,
        check=False,
        timeout=im.KUSTOMIZE_TIMEOUT,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def apply_release(c: Cluster, method: str, release: U.Release, step: str) -> None:
    """The objects of `release` as docs/operations.md applies them at `step` (install,
    upgrade or rollback)."""
    if method == "kustomize":
        _kubectl(c, "apply", "--server-side", "--force-conflicts", "-k", str(release.overlay(MODE)))
        return
    helm, config = _helm(c)
    if step == "install":
        run = helm.Install(config).run(
            "tessera", str(release.chart), create_namespace=True, wait=False, timeout=HELM_TIMEOUT
        )
    else:
        # a rollback as docs/operations.md gives it: the previous release's chart upgraded
        # to (helm-sdkpy's Rollback sets no wait strategy, which Helm's SDK refuses)
        run = helm.Upgrade(config).run(
            "tessera", str(release.chart), wait=False, timeout=HELM_TIMEOUT
        )
    asyncio.run(run)


def remove_release(c: Cluster, method: str) -> None:
    if method == "helm":
        helm, config = _helm(c)
        asyncio.run(helm.Uninstall(config).run("tessera", wait=False, timeout=HELM_TIMEOUT))


# --- running a release's programs, as its installed objects say ----------------------------


def _module(release: U.Release, command: list[str]) -> str:
    """The module behind a console script of `release` (its pyproject's entry points)."""
    scripts = tomllib.loads((release.tree / "pyproject.toml").read_text())["project"]["scripts"]
    return str(scripts[command[0]]).split(":")[0]


def run_scheduler(c: Cluster, release: U.Release) -> None:
    """The tessera-scheduler Deployment's pod: tessera-scheduler and kube-scheduler with the
    installed arguments and configuration, under the pod's service account."""
    cp = c.cp
    stop_scheduler(c)
    kubeconfig = cp.kubeconfig("tessera-scheduler-pod", token=cp.token("tessera-scheduler"))
    tessera = U.container(cp, "Deployment", "tessera-scheduler", "tessera-scheduler")
    listen = U.loopback()
    args = U.with_flags(
        tessera["args"],
        {
            "--listen": listen,
            "--health-listen": U.loopback(),
            "--integrity-key-file": str(cp.integrity_dir / "private"),
            "--kubeconfig": str(kubeconfig),
        },
    )
    pod_name = f"tessera-scheduler-{len(cp.procs)}"  # a new pod, a new election identity
    U.spawn(
        cp,
        "pod-tessera-scheduler",
        release.command(_module(release, tessera["command"]), args),
        release.env(POD_NAME=pod_name),
    )
    ks = U.container(cp, "Deployment", "tessera-scheduler", "kube-scheduler")
    cm = cp.admin.get(f"/api/v1/namespaces/{U.NAMESPACE}/configmaps/tessera-kube-scheduler-config")
    (text,) = cm["data"].values()
    config = yaml.safe_load(text)
    config["clientConnection"]["kubeconfig"] = str(kubeconfig)
    (extender,) = config["extenders"]
    extender["urlPrefix"] = f"http://{listen}"
    path = cp.work / "pod-kube-scheduler-config.yaml"
    path.write_text(yaml.safe_dump(config))
    kept = [
        a
        for a in ks["command"][1:]
        if not a.startswith(("--config=", "--cert-dir=", "--secure-port="))
    ]
    U.spawn(
        cp,
        "pod-kube-scheduler",
        [
            str(cp.bins["kube-scheduler"]),
            f"--config={path}",
            f"--cert-dir={cp.work / 'pod-kube-scheduler-certs'}",
            f"--secure-port={free_port()}",
            "--bind-address=127.0.0.1",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            *kept,
        ],
        {},
    )


def stop_scheduler(c: Cluster) -> None:
    for name in ("pod-kube-scheduler", "pod-tessera-scheduler"):
        if name in c.cp.procs:
            c.cp.procs[name].stop()


def run_hook(c: Cluster, release: U.Release) -> None:
    """The NRI hook DaemonSet's pod on the node: its installed arguments with this host's
    paths (socket, device root, public keys, the stand-in HAMi-core library)."""
    n = c.node
    if "nri-hook" in n.procs:
        n.procs["nri-hook"].stop()
    hook = U.container(c.cp, "DaemonSet", "tessera-nri-hook", "nri-hook")
    args = U.with_flags(
        hook["args"],
        {
            "--socket": str(n.nri_sock),
            "--device-root": str(c.devices),
            "--integrity-key-file": str(c.cp.integrity_dir / "public"),
            "--hami-core-library": str(n.hami_core_library),
            "--metrics-port": str(free_port()),
        },
    )
    proc = n._spawn(
        "nri-hook",
        release.command(_module(release, hook["command"]), args),
        release.env(NODE_NAME=n.name),
    )
    wait_for(
        lambda: "registered with the runtime" in U.since_start(proc), 60, "the NRI hook registered"
    )


def run_agent(c: Cluster, release: U.Release) -> None:
    """The node agent DaemonSet's pod on the node: its installed arguments, the fake backend
    with the node's topology instead of NVML, and the pod's node-bound identity."""
    cp, n = c.cp, c.node
    if "agent" in n.procs:
        n.procs["agent"].stop()
    agent = U.container(cp, "DaemonSet", "tessera-device-plugin", "agent")
    kubeconfig = cp.kubeconfig(f"agent-{n.name}", token=cp.token("tessera-device-plugin", n.name))
    layer: dict[str, str | None] = {}
    if any(a.split("=", 1)[0] == "--host-root" for a in agent["args"]):
        # a release that probes the layer: the stand-in library the hook is given, where
        # it lies on this host (up; a layer found down would take no GPU share)
        layer = {"--host-root": "/", "--hami-core-library": str(n.hami_core_library)}
    args = U.with_flags(
        agent["args"],
        {
            **layer,
            "--backend": "fake",
            "--topology": str(n.topology),
            "--proc-root": "/proc",
            "--metrics-port": str(free_port()),
            "--kubeconfig": str(kubeconfig),
            "--integrity-key-file": str(cp.integrity_dir / "public"),
            "--pod-resources-socket": str(n.pod_resources_socket),
            "--heartbeat-interval": "2",
            "--lease-duration": "8",
            "--health-query-interval": "0",
            "--no-netlink": "",
        },
    )
    proc = n._spawn(
        "agent",
        release.command(_module(release, agent["command"]), args),
        release.env(NODE_NAME=n.name),
    )

    def advertised() -> bool:
        # the node's allocatable still shows what the agent before this one advertised: wait
        # until this process has registered every resource the node advertises (a pod
        # admitted before that fails the kubelet's admission, having no plugin to ask)
        alloc = cp.admin.get(f"/api/v1/nodes/{n.name}")["status"].get("allocatable") or {}
        ours = [r for r, v in alloc.items() if r in rn.TESSERA_RESOURCES and v != "0"]
        log = U.since_start(proc)
        return bool(ours) and all(f"{r}: registered with the kubelet" in log for r in ours)

    wait_for(advertised, 120, f"{n.name}'s agent registered with the kubelet", every=1)


RUNS = {"scheduler": run_scheduler, "hook": run_hook, "agent": run_agent}
ORDERS = {
    "scheduler-first": ("scheduler", "agent", "hook"),
    "nodes-first": ("hook", "agent", "scheduler"),
}
"""Upgrade orders; a rollback goes in the reverse order. `helm upgrade` and `kubectl apply`
start all three rollouts at once, so every mix can occur: between them the two orders pass
through each one (either scheduler with either hook and either agent on the node, and both
mixes of hook and agent)."""


# --- pods and the checks ---------------------------------------------------------------------


def create(c: Cluster, name: str, **kwargs: Any) -> None:
    obj = P.pod(name, **kwargs)
    obj["spec"]["schedulerName"] = "tessera"
    obj["spec"]["nodeSelector"] = {"kubernetes.io/hostname": c.node.name}
    for cont in obj["spec"]["containers"]:
        cont["image"] = IMAGE
        cont["imagePullPolicy"] = "Never"
    c.cp.admin.create(pod_path(P.NS), obj)
    c.pods.append(name)


def running(c: Cluster, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        c.cp.check_alive()
        obj = c.cp.admin.get(pod_path(P.NS, name))
        statuses = obj.get("status", {}).get("containerStatuses") or []
        up = statuses and all("running" in (s.get("state") or {}) for s in statuses)
        return obj if up else None

    return wait_for(check, RUN_TIMEOUT, f"pod {name} Running", every=1)


def _granted(c: ContainerAllocation | None) -> set[str]:
    """The GPU and RDMA device nodes a container's record grants (test_node's rule)."""
    if c is None:
        return set()
    paths: set[str] = set()
    if c.gpus:
        paths |= {f"/dev/{d}" for d in GPU_CONTROL} | {f"/dev/nvidia{g.minor}" for g in c.gpus}
    if c.rdma:
        paths.add("/dev/infiniband/rdma_cm")
        for r in c.rdma:
            minors = [v.uverbs_minor for v in r.vfs] if r.vfs else [r.uverbs_minor]
            paths |= {f"/dev/infiniband/uverbs{m}" for m in minors}
    return paths


def _tasks(n: Node) -> dict[str, tuple[int, str]]:
    """containerd's tasks: container ID -> (pid, status)."""
    rows = n.ctr("tasks", "list").stdout.splitlines()[1:]
    return {r.split()[0]: (int(r.split()[1]), r.split()[2]) for r in rows if len(r.split()) >= 3}


def _devices_in(pid: int) -> set[str]:
    """The GPU and RDMA device nodes in a running container's /dev."""
    root = Path(f"/proc/{pid}/root/dev")
    found = {f"/dev/{p.name}" for p in root.glob("nvidia*")}
    return found | {f"/dev/infiniband/{p.name}" for p in (root / "infiniband").glob("*")}


Seen = dict[str, dict[str, tuple[str, int, frozenset[str]]]]
"""pod -> container -> (container ID, restart count, device nodes in its /dev)."""


def check_all(c: Cluster, before: Seen, step: str) -> Seen:
    """Every pod of the case, as the module docstring says; what each container is now."""
    cp, n = c.cp, c.node
    keys = keyring(cp.integrity_dir)
    objs = [running(c, name) for name in c.pods]
    tasks = _tasks(n)
    seen: Seen = {}
    allocs: list[PodAllocation] = []
    for obj in objs:
        name = obj["metadata"]["name"]
        alloc = P.record(obj, keys)
        allocs.append(alloc)
        by_name = {x.name: x for x in alloc.containers}
        seen[name] = {}
        for status in obj["status"]["containerStatuses"]:
            cid = status["containerID"].split("://", 1)[1]
            pid, state = tasks[cid]
            where = f"{step}: pod {name}, container {status['name']} ({cid[:12]})"
            assert state == "RUNNING", f"{where}: task {state}"
            held = frozenset(_devices_in(pid))
            assert held == _granted(by_name.get(status["name"])), f"{where}: holds {sorted(held)}"
            seen[name][status["name"]] = (cid, int(status["restartCount"]), held)
        if name in before:
            assert seen[name] == before[name], (
                f"{step}: pod {name} changed: {before[name]} -> {seen[name]}"
            )
    _, _, conflicts = P.ledger(allocs)
    assert not conflicts, f"{step}: {conflicts}"
    for release in (c.previous, c.new):
        bad = U.unreadable(release, cp.integrity_dir / "public", objs)
        assert not bad, f"{step}: records {release.name} cannot read: {bad}"
    return seen


def place_one(c: Cluster, name: str, upgrading: bool) -> None:
    """A new pod places and runs; while the node mixes this release's agent with the
    previous hook, it is bound but its container is held by the gate, saying so. On an
    upgrade it must run once the hook is upgraded too; on a rollback the kubelet keeps the
    gate in its checkpoint, so the pod is deleted, as docs/operations.md tells an operator
    to do after a rollback through that mix."""
    create(c, name, limits={rn.GPU: "25"})
    if not c.gated():
        running(c, name)
        return

    def held() -> bool:
        obj = c.cp.admin.get(pod_path(P.NS, name))
        statuses = obj.get("status", {}).get("containerStatuses") or []
        assert not any("running" in (s.get("state") or {}) for s in statuses), (
            f"{name} runs although the previous hook cannot remove the gate: {statuses}"
        )
        return NRI_GATE_DESTINATION in json.dumps(statuses)

    wait_for(held, RUN_TIMEOUT, f"pod {name} held by the gate, saying so", every=1)
    c.pods.remove(name)
    if upgrading:
        c.held.append(name)
    else:
        P.delete_now(c.cp.admin, name)


def roll(c: Cluster, release: U.Release, order: tuple[str, ...], tag: str, seen: Seen) -> Seen:
    """Each workload of `order` replaced by `release`'s program, checking after each."""
    for workload in order:
        if workload == "scheduler":
            stop_scheduler(c)
            gap = f"{tag}-while-no-scheduler"
            create(c, gap, limits={rn.GPU: "25"})
            time.sleep(3)
            assert not P.bound(c.cp.admin, gap), f"{gap} was bound while no scheduler ran"
        RUNS[workload](c, release)
        c.on[workload] = release
        if not c.gated():
            c.pods += c.held  # the kubelet's retries run them now, with their devices
            c.held.clear()
        place_one(c, f"{tag}-after-{workload}", upgrading=release is c.new)
        seen = check_all(c, seen, f"{tag}, {workload} on {release.name}")
    return seen


@pytest.mark.parametrize(
    ("method", "order"), [("helm", "scheduler-first"), ("kustomize", "nodes-first")]
)
def test_upgrade_and_rollback_keep_every_running_container_and_record(
    cluster: Cluster, method: str, order: str
) -> None:
    c = cluster
    c.pods, c.held = [], []
    try:
        apply_release(c, method, c.previous, "install")
        for workload in ("hook", "agent", "scheduler"):
            RUNS[workload](c, c.previous)
            c.on[workload] = c.previous
        for name, kwargs in WORKLOADS.items():
            create(c, f"{method}-{name}", **kwargs)
        seen = check_all(c, {}, f"{method}: the previous release")
        apply_release(c, method, c.new, "upgrade")
        seen = roll(c, c.new, ORDERS[order], f"{method}-up", seen)
        apply_release(c, method, c.previous, "rollback")
        seen = roll(c, c.previous, ORDERS[order][::-1], f"{method}-down", seen)
        print(f"{method}, {order}: {len(seen)} pods kept their containers and devices")
    finally:
        for name in c.pods + c.held:
            P.delete_now(c.cp.admin, name)
        stop_scheduler(c)
        for proc in ("nri-hook", "agent"):
            if proc in c.node.procs:
                c.node.procs[proc].stop()
        remove_release(c, method)
