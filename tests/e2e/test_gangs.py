"""Gangs against a real control plane: kube-scheduler with tessera as its extender, two
tessera-scheduler replicas, eight nodes of eight GPUs in two racks (four nodes each), the
PodGroup CRD installed from deploy/crds. Pods of a gang carry the pod-group label and
stay bound without running (no kubelet: see test_control_plane.py).

The cases of docs/gangs.md: a gang waits whole until its last member exists and then binds
whole within seconds; two gangs that cannot both fit: one whole, the other none, until the
first is gone; a required rack; a leader SIGKILLed while gangs are placed; a PodGroup whose
minResources are not free holds its gang (counted past its timeout on the leader's
/metrics) until it is lowered.
"""

from __future__ import annotations

import functools
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kube_edge.client import MERGE_PATCH, pod_path
from tessera import resources as rn
from tests.e2e import binaries
from tests.e2e import pods as P  # noqa: N812 - read as 'pods.' everywhere
from tests.e2e.conftest import TOPOLOGY, _cleanup, _spec_of, _workdir
from tests.e2e.controlplane import ControlPlane, keyring, topology_for, wait_for

pytestmark = pytest.mark.e2e
binaries.skip_module_unless(*binaries.CONTROL_PLANE)

RACK = "topology.kubernetes.io/rack"
REQUIRED = {rn.GANG_REQUIRED_TOPOLOGY_ANNOTATION: RACK}
NODES = {f"gang-node-{i}": f"rack-{i // 4}" for i in range(8)}
GROUPS = (
    f"/apis/{rn.POD_GROUP_GROUP}/{rn.POD_GROUP_VERSION}/namespaces/{P.NS}/{rn.POD_GROUP_PLURAL}"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ControlPlane]:
    bins = binaries.require(*binaries.CONTROL_PLANE)
    work = _workdir("tessera-e2e-gangs-")
    cp = ControlPlane(work, bins)
    try:
        cp.start_api()
        cp.install()
        cp.apply_files(["deploy/crds/podgroups.yaml"])
        crd = (
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
            f"{rn.POD_GROUP_PLURAL}.{rn.POD_GROUP_GROUP}"
        )

        def established() -> bool:
            conds = cp.admin.get(crd).get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        wait_for(established, 60, "the PodGroup CRD established")
        for node, rack in NODES.items():
            cp.add_node(node, topology_for(node, TOPOLOGY, work), labels={RACK: rack})
        cp.start_schedulers(replicas=2)
        for node in NODES:
            path = f"/apis/tessera.dev/v1alpha1/nodedevices/{node}"
            wait_for(functools.partial(_spec_of, cp, path), 60, f"{node}'s NodeDevices")
        yield cp
    finally:
        print(f"control plane exit codes: {cp.stop()}")
        _cleanup(work)


def podgroup(
    cp: ControlPlane,
    name: str,
    min_member: int,
    timeout: int | None = None,
    min_resources: dict[str, str] | None = None,
) -> None:
    spec: dict[str, Any] = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    if min_resources is not None:
        spec["minResources"] = min_resources
    cp.admin.create(
        GROUPS,
        {
            "apiVersion": f"{rn.POD_GROUP_GROUP}/{rn.POD_GROUP_VERSION}",
            "kind": rn.POD_GROUP_KIND,
            "metadata": {"name": name, "namespace": P.NS},
            "spec": spec,
        },
    )


def member(
    cp: ControlPlane, gang: str, i: int, gpus: int = 8, annotations: dict[str, str] | None = None
) -> str:
    name = f"{gang}-{i}"
    obj = P.pod(
        name,
        {rn.GPU: str(gpus * 100)},
        labels={rn.POD_GROUP_LABEL: gang},
        annotations=annotations,
    )
    cp.admin.create(pod_path(P.NS), obj)
    return name


def nodes_of(cp: ControlPlane, gang: str) -> dict[str, str]:
    """Member name -> node, of the gang's bound members."""
    items = cp.admin.list(pod_path(P.NS), labelSelector=f"{rn.POD_GROUP_LABEL}={gang}")["items"]
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"] for p in items if p["spec"].get("nodeName")
    }


def delete_gang(cp: ControlPlane, gang: str) -> None:
    items = cp.admin.list(pod_path(P.NS), labelSelector=f"{rn.POD_GROUP_LABEL}={gang}")["items"]
    for p in items:
        P.delete_now(cp.admin, p["metadata"]["name"])
    cp.admin.request("DELETE", f"{GROUPS}/{gang}")

    def gone() -> bool:
        left = cp.admin.list(pod_path(P.NS), labelSelector=f"{rn.POD_GROUP_LABEL}={gang}")
        return not left["items"]

    wait_for(gone, 60, f"gang {gang}'s pods gone")


