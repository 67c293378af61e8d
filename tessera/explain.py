"""Why a pod fits nowhere: one verdict per node, and the nodes nearest to taking it.

Shared by `kubectl tessera explain` (which rebuilds the state from the API) and the
scheduler's allocation page (which reads its own): both evaluate the pod with the
`Decider`, name the nodes that take no tessera pods at all, and rank the others here.

"Nearest" is an estimate, said as such where it is shown: among the nodes where waiting
could help, those with the most of what the pod asks for still free, as a fraction of it
(whole GPUs free against whole GPUs wanted; for a share, its roomiest allowed GPU's free
compute and memory against the share), the scarcest container deciding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from tessera.cluster_decision import Evaluation, _share_need
from tessera.cluster_index import BoolArray, ClusterIndex, FloatArray, IntArray
from tessera.model import models_allow
from tessera.request import ContainerRequest, PodRequest
from tessera.resources import UNITS_PER_DEVICE
from tessera.scoring_policy import gpu_slots

CLOSED_PREFIX = "takes no tessera pods: "


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    fits: bool
    reason: str
    hopeless: bool = False
    """Waiting for pods to finish will not help (wrong model, too few GPUs)."""
    closed: bool = False
    """The node takes no tessera pods at all (`reason` says why)."""

    @property
    def text(self) -> str:
        """The reason as `kubectl tessera explain` prints it."""
        return self.reason + (" (waiting will not help)" if self.hopeless else "")


def describe(c: ContainerRequest) -> str:
    """One container's ask, in words (`main: GPU share: 30% compute, 25% memory`)."""
    parts = []
    if c.gpu_count:
        parts.append(f"{c.gpu_count} whole GPU{'s' if c.gpu_count > 1 else ''}")
    elif c.is_share:
        memory = f"{c.memory_ratio}% memory" if c.memory_ratio else f"{c.memory_units} memory units"
        parts.append(f"GPU share: {c.core}% compute, {memory}")
    if c.rdma_count:
        parts.append(f"{c.rdma_count} whole RDMA NIC{'s' if c.rdma_count > 1 else ''}")
    elif c.rdma_share:
        parts.append(f"{c.rdma_share}% of an RDMA NIC")
    kind = " (sidecar)" if c.sidecar else " (init)" if c.init else ""
    return f"{c.name}{kind}: {', '.join(parts)}"


def hints(request: PodRequest) -> list[str]:
    """The pod's placement hints, in words."""
    h = request.hints
    out = []
    if h.models:
        out.append(f"GPU model one of {', '.join(sorted(h.models))}")
    if h.uuids:
        out.append(f"GPU UUID one of {', '.join(sorted(h.uuids))}")
    if h.excluded_uuids:
        out.append(f"GPU UUIDs excluded: {', '.join(sorted(h.excluded_uuids))}")
    if h.topology is not None:
        out.append(f"topology {h.topology.name.lower()}")
    if h.rdma_affinity is not None:
        out.append(f"RDMA affinity {h.rdma_affinity.name.lower()}")
    if h.placement:
        out.append(f"placement policy {h.placement}")
    return out


def asks(request: PodRequest) -> list[str]:
    """What the pod asks for: each device-wanting container, then its hints."""
    return [describe(c) for c in request.containers] + hints(request)


def verdicts(
    evaluation: Evaluation, names: Iterable[str], closed: Mapping[str, str]
) -> list[NodeVerdict]:
    """One verdict per node of `names`, in that order: `closed` maps the nodes that take
    no tessera pods to why; the others are judged by `evaluation`."""
    out = []
    for name in names:
        why = closed.get(name)
        if why is not None:
            out.append(NodeVerdict(name, False, CLOSED_PREFIX + why, closed=True))
            continue
        nofit = evaluation.failures.get(name)
        if nofit is None:
            fits = name in evaluation.scores
            out.append(NodeVerdict(name, fits, "fits now" if fits else "not evaluated"))
        else:
            out.append(NodeVerdict(name, False, nofit.reason, nofit.unresolvable))
    return out


def nearest(
    found: Iterable[NodeVerdict], index: ClusterIndex, request: PodRequest, limit: int = 3
) -> list[tuple[NodeVerdict, float]]:
    """Up to `limit` nodes where the pod does not fit but waiting could help, nearest
    first, each with its closeness in [0, 1] (see the module doc); ties by name."""
    waiting = [
        v
        for v in found
        if not v.fits and not v.hopeless and not v.closed and v.node in index.row_of
    ]
    if not waiting or limit <= 0:
        return []
    rows = np.asarray([index.row_of[v.node] for v in waiting], dtype=np.int64)
    score = closeness(index, request, rows)
    order = sorted(range(len(waiting)), key=lambda i: (-score[i], waiting[i].node))[:limit]
    return [(waiting[i], float(score[i])) for i in order]


def closeness(index: ClusterIndex, request: PodRequest, rows: IntArray) -> FloatArray:
    """Per row: the fraction of the scarcest container's GPU ask that the node has free
    (1.0 for a pod that asks for no GPUs: the figure is about GPUs only)."""
    result: FloatArray = np.ones(rows.size, dtype=np.float64)
    allowed = _allowed(index, request, rows)
    for c in request.containers:
        if not c.wants_gpu or c.init:
            continue
        if c.gpu_count:
            whole = (
                allowed
                & (index.free_core[rows] == UNITS_PER_DEVICE)
                & (index.free_mem[rows] == index.total_mem[rows])
            )
            part = np.minimum(whole.sum(axis=1) / c.gpu_count, 1.0)
        else:
            need = _share_need(index, rows, c)
            core = (
                np.minimum(index.free_core[rows] / c.core, 1.0)
                if c.core
                else np.ones(need.shape, dtype=np.float64)
            )
            mem = np.minimum(index.free_mem[rows] / np.maximum(need, 1), 1.0)
            part = np.where(allowed, np.minimum(core, mem), 0.0).max(axis=1)
        result = np.minimum(result, part)
    return result


def _allowed(index: ClusterIndex, request: PodRequest, rows: IntArray) -> BoolArray:
    """Healthy GPU slots of a model the pod allows."""
    ok = gpu_slots(index, rows)
    wanted = request.hints.models
    if wanted:
        ids = [i for i, m in enumerate(index.models) if models_allow(wanted, m)]
        ok &= np.isin(index.model[rows], ids)
    return ok
