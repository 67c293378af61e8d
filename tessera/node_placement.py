"""Fit and place a pod on one node: which exact GPUs and NICs each container gets.

Containers are placed one after another on scratch copies of the node's free vectors, the
largest first, so a failed pod changes nothing. When a pod does not fit, the result says
why in a short sentence that becomes the extender's per-node failure message, and whether
waiting could ever help (`unresolvable`).

A node whose isolation layer is reported down (tessera.isolation) takes no placement that
gives a GPU share (`GpuGrant.is_share`, as the NRI hook judges it); whole GPUs are placed
there as anywhere. The layer is judged on the placement itself, after the devices fit, so
a node short of room says so first, and an init container that runs on an app
container's whole GPU is no share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from math import comb

from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation, RdmaGrant, VfGrant
from tessera.isolation import share_refusal
from tessera.model import model_matches
from tessera.node_state import GpuCapacity, NodeState
from tessera.request import ContainerRequest, PodHints, PodRequest
from tessera.resources import UNITS_PER_DEVICE
from tessera.scoring_policy import Option, Policy
from tessera.topology import Tier, pci_tier

_FULL = UNITS_PER_DEVICE
_EXHAUSTIVE_LIMIT = 4096
"""Enumerate every whole-GPU set up to this many candidates (covers 16 GPUs choose 8 / 2)."""


@dataclass(frozen=True)
class NoFit:
    reason: str
    unresolvable: bool = False
    """True when no amount of waiting helps (wrong model, too few GPUs on the node, ...)."""


@dataclass(frozen=True)
class Placement:
    allocation: PodAllocation
    score: float
    """The policy's node score after the pod, in [0, 1]; higher is better."""


class _NoFitError(Exception):
    """Private control flow: unwinds a fit attempt to `place_pod`, which returns its
    `NoFit`; never leaves this module, so it stays outside the TesseraError tree."""

    def __init__(self, reason: str, unresolvable: bool = False) -> None:
        super().__init__(reason)
        self.nofit = NoFit(reason, unresolvable)


def _mib(value: int) -> str:
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value} MiB"


class _Attempt:
    """One attempt to place a pod on a node: the pod, the node, the policy, the GPU slots the
    pod may use, and mutable copies of the node's free vectors as devices are taken."""

    def __init__(
        self, node: NodeState, request: PodRequest, policy: Policy, slots: list[int]
    ) -> None:
        self.node = node
        self.request = request
        self.policy = policy
        self.slots = slots
        self.core = list(node.free_core)
        self.mem = list(node.free_mem)
        self.nic = list(node.nic_free)
        self.vf = [list(v) for v in node.vf_free]

    def gpu(self) -> GpuCapacity:
        """The GPU vectors as they stand now, as a value."""
        return GpuCapacity(tuple(self.core), tuple(self.mem))


def eligible_gpu_slots(node: NodeState, hints: PodHints) -> tuple[list[int], NoFit | None]:
    """Healthy GPUs the pod's hints allow; when there are none, the reason why."""
    gpus = node.inventory.gpus
    if not gpus:
        return [], NoFit("node has no GPUs", unresolvable=True)
    allowed = list(range(len(gpus)))
    if hints.models:
        allowed = [s for s in allowed if any(model_matches(gpus[s].model, m) for m in hints.models)]
        if not allowed:
            models = ", ".join(sorted({g.model for g in gpus}))
            wanted = ", ".join(sorted(hints.models))
            return [], NoFit(f"no GPU of model {wanted} (node has {models})", unresolvable=True)
    if hints.uuids:
        allowed = [s for s in allowed if gpus[s].uuid in hints.uuids]
    if hints.excluded_uuids:
        allowed = [s for s in allowed if gpus[s].uuid not in hints.excluded_uuids]
    if not allowed:
        return [], NoFit("no GPU allowed by the pod's GPU UUID hints", unresolvable=True)
    healthy = [s for s in allowed if gpus[s].healthy]
    if not healthy:
        return [], NoFit(f"all {len(allowed)} allowed GPUs are unhealthy")
    return healthy, None


