"""HAMi-core's SM limiter, its own C code run against a simulated GPU (harness.py): tessera's
patched limiter holds a share near its value on 46 to 188 SMs, for tiled and persistent
kernels and for CUDA graphs, where the pinned one does not."""

from __future__ import annotations

import pytest

from tests.hami_core import harness

pytestmark = pytest.mark.skipif(
    not harness.built(),
    reason="no HAMi-core source built here (make hami-core HAMI_CORE_SRC=...): limiter not run",
)

SLACK = 0.10
"""As the GPU check's compute rows: a share may run up to 10 points over its value."""
TILED, PERSISTENT, GRAPH = harness.WORKLOADS


@pytest.mark.parametrize("sms", harness.SM_COUNTS)
@pytest.mark.parametrize("workload", harness.WORKLOADS, ids=lambda w: w.name.split()[0])
@pytest.mark.parametrize("limit", [20, 30, 50])
def test_the_patched_limiter_settles_near_the_share(
    workload: harness.Workload, sms: int, limit: int
) -> None:
    seen = harness.run("patched", workload, sms, limit)
    assert abs(float(str(seen["ratio"])) - limit / 100) <= SLACK, seen


@pytest.mark.parametrize("sms", harness.SM_COUNTS)
@pytest.mark.parametrize("workload", [TILED, PERSISTENT], ids=["tiled", "persistent"])
def test_the_pinned_limiter_lets_a_30_percent_share_run_far_over_it(
    workload: harness.Workload, sms: int
) -> None:
    seen = harness.run("pinned", workload, sms, 30)
    assert float(str(seen["ratio"])) > 0.30 + SLACK, seen


@pytest.mark.parametrize("sms", harness.SM_COUNTS)
def test_the_pinned_source_does_not_throttle_graph_launches(sms: int) -> None:
    seen = harness.run("pinned", GRAPH, sms, 30)
    assert float(str(seen["ratio"])) > 0.95, seen
