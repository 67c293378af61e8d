"""tessera against a real control plane: etcd, kube-apiserver (RBAC, tessera's admission
policies), kube-scheduler with the shipped extender configuration, two tessera-scheduler
replicas electing a leader, and one node agent per node on the fake GPU backend.

No kubelet runs here (tests/e2e/test_node.py has one): the test registers each Node the way
a kubelet would, with the counts the node agent advertises, and pods stay bound without
running. Opt-in: `make e2e` (see docs/e2e.md). Tests run in file order and share the
cluster; each one leaves it with the pods it says.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest
import yaml

from kube_edge.client import pod_path
from kube_edge.errors import ApiError
from tessera import resources as rn
from tests.e2e import binaries, layer
from tests.e2e import pods as P  # noqa: N812 - read as 'pods.' everywhere
from tests.e2e.conftest import NODES, TOPOLOGY
from tests.e2e.controlplane import (
    ADMIN_TOKEN,
    ROOT,
    ControlPlane,
    keyring,
    topology_for,
    wait_for,
)

pytestmark = pytest.mark.e2e
binaries.skip_module_unless(*binaries.CONTROL_PLANE)

BIND_TIMEOUT = 120.0
"""Seconds for kube-scheduler to bind one pod through the extender on a loaded 2-core host."""

CHAOS_PODS = int(os.environ.get("TESSERA_E2E_CHAOS_PODS", "500"))
"""Pods bound while tessera-scheduler replicas are SIGKILLed (the brief of this test: >= 500)."""

KINDS: dict[str, dict[str, Any]] = {
    # name: pod builder arguments; one pod per request kind of docs/resources.md
    "share": {"limits": {rn.GPU: "25"}},
    "core-and-units": {"limits": {rn.GPU_CORE: "30", rn.GPU_MEMORY: "20"}},
    "core-and-ratio": {"limits": {rn.GPU_CORE: "50", rn.GPU_MEMORY_RATIO: "50"}},
    "memory-units-only": {"limits": {rn.GPU_MEMORY: "10"}},
    "memory-ratio-only": {"limits": {rn.GPU_MEMORY_RATIO: "25"}},
    "whole-2": {"limits": {rn.GPU: "200"}},
    "whole-core-4": {"limits": {rn.GPU_CORE: "400", rn.GPU_MEMORY_RATIO: "400"}},
    "nvidia-1": {"limits": {rn.NVIDIA_GPU: "1"}},
    "rdma-share": {"limits": {rn.RDMA: "50"}},
    "rdma-whole": {"limits": {rn.RDMA: "100"}},
    "gpus-nvlink-rdma": {
        "limits": {rn.GPU: "400", rn.RDMA: "50"},
        "annotations": {rn.TOPOLOGY_ANNOTATION: "nvlink", rn.RDMA_AFFINITY_ANNOTATION: "pcie"},
    },
    "model-hint": {"limits": {rn.GPU: "50"}, "annotations": {rn.GPU_MODEL_ANNOTATION: "H100"}},
    "spread-policy": {"limits": {rn.GPU: "10"}, "annotations": {rn.PLACEMENT_ANNOTATION: "spread"}},
    "two-containers": {
        "containers": [
            P.container("a", {rn.GPU: "50"}),
            P.container("b", {rn.GPU_CORE: "100"}),
            P.container("plain", {}),
        ]
    },
    "init-and-sidecar": {
        "containers": [P.container("main", {rn.GPU: "100"})],
        "init": [
            P.container("setup", {rn.GPU: "50"}),
            P.container("sidecar", {rn.GPU: "20"}, restartPolicy="Always"),
        ],
    },
}


def _expected_gpus(limits: dict[str, str]) -> int:
    value = max(
        int(limits.get(r, "0")) for r in (rn.GPU, rn.GPU_CORE, rn.GPU_MEMORY_RATIO, rn.GPU_MEMORY)
    )
    if rn.NVIDIA_GPU in limits:
        return int(limits[rn.NVIDIA_GPU])
    if rn.GPU_MEMORY in limits and rn.GPU_CORE not in limits:
        return 1
    return 0 if value == 0 else max(1, value // 100)


def _reason_naming(cp: ControlPlane, name: str, text: str) -> str | None:
    """The pod's Pending reason once it names `text`."""
    reason = P.pending_reason(cp.admin, name)
    return reason if text in reason else None