def place_pod(
    node: NodeState, request: PodRequest, policy: Policy, scored: bool = True
) -> Placement | NoFit:
    """Decide whether and where the pod fits on `node` (nothing is changed).

    `scored=False` skips the policy's node score (the placement is the same; its `score`
    is then NaN), for callers that have chosen the node already."""
    if node.cpu_free is not None and request.cpu_milli > node.cpu_free:
        return NoFit(f"insufficient cpu ({request.cpu_milli}m wanted, {node.cpu_free}m free)")
    if node.mem_free is not None and request.memory_mib > node.mem_free:
        return NoFit(
            f"insufficient memory ({_mib(request.memory_mib)} wanted, {_mib(node.mem_free)} free)"
        )
    needs_gpu = any(c.wants_gpu for c in request.containers)
    slots: list[int] = []
    if needs_gpu:
        slots, problem = eligible_gpu_slots(node, request.hints)
        if problem is not None:
            return problem
    attempt = _Attempt(node, request, policy, slots)
    try:
        allocations = _place_containers(attempt)
    except _NoFitError as exc:
        return exc.nofit
    refusal = share_refusal(node.inventory.isolation)
    if refusal is not None and any(c.shares for c in allocations):
        # waiting for pods does not bring the layer back, nor does preempting them
        return NoFit(refusal, unresolvable=True)
    score = (
        policy.placement_score(node, request, node.gpu_free, attempt.gpu()) if scored else math.nan
    )
    alloc = PodAllocation(
        pod_uid=request.uid,
        namespace=request.namespace,
        name=request.name,
        node=node.name,
        containers=tuple(allocations),
        policy=policy.name,
        cpu_milli=request.cpu_milli,
        memory_mib=request.memory_mib,
    )
    return Placement(alloc, score)


def _order(containers: Sequence[ContainerRequest]) -> list[ContainerRequest]:
    """Running containers first (whole GPUs, then shares, largest first), init ones last."""

    def key(c: ContainerRequest) -> tuple[int, int, int, int]:
        runs = not c.init or c.sidecar
        return (
            0 if runs else 1,
            -c.gpu_count,
            -(c.core + c.memory_ratio + c.memory_units),
            -c.rdma_count,
        )

    return sorted(containers, key=key)


def _place_containers(a: _Attempt) -> list[ContainerAllocation]:
    node, request = a.node, a.request
    placed: dict[str, ContainerAllocation] = {}
    for c in _order(request.containers):
        if c.init and not c.sidecar:
            reused = _reuse(
                node,
                c,
                [
                    placed[x.name]
                    for x in request.containers
                    if x.name in placed and not (x.init and not x.sidecar)
                ],
            )
            if reused is not None:
                placed[c.name] = reused
                continue
        try:
            gpus = _place_gpus(a, c)
            rdma = _place_rdma(a, c, [g[0] for g in gpus])
        except _NoFitError as exc:
            if len(request.containers) > 1:
                raise _NoFitError(
                    f'container "{c.name}": {exc.nofit.reason}', exc.nofit.unresolvable
                ) from None
            raise
        placed[c.name] = ContainerAllocation(
            name=c.name,
            gpus=tuple(
                GpuGrant(
                    uuid=node.inventory.gpus[s].uuid,
                    index=node.inventory.gpus[s].index,
                    minor=node.inventory.gpus[s].minor,
                    core=core,
                    memory_mib=mem,
                )
                for s, core, mem in gpus
            ),
            rdma=tuple(rdma),
            init=c.init,
        )
    return [placed[c.name] for c in request.containers]


def _reuse(
    node: NodeState, c: ContainerRequest, apps: list[ContainerAllocation]
) -> ContainerAllocation | None:
    """An init container that fits inside an app container's devices runs on them."""
    unit = node.inventory.memory_unit_mib
    for app in apps:
        if c.wants_gpu:
            if c.gpu_count:
                if sum(1 for g in app.gpus if g.core == _FULL) < c.gpu_count:
                    continue
                gpus = tuple(g for g in app.gpus if g.core == _FULL)[: c.gpu_count]
            else:
                fitting = [
                    g
                    for g in app.gpus
                    if g.core >= c.core
                    and g.memory_mib
                    >= c.memory_mib_on(node.total_mem[node.inventory.gpu_slot(g.uuid) or 0], unit)
                ]
                if not fitting:
                    continue
                gpus = (fitting[0],)
        else:
            gpus = ()
        if c.wants_rdma:
            if c.rdma_count:
                whole = [r for r in app.rdma if r.share == _FULL]
                if len(whole) < c.rdma_count:
                    continue
                rdma = tuple(whole[: c.rdma_count])
            else:
                share = [r for r in app.rdma if r.share >= c.rdma_share]
                if not share:
                    continue
                rdma = (share[0],)
        else:
            rdma = ()
        return ContainerAllocation(name=c.name, gpus=gpus, rdma=rdma, init=True, reuses=app.name)
    return None


