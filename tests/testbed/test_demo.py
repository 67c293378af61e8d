"""The demo is the whole system in one run; check what it decided, not just that it ran."""

import io
import json
import re
from collections import defaultdict

import pytest

from tessera import resources as rn
from tessera_edge.topology_file import load_topology
from tessera_testbed import demo


def test_demo_places_enforces_and_refuses_for_the_right_reasons() -> None:
    out = io.StringIO()
    outcomes = {o.pod.name: o for o in demo.run(out, with_simulation=False)}
    text = out.getvalue()

    finetune = outcomes["llm-finetune"]
    assert finetune.node == "node-h100"
    assert finetune.record is not None
    main = finetune.record["containers"][0]
    assert len(main["gpus"]) == 4 and all(g["core"] == 100 for g in main["gpus"])
    # the RDMA VF is on a NIC under the same PCIe root as one of its GPUs
    h100 = load_topology("h100-sxm-8x")
    roots = {h100.gpus[g["index"]].pcie_root for g in main["gpus"]}
    nic = next(n for n in h100.nics if n.pci_bus_id == main["rdma"][0]["pciBusId"])
    assert nic.pcie_root in roots and len(main["rdma"][0]["vfs"]) == 1

    assert outcomes["inference"].node == "node-t4"
    pair = outcomes["trainer-pair"]
    assert pair.node and pair.record and len(pair.record["containers"][0]["gpus"]) == 2

    assert not outcomes["too-big"].node and "needs 16 whole GPUs" in outcomes["too-big"].problem
    assert "no GPU of model H200" in outcomes["wrong-model"].problem
    assert "not a multiple of 100" in outcomes["bad-request"].problem

    # no GPU is given more than it has, across every record
    used: defaultdict[tuple[str, str], int] = defaultdict(int)
    for o in outcomes.values():
        if o.record:
            for c in o.record["containers"]:
                if not c.get("reuses"):
                    for g in c.get("gpus", []):
                        used[(o.node, g["uuid"])] += g["core"]
    assert used and max(used.values()) <= 100

    # what the NRI hook injected is exactly what each record names
    for o in outcomes.values():
        if not o.record:
            assert not o.injected
            continue
        for c in o.record["containers"]:
            devices, env = o.injected[c["name"]]
            gpu_nodes = sorted(d for d in devices if d.removeprefix("/dev/nvidia").isdigit())
            assert gpu_nodes == sorted(f"/dev/nvidia{g['minor']}" for g in c.get("gpus", []))
            assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == [g["uuid"] for g in c["gpus"]]

    # every placed pod was admitted by the kubelet for each of its tessera resources
    for o in outcomes.values():
        if o.node:
            asked = sum(len(lim) for lim in o.pod.containers.values())
            assert len(o.admitted) == asked
    assert "8 of 11 pods placed" in text
    assert rn.ALLOCATION_ANNOTATION not in text  # the output explains, it does not dump JSON
    json.dumps([o.record for o in outcomes.values()])


def test_demo_shows_memory_in_one_unit_and_the_resources_as_views_of_the_same_gpus() -> None:
    out = io.StringIO()
    outcomes = {o.pod.name: o for o in demo.run(out, with_simulation=False)}
    text = out.getvalue()
    # one unit, one format: every memory figure is "<n>.<d> GiB"; no MiB, no HAMi "<n>m"
    assert "MiB" not in text and not re.search(r"\b\d+m\b", text)
    assert not re.search(r"(?<![\d.])\d+ ?GiB", text), re.findall(r"\S+ ?GiB", text)
    # the placement line and the injected limit show the same figure for each share
    for o in outcomes.values():
        for c in (o.record or {}).get("containers", []):
            for g in c.get("gpus", []):
                if g["core"] < 100:
                    shown = demo.gib(g["memoryMiB"])
                    assert f"GPU{g['index']} (" in text and shown in text
                    _, env = o.injected[c["name"]]
                    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{g['memoryMiB']}m"
    line = next(ln for ln in text.splitlines() if ln.startswith("  notebook-a/main"))
    record = outcomes["notebook-a"].record
    assert record is not None
    record_mib = record["containers"][0]["gpus"][0]["memoryMiB"]
    assert f"memory {demo.gib(record_mib)}," in line
    # the five resources are explained once, each by name, as one set of GPUs
    legend = text[text.index("not five pools") :]
    for resource in rn.TESSERA_RESOURCES:
        assert f"\n        {resource.removeprefix(rn.DOMAIN + '/')} " in legend
    assert "the same 8 GPUs" in legend


