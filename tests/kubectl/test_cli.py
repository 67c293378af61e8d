"""`kubectl tessera` against the simulated API server and the real tessera-scheduler."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kubectl_tessera.cli import main
from tessera import resources as rn
from tessera.usage import ContainerUsage, NodeUsage, UnattributedUsage, encode_usage
from tessera_testbed.apiserver import FakeApiServer
from tests.kubectl.conftest import add_node
from tests.scheduler.helpers import Served, pod, serving, share, wait_for

WHOLE = {rn.GPU: 400}
"""Four whole GPUs."""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run(capsys, *argv, "-o", "json")
    assert code == 0, err
    return json.loads(out)


def bound(
    fake: FakeApiServer, name: str, node: str, record: str, namespace: str = "default"
) -> None:
    """A running pod bound to `node` carrying `record` (as a user could create one)."""
    obj = pod(
        name, share(10, 10), namespace=namespace, annotations={rn.ALLOCATION_ANNOTATION: record}
    )
    obj["spec"]["nodeName"] = node
    fake.create("pods", obj)
    fake.patch("pods", name, {"status": {"phase": "Running"}}, namespace=namespace, sub="status")


def status_written(fake: FakeApiServer, node: str, check: Callable[[Any], object]) -> None:
    wait_for(lambda: check(fake.get("nodedevices", node).get("status", {}).get("allocation")))


@contextmanager
def scheduling(
    fake: FakeApiServer, *placements: tuple[dict[str, Any], str], **options: Any
) -> Iterator[Served]:
    """tessera-scheduler serving `fake` (`options` as in `serving`), each pod of
    `placements` scheduled as kube-scheduler would, offered its node alone: it must land."""
    with serving(fake, **options) as served:
        for obj, node in placements:
            assert served.schedule(obj, [node]) == node, obj["metadata"]["name"]
        yield served


@pytest.fixture
def cluster(fake: FakeApiServer) -> FakeApiServer:
    """h100 (8x H100, 4 NICs) and t4 (4x T4), both alive; a silent a100 node."""
    add_node(fake, "h100", "h100-sxm-8x")
    add_node(fake, "t4", "t4-4x")
    add_node(fake, "a100", "a100-pcie-8x", lease_age=3600)
    return fake


def test_nodes_shows_devices_allocation_fencing_and_heartbeat(
    cluster: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = cluster
    with scheduling(fake, (pod("a", share(40, 50)), "t4"), (pod("b", WHOLE), "h100")):
        # a record altered after the bind: the scheduler fences the node
        bound(fake, "forged", "h100", "{not a record")
        status_written(fake, "h100", lambda s: s and s["fenced"])
        status_written(fake, "t4", lambda s: s and s["gpus"][0]["core"]["used"] == 40)
        rows = {r["node"]: r for r in run_json(capsys, "nodes", "--kubeconfig", kubeconfig)}

    assert set(rows) == {"h100", "t4", "a100"}
    t4, h100, a100 = rows["t4"], rows["h100"], rows["a100"]
    assert t4["state"] == "ready" and t4["gpus"] == "4x Tesla T4"
    assert (t4["gpu_count"], t4["healthy_gpus"], t4["rdma"]) == (4, 4, 0)
    assert (t4["core_used"], t4["core_free"]) == (40, 360)
    t4_mib = 15360  # the topology's T4 memory
    assert t4["memory_used_mib"] == t4_mib // 2
    assert t4["memory_used_mib"] + t4["memory_free_mib"] == 4 * t4_mib
    assert t4["heartbeat_age_s"] < 60 and "stale" not in t4["heartbeat"]

    assert h100["state"] == "fenced" and h100["core_used"] == 400 and h100["rdma"] == 4
    assert h100["fenced_by"][0]["pod"] == "default/forged"
    assert "node is fenced" in h100["reason"] and "default/forged" in h100["reason"]

    assert a100["state"] == "unusable" and "stale" in a100["heartbeat"]
    assert (
        "node agent is silent: heartbeat Lease tessera-system/tessera-node-a100" in a100["reason"]
    )

    code, out, _ = run(capsys, "nodes", "--kubeconfig", kubeconfig)
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["NODE", "STATE", "GPUS"]
    assert [line.split()[0] for line in lines[1:]] == ["a100", "h100", "t4"]
    assert "40%/360%" in out and "fenced" in lines[2]


def test_nodes_labeled_for_the_agent_without_nodedevices_are_listed(
    fake: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_node(fake, "t4", "t4-4x")
    fake.create(
        "nodes", {"metadata": {"name": "lost", "labels": {"tessera.dev/node-agent": "true"}}}
    )
    fake.create("nodes", {"metadata": {"name": "cpu", "labels": {"role": "cpu"}}})
    rows = {r["node"]: r for r in run_json(capsys, "nodes", "--kubeconfig", kubeconfig)}
    assert set(rows) == {"t4", "lost"}
    assert rows["lost"]["state"] == "missing" and rows["lost"]["heartbeat"] == "missing"
    assert "node agent running" in rows["lost"]["reason"]
    fake.fail("/api/v1/nodes", status=403, times=10)
    rows = {r["node"]: r for r in run_json(capsys, "nodes", "--kubeconfig", kubeconfig)}
    assert set(rows) == {"t4"}


def test_nodes_without_scheduler_status_or_readable_leases(
    fake: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_node(fake, "t4", "t4-4x")
    fake.fail("/leases", status=403, times=10)
    (row,) = run_json(capsys, "nodes", "--kubeconfig", kubeconfig)
    assert row["state"] == "unknown" and row["heartbeat"] == "?"
    assert "tessera-scheduler" in row["reason"] and row["core_used"] is None


def test_nodes_survive_hostile_objects(
    fake: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_node(fake, "good", "t4-4x")
    fake.create("nodedevices", {"metadata": {"name": "bad"}, "spec": {"gpus": "many"}})
    fake.create(
        "nodedevices",
        {
            "metadata": {"name": "odd"},
            "spec": fake.get("nodedevices", "good")["spec"] | {"nodeName": "odd"},
            "status": {
                "allocation": {
                    "usable": "yes",
                    "gpus": [{"core": {"used": "x"}}],
                    "fenced": [1, {"pod": 5}],
                    "problem": ["\x1b[31m"],
                }
            },
        },
    )
    rows = {r["node"]: r for r in run_json(capsys, "nodes", "--kubeconfig", kubeconfig)}
    assert rows["bad"]["state"] == "invalid" and "gpus" in rows["bad"]["reason"]
    assert rows["odd"]["core_used"] is None and rows["good"]["gpu_count"] == 4
    code, out, _ = run(capsys, "nodes", "--kubeconfig", kubeconfig)
    assert code == 0 and "\x1b" not in out


def test_pods_lists_grants_per_container_and_invalid_records(
    cluster: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = cluster
    nic_pod = pod("b", WHOLE | {rn.RDMA: 100}, namespace="train")
    with scheduling(fake, (pod("a", share(40, 50)), "t4"), (nic_pod, "h100")) as served:
        served.wait_settled()
    record_a = fake.get("pods", "a")["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION]
    bound(fake, "copied", "t4", record_a)  # another pod's record: wrong UID and name
    fake.create("pods", pod("plain", share(10, 10)))  # no record, not bound: not listed
    stripped = pod("stripped", share(10, 10))  # bound and running, record removed
    stripped["spec"]["nodeName"] = "t4"
    stripped["status"]["phase"] = "Running"
    fake.create("pods", stripped)
    cpu_only = pod("cpu-only")  # bound, no tessera resources: not listed
    cpu_only["spec"]["nodeName"] = "t4"
    fake.create("pods", cpu_only)

    doc = run_json(capsys, "pods", "--kubeconfig", kubeconfig, "-A")
    assert "NOT verified" in doc["note"]
    rows = {(r["namespace"], r["name"]): r for r in doc["pods"]}
    assert set(rows) == {
        ("default", "a"),
        ("default", "copied"),
        ("default", "stripped"),
        ("train", "b"),
    }
    assert rows["default", "stripped"]["invalid"] == (
        "asks for tessera devices but carries no allocation record"
    )
    a = rows["default", "a"]
    assert a["node"] == "t4" and a["container"] == "main"
    assert a["gpus"][0]["core"] == 40 and a["gpus"][0]["uuid"].startswith("GPU-")
    b = rows["train", "b"]
    assert len(b["gpus"]) == 4 and len(b["rdma"]) == 1 and b["rdma"][0]["share"] == 100
    assert rows["default", "copied"]["invalid"].startswith("record is for")

    code, out, _ = run(capsys, "pods", "--kubeconfig", kubeconfig)  # the context's namespace
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("# ") and "NOT verified" in lines[0]
    assert "train" not in out and "invalid: record is for" in out
    assert "40%" in out and a["gpus"][0]["uuid"][:12] in out
    code, out, _ = run(capsys, "pods", "--kubeconfig", kubeconfig, "-n", "train")
    assert "mlx5_" in out and "default" not in out


USAGE_AT = "2026-11-22T04:20:00Z"


def annotate(fake: FakeApiServer, node: str, text: str) -> None:
    """`node`'s agent renews its heartbeat Lease with this usage reading."""
    patch = {"metadata": {"annotations": {rn.USAGE_ANNOTATION: text}}}
    name = rn.HEARTBEAT_LEASE_PREFIX + node
    fake.patch("leases", name, patch, namespace=rn.DEFAULT_HEARTBEAT_NAMESPACE)


