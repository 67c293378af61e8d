"""Trace variants: model-limited GPU pods (the paper's gpuspec) and CPU-heavy workloads."""

from __future__ import annotations

import pytest

from tessera_sim.synthetic import synthetic_trace
from tessera_sim.variants import MODEL_SETS, constrain_models, cpu_heavy, feasible


def test_a_share_of_gpu_pods_gets_a_feasible_allow_list_from_the_production_mix() -> None:
    trace = synthetic_trace(nodes=40, seed=2)
    gpu = [p for p in trace.pods if p.num_gpu]
    for share in (0.1, 0.33):
        out = constrain_models(trace.pods, trace.nodes, share)
        assert [p.name for p in out] == [p.name for p in trace.pods]
        limited = [p for p in out if p.gpu_spec]
        assert abs(len(limited) - share * len(gpu)) <= 1
        sets = {s for s, _ in MODEL_SETS}
        for p in limited:
            assert p.num_gpu and p.gpu_spec in sets and feasible(p, p.gpu_spec, trace.nodes)
        # everything but the allow-list is the trace's own
        for a, b in zip(trace.pods, out, strict=True):
            assert (a.cpu_milli, a.num_gpu, a.gpu_milli) == (b.cpu_milli, b.num_gpu, b.gpu_milli)
    assert constrain_models(trace.pods, trace.nodes, 0.2) == constrain_models(
        trace.pods, trace.nodes, 0.2
    )
    with pytest.raises(ValueError):
        constrain_models(trace.pods, trace.nodes, 1.5)


def test_cpu_heavy_scales_the_cpu_only_pods_and_keeps_the_gpu_pods() -> None:
    trace = synthetic_trace(nodes=40, seed=2)
    host = sum(p.cpu_milli for p in trace.pods if not p.num_gpu)
    for factor in (0.5, 2.5):
        out = cpu_heavy(trace.pods, factor)
        assert [p for p in out if p.num_gpu] == [p for p in trace.pods if p.num_gpu]
        got = sum(p.cpu_milli for p in out if not p.num_gpu)
        biggest = max(p.cpu_milli for p in trace.pods if not p.num_gpu)
        assert factor * host <= got < factor * host + biggest
        assert len({p.name for p in out}) == len(out)