# --- GPUs -------------------------------------------------------------------------------------


def _place_gpus(a: _Attempt, c: ContainerRequest) -> list[tuple[int, int, int]]:
    """Chosen (slot, core, memory MiB) grants for one container, taken from `a`."""
    if not c.wants_gpu:
        return []
    if c.gpu_count:
        grants = [(s, _FULL, a.node.total_mem[s]) for s in _choose_whole(a, c.gpu_count)]
    else:
        grants = [_choose_share(a, c)]
    for s, core, mem in grants:
        a.core[s] -= core
        a.mem[s] -= mem
    return grants


def _choose_share(a: _Attempt, c: ContainerRequest) -> tuple[int, int, int]:
    node, request, policy = a.node, a.request, a.policy
    unit = node.inventory.memory_unit_mib
    seen: set[tuple[int, int, int]] = set()
    candidates: list[tuple[int, int]] = []
    for s in a.slots:
        need = c.memory_mib_on(node.total_mem[s], unit)
        if a.core[s] < c.core or a.mem[s] < need:
            continue
        signature = (a.core[s], a.mem[s], node.total_mem[s])
        if signature in seen:
            continue  # an identical GPU scored already; the lower slot wins ties
        seen.add(signature)
        candidates.append((s, need))
    if not candidates:
        raise _NoFitError(*_share_shortfall(a, c))
    if len(candidates) == 1 and not policy.option_score_draws:
        return candidates[0][0], c.core, candidates[0][1]  # nothing to compare
    best: tuple[float, int, int] | None = None
    free = a.gpu()
    for s, need in candidates:
        option = Option(
            (s,),
            (a.core[s] - c.core,),
            (a.mem[s] - need,),
            request.cpu_milli,
            request.memory_mib,
            request.hints.models,
        )
        score = policy.option_score(node, free, option)
        if best is None or score > best[0]:
            best = (score, s, need)
    assert best is not None
    return best[1], c.core, best[2]


def _share_shortfall(a: _Attempt, c: ContainerRequest) -> tuple[str, bool]:
    node, slots = a.node, a.slots
    unit = node.inventory.memory_unit_mib
    needs = {s: c.memory_mib_on(node.total_mem[s], unit) for s in slots}
    if all(needs[s] > node.total_mem[s] for s in slots):
        biggest = max(node.total_mem[s] for s in slots)
        return (
            f"needs {_mib(min(needs.values()))} of GPU memory; the largest GPU here has "
            f"{_mib(biggest)}",
            True,
        )
    roomiest = max(slots, key=lambda s: (a.core[s] >= c.core, a.mem[s], a.core[s]))
    want = f"{c.core}% compute and {_mib(needs[roomiest])}" if c.core else _mib(needs[roomiest])
    index = node.inventory.gpus[roomiest].index
    return (
        f"no GPU has {want} free (roomiest: GPU {index} with {a.core[roomiest]}% and "
        f"{_mib(a.mem[roomiest])})",
        False,
    )


def _candidate_sets(free: list[int], k: int, node: NodeState) -> list[tuple[int, ...]]:
    if comb(len(free), k) <= _EXHAUSTIVE_LIMIT:
        return list(combinations(free, k))
    # Large nodes: grow a set greedily from every seed, always adding the closest GPU.
    tiers = node.tiers
    sets = set()
    for seed in free:
        chosen = [seed]
        rest = [s for s in free if s != seed]
        while len(chosen) < k:
            nxt = min(
                rest,
                key=lambda s: (
                    max(tiers.tier[s][x] for x in chosen),
                    -sum(tiers.links[s][x] for x in chosen),
                    s,
                ),
            )
            chosen.append(nxt)
            rest.remove(nxt)
        sets.add(tuple(sorted(chosen)))
    return sorted(sets)


