"""The paper's arrival protocol and the figures computed from a run's records."""

from __future__ import annotations

import numpy as np

from tessera_sim import metrics
from tessera_sim.replay import INFLATION, RunResult, arrival_order
from tessera_sim.trace import TracePod


def pods(n: int = 40) -> list[TracePod]:
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(TracePod(f"p-{i:03d}", 4000, 1024, 1, 1000))
        elif kind == 1:
            out.append(TracePod(f"p-{i:03d}", 2000, 1024, 1, 500))
        elif kind == 2:
            out.append(TracePod(f"p-{i:03d}", 8000, 1024, 0, 0))
        else:
            out.append(TracePod(f"p-{i:03d}", 16000, 1024, 2, 1000))
    return out


def test_order_is_a_seeded_shuffle_of_the_sorted_trace_then_inflation() -> None:
    trace = pods()
    demand = sum(p.gpu_milli_total for p in trace)
    capacity = demand  # the trace asks for 100% of the GPUs
    first = arrival_order(list(reversed(trace)), 7, capacity)
    again = arrival_order(trace, 7, capacity)
    assert [p.name for p in first] == [p.name for p in again]  # input order does not matter
    other = arrival_order(trace, 8, capacity)
    assert [p.name for p in first] != [p.name for p in other]
    head = first[: len(trace)]
    assert sorted(p.name for p in head) == sorted(p.name for p in trace)
    tail = first[len(trace) :]
    assert tail and all("-tuned-" in p.name for p in tail)
    total = sum(p.gpu_milli_total for p in first)
    assert total <= INFLATION * capacity
    # the draw that stopped inflation would have passed 130%; the smallest GPU pod is 500
    assert total + 500 > INFLATION * capacity or total + 1000 > INFLATION * capacity


def test_a_trace_above_130_percent_loses_random_pods() -> None:
    trace = pods()
    demand = sum(p.gpu_milli_total for p in trace)
    order = arrival_order(trace, 1, capacity_milli=demand // 2)
    assert sum(p.gpu_milli_total for p in order) <= INFLATION * demand // 2
    assert len(order) < len(trace)


def run(arrived: list[int], allocated: list[int], capacity: int = 1000) -> RunResult:
    n = len(arrived)
    return RunResult(
        policy="x",
        seed=0,
        capacity_milli=capacity,
        arrived_milli=np.asarray(arrived, dtype=np.int64),
        allocated_milli=np.asarray(allocated, dtype=np.int64),
        frag_milli=np.asarray([10.0] * n),
        idle_milli=np.asarray([capacity - a for a in allocated], dtype=np.float64),
        placed=np.ones(n, dtype=np.bool_),
        seconds=0.0,
    )


def test_unallocated_at_averages_the_records_that_round_to_the_point() -> None:
    # arrived 99.4% -> 99, 99.6% and 100.4% -> 100, 101% -> 101
    r = run([994, 996, 1004, 1010], [900, 950, 930, 940])
    assert metrics.unallocated_at(r, 100) == 100 - (95.0 + 93.0) / 2
    assert metrics.unallocated_at(r, 99) == 100 - 90.0


def test_rounding_is_half_to_even_and_missing_points_use_neighbours() -> None:
    r = run([985, 1025], [900, 910])  # 98.5% rounds to 98, 102.5% to 102
    assert metrics.unallocated_at(r, 98) == 10.0
    assert metrics.unallocated_at(r, 102) == 100 - 91.0
    # 101 has none but 102 is a neighbour; nothing within 99..101 for 100: the last record
    # before 100% stands in (small clusters only); past the last record there is nothing
    assert metrics.unallocated_at(r, 101) == 100 - 91.0
    assert metrics.unallocated_at(r, 100) == 10.0
    assert np.isnan(metrics.unallocated_at(r, 120))


def test_fragmentation_rate_is_fragment_over_idle() -> None:
    r = run([800], [600])
    assert metrics.fragmentation_at(r, 80) == 100 * 10.0 / 400


def test_summary_mean_and_sd() -> None:
    runs = [run([1000], [950]), run([1000], [970])]
    s = metrics.summarize("p", "t", runs)
    assert tuple(s.unallocated_at_100) == (5.0, 3.0)
    assert s.unallocated_at_100.mean == 4.0 and abs(s.unallocated_at_100.sd - 2**0.5) < 1e-12
    doc = s.to_json()
    for key in ("policy", "trace", "seeds", "unallocated_gpu_pct_at_100_mean"):
        assert key in doc
    assert doc["unallocated_gpu_pct_at_100_sd"] == round(2**0.5, 4)