def whole(cp: ControlPlane, gang: str, size: int) -> bool:
    cp.check_alive()
    return len(nodes_of(cp, gang)) == size


def no_device_twice(cp: ControlPlane) -> None:
    items = cp.admin.list(pod_path(P.NS))["items"]
    keys = keyring(cp.integrity_dir)
    allocs = [P.record(p, keys) for p in items if p["spec"].get("nodeName")]
    _, _, conflicts = P.ledger(allocs)
    assert conflicts == []


def reason_of(cp: ControlPlane, name: str) -> str:
    return P.pending_reason(cp.admin, name)


def test_a_gang_waits_for_its_last_member_then_binds_whole_within_seconds(
    cluster: ControlPlane,
) -> None:
    cp = cluster
    podgroup(cp, "four", 4)
    names = [member(cp, "four", i, gpus=2) for i in range(3)]
    wait_for(
        lambda: "gang default/four: 3 of 4 members pending" in reason_of(cp, names[0]),
        60,
        "the gang's reason on a member",
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # 0 bound, and stays so
        assert nodes_of(cp, "four") == {}
        time.sleep(1)
    member(cp, "four", 3, gpus=2)
    created = time.monotonic()
    wait_for(lambda: whole(cp, "four", 4), 30, "all 4 members bound", every=0.2)
    took = time.monotonic() - created
    print(f"gang of 4: last member created -> all bound in {took:.2f}s")
    assert took <= 10, f"took {took:.1f}s"
    no_device_twice(cp)
    delete_gang(cp, "four")


def test_a_required_rack_places_the_whole_gang_in_one_rack(cluster: ControlPlane) -> None:
    cp = cluster
    # two nodes of rack-0 taken: rack-0 has 2 nodes free, rack-1 four; 3 members fit in
    # the cluster either way, but only rack-1 holds all three
    fillers = []
    for node in ("gang-node-0", "gang-node-1"):
        name = f"filler-{node}"
        obj = P.pod(name, {rn.GPU: "800"})
        obj["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        cp.admin.create(pod_path(P.NS), obj)
        fillers.append(name)
    for name in fillers:
        wait_for(lambda n=name: P.bound(cp.admin, n), 120, f"{name} bound")  # type: ignore[misc]
    podgroup(cp, "racked", 3)
    for i in range(3):
        member(cp, "racked", i, annotations=REQUIRED)
    wait_for(lambda: whole(cp, "racked", 3), 120, "the racked gang bound")
    racks = {NODES[n] for n in nodes_of(cp, "racked").values()}
    assert racks == {"rack-1"}, racks
    # a second racked gang of 3 fits in no rack now (rack-0: 2 free, rack-1: 1 free)
    podgroup(cp, "norack", 3)
    names = [member(cp, "norack", i, annotations=REQUIRED) for i in range(3)]
    wait_for(
        lambda: f"free in any one {RACK} domain" in reason_of(cp, names[0]), 60, "no-rack reason"
    )
    assert nodes_of(cp, "norack") == {}
    no_device_twice(cp)
    for gang in ("racked", "norack"):
        delete_gang(cp, gang)
    for name in fillers:
        P.delete_now(cp.admin, name)


def test_two_gangs_that_cannot_both_fit_never_deadlock(cluster: ControlPlane) -> None:
    cp = cluster
    for gang in ("ga", "gb"):
        podgroup(cp, gang, 6)
    for i in range(6):  # interleaved, as two jobs starting together
        for gang in ("ga", "gb"):
            member(cp, gang, i)
    wait_for(lambda: whole(cp, "ga", 6) or whole(cp, "gb", 6), 120, "one gang bound whole")
    first, second = ("ga", "gb") if whole(cp, "ga", 6) else ("gb", "ga")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert nodes_of(cp, second) == {}, f"{second} half bound"
        assert whole(cp, first, 6)
        time.sleep(2)
    reason = reason_of(cp, f"{second}-0")
    assert f"gang default/{second}: 6 members need 48 GPUs, 16 free" in reason, reason
    no_device_twice(cp)
    delete_gang(cp, first)
    gone = time.monotonic()
    wait_for(lambda: whole(cp, second, 6), 60, f"{second} bound whole", every=0.2)
    took = time.monotonic() - gone
    print(f"second gang of 6 bound whole {took:.2f}s after the first was gone")
    assert took <= 30, f"took {took:.1f}s"
    no_device_twice(cp)
    delete_gang(cp, second)


def test_a_leader_killed_while_gangs_are_placed_leaves_none_half_bound(
    cluster: ControlPlane,
) -> None:
    cp = cluster
    gangs = ("k0", "k1", "k2")  # 3 x 4 x 8 GPUs on 64 GPUs: two fit, one waits
    for gang in gangs:
        podgroup(cp, gang, 4)
    for i in range(4):
        for gang in gangs:
            member(cp, gang, i)
    wait_for(lambda: any(nodes_of(cp, g) for g in gangs), 120, "a first member bound")
    leader = cp.leader()
    assert leader is not None
    leader.kill()
    leader.start()  # back as a standby, as its Deployment would restart it

    def settled() -> bool:
        cp.check_alive()
        sizes = sorted(len(nodes_of(cp, g)) for g in gangs)
        return sizes == [0, 4, 4]

    wait_for(settled, 180, "two gangs whole, one with none bound")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        sizes = sorted(len(nodes_of(cp, g)) for g in gangs)
        assert sizes == [0, 4, 4], sizes
        time.sleep(1)
    no_device_twice(cp)
    for gang in gangs:
        delete_gang(cp, gang)


PAST = "tessera_scheduler_gangs_waiting_past_timeout"


def gangs_past_timeout(cp: ControlPlane) -> float | None:
    """The leading replica's gauge, from its own /metrics (None while none leads)."""
    leader = cp.leader()
    if leader is None:
        return None
    url = f"http://127.0.0.1:{cp.health_ports[leader.name]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    (line,) = [x for x in lines if x.startswith(PAST + " ")]
    return float(line.split()[1])


def test_a_gang_whose_min_resources_are_not_free_waits_until_they_are_lowered(
    cluster: ControlPlane,
) -> None:
    """One node busy: 56 GPUs free. A PodGroup of two 1-GPU members asks for 60 free: both
    wait with that reason in their PodScheduled condition and FailedScheduling events,
    nothing is bound, and once a member has waited past the PodGroup's 2 s the leader
    counts the gang; minResources lowered to 56 (and the timeout raised to 30 s), the gang
    binds whole and is no longer counted."""
    cp = cluster
    filler = "minres-filler"
    obj = P.pod(filler, {rn.GPU: "800"})
    obj["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gang-node-7"}
    cp.admin.create(pod_path(P.NS), obj)
    wait_for(lambda: P.bound(cp.admin, filler), 120, f"{filler} bound")
    podgroup(cp, "minres", 2, timeout=2, min_resources={rn.GPU: "6000", "cpu": "1"})
    names = [member(cp, "minres", i, gpus=1) for i in range(2)]
    short = f"gang default/minres: minResources not free: {rn.GPU} 6000 wanted, 5600 free"
    for name in names:
        wait_for(lambda n=name: short in reason_of(cp, n), 60, f"{name}'s minResources reason")  # type: ignore[misc]

    def told() -> bool:
        items = cp.admin.list(f"/api/v1/namespaces/{P.NS}/events").get("items") or []
        about = {
            (e.get("involvedObject") or {}).get("name")
            for e in items
            if e.get("reason") == "FailedScheduling" and short in (e.get("message") or "")
        }
        return set(names) <= about

    wait_for(told, 60, "FailedScheduling events naming the minResources")
    wait_for(lambda: gangs_past_timeout(cp) == 1.0, 30, "the gang counted past its timeout")
    assert nodes_of(cp, "minres") == {}
    cp.admin.request(
        "PATCH",
        f"{GROUPS}/minres",
        # a timeout past kube-scheduler's longest backoff (10 s): the members' retries,
        # each backed off since they were refused, come inside the reservation
        {"spec": {"minResources": {rn.GPU: "5600"}, "scheduleTimeoutSeconds": 30}},
        content_type=MERGE_PATCH,
    )
    lowered = time.monotonic()
    wait_for(lambda: whole(cp, "minres", 2), 60, "both members bound", every=0.2)
    print(f"minResources lowered -> gang of 2 bound in {time.monotonic() - lowered:.2f}s")
    wait_for(lambda: gangs_past_timeout(cp) == 0.0, 30, "the gang no longer counted")
    no_device_twice(cp)
    delete_gang(cp, "minres")
    P.delete_now(cp.admin, filler)
