"""Whatever the API server hands back, the views print something and never raise."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kubectl_tessera import explain, nodes, pods
from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.record import Keyring, encode
from tessera.usage import (
    MAX_USAGE_BYTES,
    ContainerUsage,
    NodeUsage,
    UnattributedUsage,
    encode_usage,
)
from tests.kubectl.conftest import nodedevices

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
GOOD_NODE = nodedevices("n", "t4-4x")
RECORD = encode(
    PodAllocation(
        "uid-1",
        "default",
        "p",
        "n",
        (
            ContainerAllocation(
                "main", (GpuGrant(GOOD_NODE["spec"]["gpus"][0]["uuid"], 0, 0, 50, 1024),)
            ),
        ),
    ),
    Keyring.generate("k"),
)
GOOD_POD: dict[str, Any] = {
    "metadata": {
        "name": "p",
        "namespace": "default",
        "uid": "uid-1",
        "annotations": {rn.ALLOCATION_ANNOTATION: RECORD},
    },
    "spec": {"nodeName": "n", "containers": [{"name": "main"}]},
    "status": {"phase": "Running"},
}
PENDING: dict[str, Any] = {
    "metadata": {"name": "q", "namespace": "default", "uid": "uid-2"},
    "spec": {"containers": [{"name": "main", "resources": {"limits": {rn.GPU: "50"}}}]},
}
PATHS = [
    ("spec",),
    ("status",),
    ("metadata",),
    ("status", "allocation"),
    ("status", "allocation", "gpus"),
    ("spec", "gpus"),
    ("metadata", "name"),
]
POD_PATHS = [
    ("metadata",),
    ("metadata", "annotations"),
    ("spec",),
    ("spec", "nodeName"),
    ("status",),
    ("metadata", "annotations", rn.ALLOCATION_ANNOTATION),
    ("metadata", "creationTimestamp"),
]


def _replace(obj: Any, path: tuple[str, ...], value: Any) -> Any:
    result = copy.deepcopy(obj)
    target = result
    for key in path[:-1]:
        if not isinstance(target, dict):
            return result
        target = target.setdefault(key, {})
    if isinstance(target, dict):
        target[path[-1]] = value
    return result


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(PATHS), JSON, st.sampled_from(POD_PATHS), JSON, JSON)
def test_views_survive_any_field_of_any_type(
    path: tuple[str, ...],
    value: object,
    pod_path: tuple[str, ...],
    pod_value: object,
    lease_spec: object,
) -> None:
    node = _replace(GOOD_NODE, path, value)
    pod = _replace(GOOD_POD, pod_path, pod_value)
    lease = {"metadata": {"name": "tessera-node-n"}, "spec": lease_spec}
    labeled = _replace(
        {"metadata": {"name": "m", "labels": {"tessera.dev/node-agent": "true"}}},
        ("metadata", "labels"),
        pod_value,
    )
    for row in nodes.rows([node, GOOD_NODE], [lease], 1.7e9, node_objects=[labeled, node, pod]):
        row.cells()
    nodes.render_rows(nodes.rows([node], None, 1.7e9))
    pods.render_rows(pods.rows([pod, GOOD_POD]))
    result = explain.explain(
        PENDING, [node, GOOD_NODE], [pod, GOOD_POD], [lease], 1.7e9, policy=rn.DEFAULT_POLICY
    )
    explain.render_explanation(result)


def test_a_valid_record_counts_and_a_bound_pod_is_not_explained() -> None:
    result = explain.explain(
        PENDING
        | {"spec": {"containers": [{"name": "main", "resources": {"limits": {rn.GPU: "100"}}}]}},
        [GOOD_NODE],
        [GOOD_POD],
        [],
        1.7e9,
        policy=rn.DEFAULT_POLICY,
    )
    (verdict,) = result.nodes
    assert verdict.fits is False  # lease missing
    assert "Lease tessera-system/tessera-node-n is missing" in verdict.reason
    assert (
        "already bound"
        in explain.explain(GOOD_POD, [GOOD_NODE], [], None, 0.0, policy=rn.DEFAULT_POLICY).summary
    )


GPU0 = GOOD_NODE["spec"]["gpus"][0]["uuid"]
NAMES = st.sampled_from(["uid-1", "main", "other", GPU0, "GPU-x"])
CONTAINER_ROWS = st.builds(
    ContainerUsage,
    NAMES,
    st.just("default"),
    st.just("p"),
    NAMES,
    NAMES,
    st.integers(0, 1 << 20),
    st.none() | st.integers(0, 100),
)
OTHER_ROWS = st.builds(
    UnattributedUsage,
    st.sampled_from([GPU0, "GPU-x"]),
    st.sampled_from(["host", "other-pod", "mps-server"]),
    st.integers(0, 1 << 20),
    st.integers(0, 9),
)
READINGS = st.builds(
    NodeUsage,
    st.just("2026-01-01T00:00:00Z"),
    st.tuples(*[CONTAINER_ROWS] * 3),
    st.tuples(OTHER_ROWS),
)
USAGE_VALUES = st.one_of(
    READINGS.map(encode_usage),
    JSON,
    JSON.map(lambda v: json.dumps({"v": 1, "at": "t", "c": [v], "o": []})),
    st.just("x" * (MAX_USAGE_BYTES + 1)),
    st.text(max_size=16),
)


@settings(max_examples=100, deadline=None)
@given(USAGE_VALUES)
def test_any_usage_reading_prints_and_only_its_own_rows_land_beside_a_grant(value: Any) -> None:
    lease = {"metadata": {"name": "tessera-node-n", "annotations": {rn.USAGE_ANNOTATION: value}}}
    (row,) = pods.rows([GOOD_POD], [lease])
    pods.render_rows([row])
    (used,) = [g["used"] for g in row.gpus]
    assert bool(row.usage_observed) != bool(row.usage_unknown)
    (node,) = nodes.rows([GOOD_NODE], [lease], 1.7e9)
    nodes.render_rows([node])
    if row.usage_unknown:
        assert used is None and node.usage_unknown == row.usage_unknown
        assert node.unattributed == [] and node.unattributed_cell() == "-"
        return
    reading = json.loads(value)
    mine = [c for c in reading["c"] if c[0] == "uid-1" and c[3] == "main" and c[4] == GPU0]
    assert used is not None and used["memoryMiB"] == sum(c[5] for c in mine)
    assert len(node.unattributed) == len(reading["o"])