def _wait_bound(cp: ControlPlane, name: str, timeout: float = BIND_TIMEOUT) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cp.check_alive()
        return P.bound(cp.admin, name)

    return wait_for(check, timeout, f"pod {name} bound", every=0.5)


def _pod_writes(cp: ControlPlane) -> Counter[str]:
    """The API server's own count of pod PATCHes and Binding POSTs so far."""
    import urllib3

    http = urllib3.PoolManager(ca_certs=str(cp.cluster_ca.path))
    text = http.request(
        "GET", f"{cp.server}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    ).data.decode()
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{") or 'resource="pods"' not in line:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        key = f"{labels['verb']} pods{'/' + labels['subresource'] if labels['subresource'] else ''}"
        counts[key] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def test_every_request_kind_is_placed_and_recorded(control_plane: ControlPlane) -> None:
    cp = control_plane
    before = _pod_writes(cp)
    for name, args in KINDS.items():
        cp.admin.create(pod_path(P.NS), P.pod(name, **args))
    keys = keyring(cp.integrity_dir)
    allocs = []
    for name, args in KINDS.items():
        obj = _wait_bound(cp, name)
        alloc = P.record(obj, keys)
        allocs.append(alloc)
        got = {c.name: c for c in alloc.containers}
        spec_containers = args.get("containers") or [P.container("main", args.get("limits", {}))]
        for spec in [*args.get("init", []), *spec_containers]:
            limits = spec["resources"]["limits"]
            if not limits:
                assert spec["name"] not in got, f"{name}/{spec['name']} asked for nothing"
                continue
            grant = got[spec["name"]]
            gpus = _expected_gpus(limits)
            assert len(grant.gpus) == gpus, (name, spec["name"], grant)
            if rn.RDMA in limits:
                share = int(limits[rn.RDMA])
                assert sum(r.share for r in grant.rdma) == share, (name, grant.rdma)
                if share < 100:
                    assert all(len(r.vfs) == 1 for r in grant.rdma), grant.rdma
            else:
                assert not grant.rdma
        if name == "init-and-sidecar":
            assert got["setup"].reuses == "main" and got["setup"].init
            assert not got["sidecar"].reuses
    _, _, conflicts = P.ledger(allocs)
    assert conflicts == []
    # one API write per bind, counted by the API server: the Binding carries the record
    writes = _pod_writes(cp) - before
    assert writes["PATCH pods"] == 0, writes
    assert writes["POST pods/binding"] == len(KINDS), writes


def test_impossible_pods_stay_pending_with_tessera_reasons(control_plane: ControlPlane) -> None:
    cp = control_plane
    cases = {
        "wrong-model": ({rn.GPU: "100"}, {rn.GPU_MODEL_ANNOTATION: "A100"}, "A100"),
        "nine-gpus": ({rn.GPU: "900"}, {}, "tessera"),
        "bad-rule": ({rn.GPU: "150"}, {}, "not a multiple of 100"),
    }
    for name, (limits, hints, _) in cases.items():
        cp.admin.create(pod_path(P.NS), P.pod(name, limits, annotations=hints))
    for name, (_, _, text) in cases.items():
        message = wait_for(
            functools.partial(_reason_naming, cp, name, text),
            BIND_TIMEOUT,
            f"{name} Pending with a reason naming {text!r}",
        )
        assert "tessera" in message, message
    events = cp.admin.list(f"/api/v1/namespaces/{P.NS}/events").get("items") or []
    about = [
        e.get("message") or ""
        for e in events
        if (e.get("involvedObject") or {}).get("name") == "wrong-model"
    ]
    assert any("A100" in m for m in about), about
    for name in cases:
        P.delete_now(cp.admin, name)


def test_the_shipped_admission_policies_hold_on_the_real_api_server(
    control_plane: ControlPlane,
) -> None:
    """Only tessera-scheduler writes allocation records; a node agent writes only its own
    node's objects (deploy/*/admission-policy.yaml, enforced by kube-apiserver itself)."""
    cp = control_plane
    forged = P.pod("forged", {}, annotations={rn.ALLOCATION_ANNOTATION: '{"v":1}'})
    with pytest.raises(ApiError) as refused:
        cp.admin.create(pod_path(P.NS), forged)
    assert refused.value.status in (403, 422), refused.value
    assert "tessera-scheduler" in str(refused.value), refused.value

    agent = cp.client(token=cp.token("tessera-device-plugin", NODES[0]))
    path = f"/apis/tessera.dev/v1alpha1/nodedevices/{NODES[1]}"
    for _ in range(5):
        other = cp.admin.get(path)
        changed = dict(other)
        changed["metadata"] = dict(other["metadata"], labels={"tessera.dev/forged": "yes"})
        with pytest.raises(ApiError) as refused:  # the agent's RBAC allows update, not patch
            agent.replace(path, changed)
        # 409: the node's own agent or the scheduler wrote it between the read and the
        # update, so the API server stopped before admission; read it again
        if refused.value.status != 409:
            break
    assert refused.value.status in (403, 422), refused.value
    assert "own node" in str(refused.value), refused.value
    after = cp.admin.get(path)
    assert after["metadata"].get("labels") == other["metadata"].get("labels")


def test_device_plugin_inventory_suite_against_the_real_api_server(
    control_plane: ControlPlane,
) -> None:
    """tests/deviceplugin/test_inventory_e2e.py, pointed at this cluster."""
    cp = control_plane
    admin = cp.kubeconfig("observer", token=ADMIN_TOKEN)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-o",
            "addopts=",
            "-p",
            "no:cacheprovider",
            "-m",
            "e2e",
            str(ROOT / "tests/deviceplugin/test_inventory_e2e.py"),
        ],
        check=False,
        cwd=ROOT,
        env=dict(os.environ, TESSERA_E2E_KUBECONFIG=str(admin)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "deselected" not in summary, (
        run.stdout[-2000:]
    )


def test_an_agent_whose_lease_expires_gets_no_new_pods(control_plane: ControlPlane) -> None:
    cp = control_plane
    node = NODES[-1]
    agent = cp.procs[f"agent-{node}"]
    inventory = cp.admin.get(f"/apis/tessera.dev/v1alpha1/nodedevices/{node}")
    uuid = inventory["spec"]["gpus"][0]["uuid"]
    agent.kill()
    try:
        time.sleep(8 + 2 + 2)  # the Lease's duration, the scheduler's grace, a margin
        cp.admin.create(
            pod_path(P.NS),
            P.pod("pinned-dead", {rn.GPU: "10"}, annotations={rn.GPU_UUID_ANNOTATION: uuid}),
        )
        wait_for(
            lambda: P.pending_reason(cp.admin, "pinned-dead"),
            BIND_TIMEOUT,
            "the pod pinned to the silent node to be refused",
        )
        time.sleep(5)
        assert P.bound(cp.admin, "pinned-dead") is None
    finally:
        agent.start()
    obj = _wait_bound(cp, "pinned-dead", timeout=BIND_TIMEOUT * 2)
    assert obj["spec"]["nodeName"] == node
    P.delete_now(cp.admin, "pinned-dead")


def _pinned_here(name: str, node: str, limits: dict[str, str], uuid: str = "") -> dict[str, Any]:
    obj = P.pod(name, limits, annotations={rn.GPU_UUID_ANNOTATION: uuid} if uuid else None)
    obj["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return obj


def test_a_node_back_with_a_gpu_unhealthy_and_one_gone(control_plane: ControlPlane) -> None:
    """Pods hold GPUs 0, 1 and 2 of a node whose agent then goes silent past its Lease;
    the node comes back (the agent restarted on a topology where GPU 0 failed and GPU 1
    is gone): the pods on them get an Event each and are listed in the node's status, new
    pods go to the good GPUs only, and when both GPUs return nothing is handed out twice."""
    cp = control_plane

    def gpus_of(node: str) -> list[dict[str, Any]] | None:
        got = cp.admin.get(f"/apis/tessera.dev/v1alpha1/nodedevices/{node}")
        return ((got.get("status") or {}).get("allocation") or {}).get("gpus")

    def whole(node: str) -> list[str]:
        """The GPUs of `node` the earlier tests left whole."""
        listed = wait_for(lambda: gpus_of(node), 60, f"{node}'s status")
        return [g["uuid"] for g in listed if g["core"]["used"] == 0]

    # a node with four whole GPUs, whatever the earlier tests of the module left running
    node, uuids = max(((n, whole(n)) for n in NODES), key=lambda nu: len(nu[1]))
    assert len(uuids) >= 4, f"no node has 4 whole GPUs ({node} has {len(uuids)})"
    agent = cp.procs[f"agent-{node}"]
    topology = cp.work / f"{node}.yaml"
    original = topology.read_text()
    path = f"/apis/tessera.dev/v1alpha1/nodedevices/{node}"

    def gpus() -> list[dict[str, Any]] | None:
        return gpus_of(node)

    held = [f"held-{i}" for i in range(3)]
    for i, name in enumerate(held):
        cp.admin.create(pod_path(P.NS), _pinned_here(name, node, {rn.GPU: "100"}, uuids[i]))
        _wait_bound(cp, name)
    agent.kill()
    time.sleep(8 + 2 + 2)  # the Lease's duration, the scheduler's grace, a margin
    doc = yaml.safe_load(original)
    gone = next(g["index"] for g in doc["gpus"] if g["uuid"] == uuids[1])
    doc["gpus"] = [g for g in doc["gpus"] if g["uuid"] != uuids[1]]
    for g in doc["gpus"]:  # as NVML would list the GPUs left: no link to the gone one
        g["nvlinks"] = {p: n for p, n in (g.get("nvlinks") or {}).items() if p != gone}
    failed = next(g for g in doc["gpus"] if g["uuid"] == uuids[0])
    failed["healthy"], failed["healthReason"] = False, "XID 79 after the reboot"
    topology.write_text(yaml.safe_dump(doc))
    new = [f"after-{i}" for i in range(len(uuids) - 3 + 1)]
    try:
        agent.start()

        def reported() -> dict[str, str] | None:
            status = cp.admin.get(path).get("status") or {}
            stranded = (status.get("allocation") or {}).get("stranded") or []
            found = {s["name"]: s["state"] for s in stranded}
            return found if len(found) == 2 else None

        found = wait_for(reported, BIND_TIMEOUT, f"{node}'s pods on bad GPUs in its status", 1)
        assert found == {held[0]: "unhealthy", held[1]: "missing"}

        def events() -> set[tuple[str, str]] | None:
            items = cp.admin.list(f"/api/v1/namespaces/{P.NS}/events").get("items") or []
            got = {
                (e["involvedObject"]["name"], e["reason"])
                for e in items
                if e["reason"].startswith("AllocatedDevice")
            }
            return got if len(got) == 2 else None

        got = wait_for(events, BIND_TIMEOUT, "the Events on the pods of the bad GPUs", 1)
        assert got == {(held[0], "AllocatedDeviceUnhealthy"), (held[1], "AllocatedDeviceMissing")}
        # of the free GPUs, one failed, one gone, one held: whole-GPU pods fit on the rest
        for name in new:
            cp.admin.create(pod_path(P.NS), _pinned_here(name, node, {rn.GPU: "100"}))
        keys = keyring(cp.integrity_dir)
        for name in new[:-1]:
            record = P.record(_wait_bound(cp, name), keys)
            assert {g.uuid for c in record.containers for g in c.gpus}.isdisjoint(uuids[:3])
        last = new[-1]
        wait_for(lambda: P.pending_reason(cp.admin, last), BIND_TIMEOUT, f"{last} refused")
        # both GPUs return: their pods still hold them, so the last pod still waits
        agent.kill()
        topology.write_text(original)
        agent.start()
        wait_for(lambda: reported() is None, BIND_TIMEOUT, "no pod on a bad GPU", 1)
        time.sleep(5)
        assert P.bound(cp.admin, last) is None
        allocs, _ = _all_records(cp)
        assert P.ledger(allocs)[2] == []
        P.delete_now(cp.admin, held[1])
        record = P.record(_wait_bound(cp, last), keys)
        assert [g.uuid for c in record.containers for g in c.gpus] == [uuids[1]]
    finally:
        if topology.read_text() != original:
            agent.kill()
            topology.write_text(original)
            agent.start()
        for name in held + new:
            with contextlib.suppress(ApiError):  # not created when the test failed early
                P.delete_now(cp.admin, name)


def _all_records(cp: ControlPlane) -> tuple[list[Any], list[str]]:
    keys = keyring(cp.integrity_dir)
    allocs, unbound = [], []
    for obj in cp.admin.list(pod_path(P.NS)).get("items") or []:
        if not obj["spec"].get("nodeName"):
            unbound.append(obj["metadata"]["name"])
            continue
        if rn.ALLOCATION_ANNOTATION in (obj["metadata"].get("annotations") or {}):
            allocs.append(P.record(obj, keys))
    return allocs, unbound


LAYER_NODE = "e2e-layer"
LAYER_DOWN = (
    "isolation layer hami-core is down: the HAMi-core library /usr/local/vgpu/libvgpu.so is missing"
)


def _isolation(cp: ControlPlane, node: str) -> dict[str, Any] | None:
    with contextlib.suppress(ApiError):  # not published yet
        got = cp.admin.get(f"/apis/tessera.dev/v1alpha1/nodedevices/{node}")
        return (got.get("spec") or {}).get("isolation")
    return None


def test_a_node_whose_layer_is_down_takes_whole_gpus_and_no_share_until_it_is_up(
    control_plane: ControlPlane,
) -> None:
    """A node agent that reports the HAMi-core layer down (no library under its host
    root): a share pinned there waits Pending with the layer's reason, a whole GPU binds
    there, the Node is labelled with its layer; once tessera's installer puts the library
    in place the agent reports it up and a share binds there. The node leaves the cluster
    afterwards (the later cases count the cluster's GPUs)."""
    cp = control_plane
    host = cp.work / "layer-host"  # the node's host files, as the DaemonSet's /host
    host.mkdir()
    agent = cp.add_node(
        LAYER_NODE,
        topology_for(LAYER_NODE, TOPOLOGY, cp.work),
        agent_args=["--isolation=hami-core", f"--host-root={host}", "--health-query-interval=1"],
    )
    names = ["layer-share", "layer-whole", "layer-share-later"]
    try:
        down = wait_for(lambda: _isolation(cp, LAYER_NODE), 60, "the layer in the inventory")
        assert down["layer"] == "hami-core" and down["up"] is False, down
        assert f"isolation layer hami-core is down: {down['reason']}" == LAYER_DOWN, down
        label = wait_for(
            lambda: (
                cp.admin.get(f"/api/v1/nodes/{LAYER_NODE}")["metadata"]
                .get("labels", {})
                .get(rn.ISOLATION_LABEL)
            ),
            60,
            "the node's isolation label",
        )
        assert label == "hami-core"
        cp.admin.create(pod_path(P.NS), _pinned_here(names[0], LAYER_NODE, {rn.GPU: "30"}))
        cp.admin.create(pod_path(P.NS), _pinned_here(names[1], LAYER_NODE, {rn.GPU: "100"}))
        whole = _wait_bound(cp, names[1])
        assert whole["spec"]["nodeName"] == LAYER_NODE
        (grant,) = P.record(whole, keyring(cp.integrity_dir)).containers[0].gpus
        assert grant.core == 100
        message = wait_for(
            functools.partial(_reason_naming, cp, names[0], LAYER_DOWN),
            BIND_TIMEOUT,
            "the share Pending with the layer's reason",
        )
        assert f"tessera: {LAYER_DOWN}" in message, message
        events = cp.admin.list(f"/api/v1/namespaces/{P.NS}/events").get("items") or []
        assert any(
            (e.get("involvedObject") or {}).get("name") == names[0]
            and LAYER_DOWN in (e.get("message") or "")
            for e in events
        ), [e.get("message") for e in events][-10:]
        assert P.bound(cp.admin, names[0]) is None

        # tessera's installer puts the layer in place; the agent finds it at its next probe
        layer.install(layer.stand_in_image(cp.work / "hami-core-image"), host)
        up = wait_for(
            lambda: (got := _isolation(cp, LAYER_NODE)) and got["up"] and got,
            60,
            "the layer reported up",
        )
        assert up["version"] == layer.STAND_IN_VERSION and up["reason"] == ""
        cp.admin.create(pod_path(P.NS), _pinned_here(names[2], LAYER_NODE, {rn.GPU: "30"}))
        later = _wait_bound(cp, names[2])
        (share,) = P.record(later, keyring(cp.integrity_dir)).containers[0].gpus
        assert later["spec"]["nodeName"] == LAYER_NODE and share.core == 30
    finally:
        for name in names:
            with contextlib.suppress(ApiError):
                P.delete_now(cp.admin, name)
        agent.stop()
        cp.remove_node(LAYER_NODE)


def test_binds_survive_leaders_killed_at_random(control_plane: ControlPlane) -> None:
    """CHAOS_PODS pods created in bursts while the leading tessera-scheduler replica is
    SIGKILLed at random moments and restarted as a standby: every pod ends bound, no GPU or
    VF is given twice, and every device comes back once the pods are gone."""
    cp = control_plane
    rng = random.Random(int(os.environ.get("TESSERA_E2E_SEED", "20260101")))
    names = [f"chaos-{i:04d}" for i in range(CHAOS_PODS)]
    # a share of an RDMA NIC takes a whole VF: 128 in the cluster, so about 1 pod in 8
    # 2% shares: the GPUs the earlier tests left free take 50 each
    shapes = [{rn.GPU: "2"}, {rn.GPU_CORE: "2", rn.GPU_MEMORY: "1"}] * 7 + [
        {rn.GPU: "2", rn.RDMA: "5"}
    ]
    kills = 0
    started = time.monotonic()
    next_kill = started + rng.uniform(2, 6)
    created = 0
    while True:
        cp.check_alive()
        burst = rng.randint(5, 40)
        for name in names[created : created + burst]:
            cp.admin.create(pod_path(P.NS), P.pod(name, rng.choice(shapes)))
        created = min(CHAOS_PODS, created + burst)
        if time.monotonic() >= next_kill:
            leader = cp.leader()
            if leader is not None and leader.running():
                leader.kill()
                kills += 1
                leader.start()
            next_kill = time.monotonic() + rng.uniform(2, 7)
        bound_now = sum(
            1
            for obj in cp.admin.list(pod_path(P.NS), labelSelector="").get("items") or []
            if obj["metadata"]["name"].startswith("chaos-") and obj["spec"].get("nodeName")
        )
        if created == CHAOS_PODS and bound_now == CHAOS_PODS:
            break
        assert time.monotonic() - started < 1800, f"only {bound_now}/{CHAOS_PODS} bound"
        time.sleep(rng.uniform(0.2, 1.5))
    elapsed = time.monotonic() - started
    allocs, _ = _all_records(cp)
    chaos = [a for a in allocs if a.name.startswith("chaos-")]
    assert len(chaos) == CHAOS_PODS
    _, memory, conflicts = P.ledger(allocs)
    assert conflicts == []
    for node in NODES:
        spec = cp.admin.get(f"/apis/tessera.dev/v1alpha1/nodedevices/{node}")["spec"]
        for gpu in spec["gpus"]:
            assert memory.get((node, gpu["uuid"]), 0) <= gpu["memoryMiB"], gpu["uuid"]
    print(f"chaos: {CHAOS_PODS} pods bound in {elapsed:.0f}s with {kills} leader kills")
    assert kills >= 3, "the run was too short to kill the leader several times"

    for name in names:
        P.delete_now(cp.admin, name)
    wait_for(lambda: _published_matches_records(cp), 60, "no device held by a deleted pod", 1)


def _published_matches_records(cp: ControlPlane) -> bool:
    """The leader's published per-GPU usage (NodeDevices status) equals what the pods' own
    records add up to: nothing leaked, nothing double counted."""
    allocs, _ = _all_records(cp)
    core, _, _ = P.ledger(allocs)
    for node in NODES:
        status = cp.admin.get(f"/apis/tessera.dev/v1alpha1/nodedevices/{node}").get("status") or {}
        for gpu in (status.get("allocation") or {}).get("gpus") or []:
            if gpu["core"]["used"] != core.get((node, gpu["uuid"]), 0):
                return False
    return True


FILL = [f"fill-{i:02d}" for i in range(len(NODES) * 8)]


def test_a_full_cluster_leaves_pods_pending_with_reasons(control_plane: ControlPlane) -> None:
    """As many whole-GPU pods as the cluster has GPUs: the GPUs that hold shares cannot
    take them, so some bind and the rest stay Pending saying why."""
    cp = control_plane
    for name in FILL:
        cp.admin.create(pod_path(P.NS), P.pod(name, {rn.GPU: "100"}))

    def settled() -> tuple[list[str], dict[str, str]] | None:
        done, pending = [], {}
        for name in FILL:
            obj = cp.admin.get(pod_path(P.NS, name))
            if obj["spec"].get("nodeName"):
                done.append(name)
            elif reason := P.unschedulable_message(obj):
                pending[name] = reason
            else:
                return None
        return (done, pending) if pending else None

    done, pending = wait_for(settled, BIND_TIMEOUT * 3, "every fill pod bound or refused", 1)
    assert done, "no whole GPU was free"
    assert all("tessera" in m or "Insufficient" in m for m in pending.values()), pending
    allocs, _ = _all_records(cp)
    assert P.ledger(allocs)[2] == []


def test_preemption_through_kube_scheduler(control_plane: ControlPlane) -> None:
    cp = control_plane
    cp.apply(
        [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": "tessera-e2e-high"},
                "value": 100000,
            }
        ]
    )
    cp.admin.create(
        pod_path(P.NS), P.pod("urgent", {rn.GPU: "100"}, priority_class="tessera-e2e-high")
    )
    obj = _wait_bound(cp, "urgent", timeout=BIND_TIMEOUT * 2)
    P.record(obj, keyring(cp.integrity_dir))
    allocs, _ = _all_records(cp)
    assert P.ledger(allocs)[2] == []


def test_no_component_was_refused_by_the_api_server(control_plane: ControlPlane) -> None:
    denials = control_plane.denials()
    assert denials == [], "\n".join(denials[:20])
