"""tessera-sim on small CSV files, and the synthetic workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera_sim import cli
from tessera_sim.runner import parse_seeds, policy_names
from tessera_sim.synthetic import run_synthetic, synthetic_trace


def write_trace(tmp_path: Path) -> tuple[Path, Path]:
    trace = synthetic_trace(nodes=12)
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(
            f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpus},{n.model}\n" for n in trace.nodes
        )
    )
    pods = tmp_path / "openb_pod_list_tiny.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        + "".join(
            f"{p.name},{p.cpu_milli},{p.memory_mib},{p.num_gpu},{p.gpu_milli},\n"
            for p in trace.pods
        )
    )
    return nodes, pods


def test_json_output_has_the_promised_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path)
    code = cli.main(
        [
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--policy",
            "fgd,fragmentation",
            "--seeds",
            "1-2",
            "--json",
        ]
    )
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [d["policy"] for d in lines] == ["fgd", "fragmentation"]
    for d in lines:
        assert d["trace"] == "tiny" and d["seeds"] == [1, 2]
        assert 0 <= d["unallocated_gpu_pct_at_100_mean"] <= 100
        assert d["unallocated_gpu_pct_at_100_sd"] >= 0
        assert len(d["curve_arrived_pct"]) == len(d["curve_unallocated_gpu_pct_mean"])


def test_default_policy_and_table_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path)
    assert cli.main(["--nodes", str(nodes), "--pods", str(pods), "--seeds", "3"]) == 0
    out = capsys.readouterr().out
    assert "fragmentation" in out and "unallocated" in out


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    with pytest.raises(SystemExit):
        cli.main(["--nodes", str(nodes), "--pods", str(pods), "--policy", "nope"])
    assert "unknown policy" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--nodes", str(nodes), "--pods", str(pods), "--seeds", "9-3"])
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,abc,1,0,0\n")
    assert cli.main(["--nodes", str(nodes), "--pods", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and "cpu_milli" in err


def test_help_lists_the_policies(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for name in ("random", "dotprod", "bestfit", "fgd", "fragmentation"):
        assert name in out
    assert set(policy_names()) >= {"random", "dotprod", "bestfit", "fgd", "fragmentation"}


def test_seed_syntax() -> None:
    assert parse_seeds("42-44") == (42, 43, 44)
    assert parse_seeds("1,5,2-3") == (1, 5, 2, 3)
    with pytest.raises(ValueError):
        parse_seeds("")


def test_synthetic_run_compares_policies() -> None:
    summaries = run_synthetic(("random", "fragmentation"), seed=1, seeds=2, nodes=16)
    assert [s.policy for s in summaries] == ["random", "fragmentation"]
    for s in summaries:
        assert len(s.unallocated_at_100) == 2 and all(0 <= v <= 100 for v in s.unallocated_at_100)