def _choose_whole(a: _Attempt, k: int) -> tuple[int, ...]:
    node, slots = a.node, a.slots
    if k > len(slots):
        return_reason = f"needs {k} whole GPUs; the node has {len(slots)} that the pod may use"
        raise _NoFitError(return_reason, unresolvable=not _could_recover(node, k, slots))
    free = [s for s in slots if a.core[s] == _FULL and a.mem[s] == node.total_mem[s]]
    if len(free) < k:
        raise _NoFitError(f"needs {k} whole GPUs, {len(free)} free")
    scope = a.request.hints.topology if k > 1 else None
    best: tuple[tuple[int, int, int, int], float, tuple[int, ...]] | None = None
    gpu_free = a.gpu()
    for candidate in _candidate_sets(free, k, node):
        rank = node.tiers.set_rank(candidate)
        if scope is not None and rank[0] > scope:
            continue
        score = a.policy.whole_set_score(node, gpu_free, candidate)
        if best is None or rank < best[0] or (rank == best[0] and score > best[1]):
            best = (rank, score, candidate)
    if best is None:
        assert scope is not None
        possible = any(node.tiers.set_rank(s)[0] <= scope for s in _candidate_sets(slots, k, node))
        return_reason = (
            f"no {k} free GPUs share {scope.name.lower()} (free: "
            f"{', '.join(str(node.inventory.gpus[s].index) for s in free)})"
        )
        if not possible:
            return_reason = f"no {k} GPUs of this node share {scope.name.lower()}"
        raise _NoFitError(return_reason, unresolvable=not possible)
    return best[2]


def _could_recover(node: NodeState, k: int, slots: list[int]) -> bool:
    """Whether unhealthy GPUs coming back could make room (else it is unresolvable)."""
    return k <= len(node.inventory.gpus) and len(slots) < len(node.inventory.gpus)


# --- RDMA -------------------------------------------------------------------------------------


def _place_rdma(a: _Attempt, c: ContainerRequest, gpu_slots: list[int]) -> list[RdmaGrant]:
    """The RDMA grants of one container near its GPUs (`gpu_slots`), taken from `a`."""
    if not c.wants_rdma:
        return []
    node = a.node
    nics = node.inventory.nics
    if not nics:
        raise _NoFitError("node has no RDMA NICs", unresolvable=True)
    gpus = [node.inventory.gpus[s] for s in gpu_slots]

    def tier(i: int) -> Tier:
        return min((pci_tier(nics[i], g) for g in gpus), default=Tier.NODE)

    limit = a.request.hints.rdma_affinity if gpus else None
    candidates = [i for i in range(len(nics)) if nics[i].healthy]
    if limit is not None:
        near = [i for i in candidates if tier(i) <= limit]
        if not near:
            scope = "PCIe" if limit <= Tier.PCIE_ROOT else "NUMA node"
            raise _NoFitError(f"no healthy RDMA NIC shares a {scope} with the chosen GPUs")
        candidates = near
    want = c.rdma_share or _FULL
    count = c.rdma_count or 1

    def usable(i: int) -> bool:
        if want == _FULL:
            return a.nic[i] == _FULL and all(a.vf[i])
        has_vf = not a.vf[i] or any(a.vf[i])
        return a.nic[i] >= want and has_vf

    usable_nics = [i for i in candidates if usable(i)]
    if len(usable_nics) < count:
        what = f"{count} whole RDMA NICs" if c.rdma_count else f"{want}% of an RDMA NIC"
        return_reason = (
            f"needs {what}; {len(usable_nics)} of {len(candidates)} suitable NICs have room"
        )
        raise _NoFitError(return_reason)
    direction = 1 if a.policy.pack_nics else -1
    usable_nics.sort(key=lambda i: (tier(i), direction * a.nic[i], i))
    grants = []
    for i in usable_nics[:count]:
        nic = nics[i]
        vfs: tuple[VfGrant, ...] = ()
        if want < _FULL and a.vf[i]:
            j = a.vf[i].index(True)
            a.vf[i][j] = False
            vfs = (nic.vfs[j],)
        elif want == _FULL:
            a.vf[i] = [False] * len(a.vf[i])
        a.nic[i] -= want
        grants.append(RdmaGrant(nic.pci_bus_id, nic.ibdev, nic.uverbs_minor, want, vfs, nic.netdev))
    return grants