def test_pods_show_use_beside_grants_and_nodes_what_no_tessera_container_owns(
    cluster: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = cluster
    nic_pod = pod("b", WHOLE | {rn.RDMA: 100}, namespace="train")
    with scheduling(fake, (pod("a", share(40, 50)), "t4"), (nic_pod, "h100")) as served:
        served.wait_settled()
    before = run_json(capsys, "pods", "--kubeconfig", kubeconfig, "-A")["pods"]
    granted = {(r["namespace"], r["name"]): r for r in before}
    a_gpu = granted["default", "a"]["gpus"][0]
    t4 = fake.get("nodedevices", "t4")["spec"]["gpus"]
    other_gpu = next(g for g in t4 if g["uuid"] != a_gpu["uuid"])
    reading = NodeUsage(
        USAGE_AT,
        (
            ContainerUsage(
                fake.get("pods", "a")["metadata"]["uid"],
                "default",
                "a",
                "main",
                a_gpu["uuid"],
                3000,
                35,
            ),
        ),
        (
            UnattributedUsage(a_gpu["uuid"], "host", 512, 1),
            UnattributedUsage(other_gpu["uuid"], "other-pod", 2048, 2),
            UnattributedUsage("GPU-not-here", "host", 1, 1),
        ),
    )
    annotate(fake, "t4", encode_usage(reading))
    annotate(fake, "h100", '{"v": 1, "at": "x", "c": [["forged"]]}')  # hostile: one node only

    doc = run_json(capsys, "pods", "--kubeconfig", kubeconfig, "-A")
    rows = {(r["namespace"], r["name"]): r for r in doc["pods"]}
    a, b = rows["default", "a"], rows["train", "b"]
    assert a["gpus"][0]["used"] == {"memoryMiB": 3000, "smPercent": 35}
    assert (a["usage_observed"], a["usage_unknown"]) == (USAGE_AT, "")
    assert a["gpus"][0]["memoryMiB"] == a_gpu["memoryMiB"]  # the grant, unchanged
    assert all(g["used"] is None for g in b["gpus"]) and b["usage_observed"] == ""
    assert b["usage_unknown"].startswith("usage annotation does not parse")
    # what no tessera container owns is never put on a pod
    assert "other-pod" not in json.dumps(doc) and "512" not in json.dumps(a)

    code, out, _ = run(capsys, "pods", "--kubeconfig", kubeconfig, "-A")
    header, *lines = out.splitlines()[1:]
    assert code == 0 and "MEMORY USED/GRANTED" in header and "SM USED" in header
    line_a = next(line for line in lines if " a " in line)
    index = a_gpu["index"]
    assert f"{index}:2.9GiB/{a_gpu['memoryMiB'] / 1024:.1f}GiB" in line_a
    assert f"{index}:35%" in line_a
    line_b = next(line for line in lines if line.startswith("train"))
    # unknown, beside a grant that still shows (the RDMA cell is two words)
    assert line_b.split()[6:8] == ["-", "-"] and "100%" in line_b

    nodes = {r["node"]: r for r in run_json(capsys, "nodes", "--kubeconfig", kubeconfig)}
    assert nodes["t4"]["unattributed"] == [
        {
            "index": a_gpu["index"],
            "uuid": a_gpu["uuid"],
            "owner": "host",
            "memoryMiB": 512,
            "processes": 1,
        },
        {
            "index": other_gpu["index"],
            "uuid": other_gpu["uuid"],
            "owner": "other-pod",
            "memoryMiB": 2048,
            "processes": 2,
        },
        {"index": None, "uuid": "GPU-not-here", "owner": "host", "memoryMiB": 1, "processes": 1},
    ]
    assert (
        nodes["h100"]["unattributed"] == [] and "does not parse" in nodes["h100"]["usage_unknown"]
    )
    assert rn.USAGE_ANNOTATION in nodes["a100"]["usage_unknown"]
    assert nodes["h100"]["state"] == "ready"  # a reading never changes the node's state
    code, out, _ = run(capsys, "nodes", "--kubeconfig", kubeconfig)
    t4_line = next(line for line in out.splitlines() if line.startswith("t4 "))
    assert f"{index}:host 512MiB, {other_gpu['index']}:other-pod 2.0GiB, ?:host 1MiB" in t4_line
    assert "NOT TESSERA" in out.splitlines()[0]


def test_pods_print_without_readable_leases(
    cluster: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with scheduling(cluster, (pod("a", share(40, 50)), "t4")) as served:
        served.wait_settled()
    cluster.fail("/leases", status=403, times=10)
    (row,) = run_json(capsys, "pods", "--kubeconfig", kubeconfig)["pods"]
    assert row["gpus"][0]["core"] == 40 and row["gpus"][0]["used"] is None
    assert row["usage_unknown"] == "the heartbeat Leases cannot be read"


def test_explain_agrees_with_the_scheduler_node_by_node(
    cluster: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = cluster
    busy = [(pod(f"w{i}", {rn.GPU: 200}), "h100") for i in range(3)]  # 6 H100s taken, 2 left
    busy.append((pod("s", share(80, 90)), "t4"))
    with scheduling(fake, *busy, filter_answer="all") as served:
        served.wait_settled()
        nodes = ["h100", "t4", "a100"]
        cases = {
            "big": pod("big", WHOLE),
            "pinned": pod(
                "pinned", share(50, 50), annotations={rn.GPU_MODEL_ANNOTATION: "NVIDIA A100"}
            ),
            "small": pod("small", share(10, 10)),
        }
        for name, obj in cases.items():
            created = fake.create("pods", obj)
            reply = served.filter(created, nodes)
            doc = run_json(
                capsys, "explain", name, "--kubeconfig", kubeconfig, "--policy", "binpack"
            )
            verdicts = {v["node"]: v for v in doc["nodes"]}
            assert set(verdicts) == set(nodes)
            assert {n for n, v in verdicts.items() if v["fits"]} == set(reply["NodeNames"])
            failed = reply["FailedNodes"] | reply["FailedAndUnresolvableNodes"]
            for node, reason in failed.items():
                # the same words; a silent agent's age may differ by the second
                core = reason.removeprefix("tessera: ").split(" (")[0].split(" for ")[0]
                assert core in verdicts[node]["reason"], (name, node)

    assert "fits now" not in {v["reason"] for v in doc["nodes"] if v["node"] == "a100"}
    code, out, _ = run(capsys, "explain", "big", "--kubeconfig", kubeconfig)
    assert code == 0 and out.startswith("Pod default/big: 1 container(s)")
    assert "main: 4 whole GPUs" in out and "not verified" in out
    # 3 of the T4's 4 GPUs are whole and free, 2 of the H100's 8; the A100 is closed
    near = out[out.index("# nearest to fitting") :].splitlines()[1:3]
    assert near[0].strip().startswith("t4 (75% of the ask free): needs 4 whole GPUs, 3 free")
    assert near[1].strip().startswith("h100 (50% of the ask free): needs 4 whole GPUs, 2 free")
    table = out[out.index("NODE") :].splitlines()
    assert [line.split()[:2] for line in table[1:]] == [
        ["a100", "no"],
        ["h100", "no"],
        ["t4", "no"],
    ]


def test_explain_prints_the_broken_rule_and_unrelated_pods(
    fake: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_node(fake, "t4", "t4-4x")
    fake.create("pods", pod("bad", {rn.GPU_CORE: 150}))
    fake.create("pods", pod("cpu-only"))
    doc = run_json(capsys, "explain", "bad", "--kubeconfig", kubeconfig)
    assert doc["summary"].startswith("the request breaks a rule") and doc["nodes"] == []
    assert rn.GPU_CORE in doc["summary"]
    doc = run_json(capsys, "explain", "cpu-only", "--kubeconfig", kubeconfig)
    assert "no tessera devices" in doc["summary"]


def test_explain_reads_the_required_plugins_annotation_as_the_scheduler_does(
    fake: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod whose required-plugins annotation does not read: tessera-scheduler's filter
    refuses it on every node, and explain says so with the scheduler's own words; a
    scheduler that does not require the NRI plugin takes it, and so does explain told so."""
    add_node(fake, "t4", "t4-4x")
    unreadable = {rn.NRI_REQUIRED_PLUGINS_POD_ANNOTATION: "[tessera, [nested]]"}
    created = fake.create("pods", pod("odd", share(10, 10), annotations=unreadable))
    with serving(fake) as served:  # as shipped: --nri-plugin-name tessera
        reply = served.filter(created, ["t4"])
    assert reply["NodeNames"] == []
    refusal = reply["FailedAndUnresolvableNodes"]["t4"]
    assert refusal.startswith("tessera: invalid device request: ")
    doc = run_json(capsys, "explain", "odd", "--kubeconfig", kubeconfig)
    assert doc["summary"].startswith("the request breaks a rule") and doc["nodes"] == []
    assert doc["summary"].endswith(refusal.removeprefix("tessera: invalid device request: "))
    assert rn.NRI_REQUIRED_PLUGINS_POD_ANNOTATION in doc["summary"]
    # a scheduler run with --no-require-nri-plugin does not read it
    with serving(fake, nri_plugin=None) as served:
        assert served.filter(created, ["t4"])["NodeNames"] == ["t4"]
    off = run_json(capsys, "explain", "odd", "--kubeconfig", kubeconfig, "--no-require-nri-plugin")
    assert [v["fits"] for v in off["nodes"]] == [True]
    code, _, err = run(
        capsys, "explain", "odd", "--kubeconfig", kubeconfig, "--nri-plugin-name", "bad name"
    )
    assert code == 2 and "not an NRI plugin name" in err


def test_errors_are_one_line(
    fake: FakeApiServer, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "explain", "missing", "--kubeconfig", kubeconfig)
    assert code == 1 and out == "" and err.count("\n") == 1 and "404" in err
    code, _, err = run(capsys, "frobnicate")
    assert code == 2 and err.count("\n") == 1
    code, _, err = run(capsys, "nodes", "-o", "yaml", "--kubeconfig", kubeconfig)
    assert code == 2 and err.count("\n") == 1
    for flag in ("-n", "--heartbeat-namespace"):  # a namespace goes into API paths
        code, _, err = run(capsys, "pods", flag, "../kube-system", "--kubeconfig", kubeconfig)
        assert code == 2 and err.count("\n") == 1 and "not a valid namespace" in err
    code, _, err = run(capsys, "gangs", "--manage-nvidia-gpu", "--kubeconfig", kubeconfig)
    assert code == 0, err  # gangs and explain share the flag
    fake.stop()
    code, _, err = run(capsys, "nodes", "--kubeconfig", kubeconfig, "--request-timeout", "2")
    assert code == 1 and err.count("\n") == 1 and "cannot reach" in err
    code, _, err = run(capsys, "nodes", "--kubeconfig", str(tmp_path / "nope"))
    assert code == 1 and err.count("\n") == 1 and "configuration" in err


def test_namespace_and_context_come_from_the_kubeconfig(
    fake: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(Path(fake.kubeconfig(str(tmp_path / "base"))).read_text())
    doc["contexts"].append(
        {"name": "ml", "context": {"cluster": "fake", "user": "fake", "namespace": "ml"}}
    )
    path = tmp_path / "kc"
    path.write_text(json.dumps(doc))
    fake.create("pods", pod("p", share(10, 10), namespace="ml"))
    code, _, err = run(capsys, "explain", "p", "--kubeconfig", str(path))
    assert code == 1 and "404" in err  # the current context's namespace is "default"
    code, out, _ = run(capsys, "explain", "p", "--kubeconfig", str(path), "--context", "ml")
    assert code == 0 and out.startswith("Pod ml/p:")


def test_in_a_pod_the_service_account_and_its_namespace_are_used(
    fake: FakeApiServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kube_edge import config

    def incluster(configuration: Any) -> None:  # kube_edge.config takes the client's Any too
        configuration.host = fake.url

    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("ml\n")
    monkeypatch.setattr(config, "load_incluster", incluster)
    monkeypatch.setattr(config, "SERVICE_ACCOUNT_NAMESPACE", str(namespace_file))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    fake.create("pods", pod("p", share(10, 10), namespace="ml"))
    code, out, err = run(capsys, "explain", "p")
    assert code == 0, err
    assert out.startswith("Pod ml/p:")


def test_nodes_name_the_pods_on_a_gpu_gone_bad_or_missing(
    cluster: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node agent republishes t4 after a reboot: the GPU of pod a unhealthy, that of
    pod b gone. The scheduler lists both pods in the status; `nodes` names them."""
    fake = cluster
    with scheduling(fake, (pod("a", {rn.GPU: 100}), "t4"), (pod("b", {rn.GPU: 100}), "t4")):
        status_written(fake, "t4", lambda s: s and sum(len(g["pods"]) for g in s["gpus"]) == 2)
        held = {
            p["name"]: g["uuid"]
            for g in fake.get("nodedevices", "t4")["status"]["allocation"]["gpus"]
            for p in g["pods"]
        }
        gpus = fake.get("nodedevices", "t4")["spec"]["gpus"]
        for g in gpus:
            if g["uuid"] == held["a"]:
                g["healthy"] = False
        gpus = [g for g in gpus if g["uuid"] != held["b"]]
        fake.patch("nodedevices", "t4", {"spec": {"gpus": gpus}})
        status_written(fake, "t4", lambda s: s and len(s.get("stranded") or []) == 2)
        rows = {r["node"]: r for r in run_json(capsys, "nodes", "--kubeconfig", kubeconfig)}
    t4 = rows["t4"]
    assert {(s["pod"], s["state"]) for s in t4["stranded"]} == {
        ("default/a", "unhealthy"),
        ("default/b", "missing"),
    }
    assert (t4["gpu_count"], t4["healthy_gpus"]) == (3, 2)
    assert "pods on unhealthy or missing devices: default/a (GPU " in t4["reason"]


LAYER_DOWN = {
    "layer": "mps",
    "up": False,
    "version": "",
    "commit": "",
    "reason": "the MPS control daemon is not running (no /tmp/nvidia-mps/control.pid)",
}
LAYER_UP = {
    "layer": "hami-core",
    "up": True,
    "version": "8f3a89c+tessera.2",
    "commit": "8f3a89c0",
    "reason": "",
}


def test_nodes_show_each_layer_and_why_a_node_takes_no_shares(
    fake: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for node, layer in (("down", LAYER_DOWN), ("up", LAYER_UP), ("old", None)):
        add_node(fake, node, "t4-4x")
        if layer is not None:
            fake.patch("nodedevices", node, {"spec": {"isolation": layer}})
    refusal = f"isolation layer mps is down: {LAYER_DOWN['reason']}"
    with scheduling(fake, (pod("w", {rn.GPU: 100}), "down")) as served:  # whole GPUs: placed
        status_written(fake, "down", lambda s: s and s["gpus"][0]["core"]["used"] == 100)
        # the scheduler's own words, in the NodeDevices status it writes
        status_written(fake, "down", lambda s: s["shareProblem"] == refusal)
        status_written(fake, "up", lambda s: s and s["isolation"] == LAYER_UP)
        assert "shareProblem" not in fake.get("nodedevices", "up")["status"]["allocation"]
        rows = {r["node"]: r for r in run_json(capsys, "nodes", "--kubeconfig", kubeconfig)}
        code, out, _ = run(capsys, "nodes", "--kubeconfig", kubeconfig)
        one_code, one, _ = run(capsys, "nodes", "down", "--kubeconfig", kubeconfig)
        (doc,) = [run_json(capsys, "nodes", "down", "--kubeconfig", kubeconfig)]
        up_code, up, _ = run(capsys, "nodes", "up", "--kubeconfig", kubeconfig)
        missing, _, err = run(capsys, "nodes", "nowhere", "--kubeconfig", kubeconfig)
        created = fake.create("pods", pod("s", share(30, 30)))
        reply = served.filter(created, ["down"])
        explained = run_json(capsys, "explain", "s", "--kubeconfig", kubeconfig)

    assert rows["down"]["state"] == "ready" and rows["down"]["layer"] == "mps down"
    assert rows["down"]["share_problem"] == refusal
    assert rows["down"]["reason"] == f"takes no GPU shares: {refusal}"
    assert rows["down"]["isolation"] == LAYER_DOWN
    assert rows["up"]["layer"] == "hami-core 8f3a89c+tessera.2" and rows["up"]["reason"] == ""
    assert rows["old"]["layer"] == "-" and rows["old"]["isolation"] is None
    lines = out.splitlines()
    header = lines[0].split()
    assert code == 0 and header[header.index("RDMA") + 1] == "LAYER"
    assert re.search(r"^down\s.*\bmps down\b.*takes no GPU shares: isolation layer mps", out, re.M)
    assert re.search(r"^old\s.*\s-\s", out, re.M)
    # one node: its row, then the layer in full and why it takes no share
    assert one_code == 0 and one.splitlines()[1].split()[0] == "down"
    assert f"Isolation layer: mps, down: {LAYER_DOWN['reason']}" in one
    assert f"Takes no new GPU shares: {refusal}" in one
    assert doc["node"] == "down" and doc["share_problem"] == refusal
    assert up_code == 0 and "Isolation layer: hami-core (version 8f3a89c+tessera.2, " in up
    assert "commit 8f3a89c0), up" in up and "Takes no new GPU shares" not in up
    assert missing == 1 and "no node nowhere" in err
    # explain gives the scheduler's own words for the node
    assert reply["FailedAndUnresolvableNodes"] == {"down": f"tessera: {refusal}"}
    (verdict,) = [v for v in explained["nodes"] if v["node"] == "down"]
    assert verdict["reason"] == f"{refusal} (waiting will not help)" and not verdict["fits"]