def test_demo_ui_keeps_the_cluster_busy_and_serves_the_page() -> None:
    """`make demo-ui`: more nodes, pods coming and going (some refused, with the condition
    kube-scheduler writes), and the page's URL printed; stopped after a few seconds here."""
    import threading
    import urllib.request

    out = io.StringIO()
    seen: dict[str, object] = {}

    def watch() -> None:
        # while it runs: the page and its data answer at the printed URL
        for _ in range(600):
            match = re.search(r"The allocation page: (http://\S+)", out.getvalue())
            if match:
                break
            threading.Event().wait(0.05)
        else:
            return
        url = match.group(1)
        threading.Event().wait(2.0)
        with urllib.request.urlopen(url, timeout=10) as page:
            seen["page"] = page.read()
        base = url.removesuffix("/debug/ui")
        with urllib.request.urlopen(base + "/debug/overview", timeout=10) as answer:
            seen["overview"] = json.loads(answer.read())

    watcher = threading.Thread(target=watch)
    watcher.start()
    demo.run(out, with_simulation=False, ui=demo.UiOptions(nodes=30, port=0, seconds=6))
    watcher.join()
    text = out.getvalue()
    made = int(re.search(r"(\d+) pods came while the page was served", text).group(1))  # type: ignore[union-attr]
    assert made >= 10
    assert b"tessera: GPU allocation" in seen["page"]  # type: ignore[operator]
    overview = seen["overview"]
    assert isinstance(overview, dict) and len(overview["nodes"]) == 33
    assert overview["pods"] > 0


def test_demo_shows_each_share_used_beside_its_grant() -> None:
    """Step 6: the node agents' usage loop reads the demo's workloads (fake NVML processes
    put on their containers by cgroup, on their grants by the verified records): each GPU
    share's line shows what its workload takes beside what its record grants."""
    out = io.StringIO()
    outcomes = {o.pod.name: o for o in demo.run(out, with_simulation=False)}
    text = out.getvalue()
    step = text[text.index("[6/6]") : text.index("GPU compute in use per node")]
    lines = [ln for ln in step.splitlines() if re.match(r"  [a-z0-9-]+/[a-z0-9-]+ ", ln)]
    expected = []
    for (pod, container), (memory, compute) in demo.WORKLOADS.items():
        o = outcomes[pod]
        assert o.record is not None
        (c,) = [c for c in o.record["containers"] if c["name"] == container]
        for g in c["gpus"]:
            if g["core"] == 100:
                continue  # whole GPUs are not listed
            used = demo.gib(int(g["memoryMiB"] * memory))
            share = (
                f"SM {round(g['core'] * compute)}% of its {g['core']}%"
                if g["core"]
                else "no compute share"
            )
            expected.append(
                f"{pod}/{container} {o.node} GPU{g['index']} memory {used} of "
                f"{demo.gib(g['memoryMiB'])}, {share}"
            )
    assert sorted(" ".join(ln.split()) for ln in lines) == sorted(expected)
    assert len(lines) >= 5


def test_demo_refuses_a_page_out_of_range_before_it_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--ui-nodes", "10001"], ["--ui-port", "65536"], ["--ui-nodes", "-1"]):
        with pytest.raises(SystemExit) as exited:
            demo.main(argv)
        assert exited.value.code == 2
        assert argv[0] in capsys.readouterr().err
