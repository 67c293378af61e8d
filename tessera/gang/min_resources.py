"""Whether a gang's `minResources` (its PodGroup's) exceed what is free, as scheduler-plugins'
coscheduling judges it before placing any member: per resource, summed over the nodes that
may take the gang's pods, against the amount the PodGroup names.

Only tessera's devices are counted here: `free_units` gives, for each tessera resource, the
units pods could still be given on the nodes passed (healthy devices only, each GPU counted
as the kubelet counts the resource on it). Resources tessera does not hold (cpu, memory,
pods, other extended resources) are kube-scheduler's to judge and are left out, so a
`minResources` naming only those never holds a gang here.

`FreeTotals` keeps the same sums for a whole `ClusterState` as it changes, so that a gang's
question costs the nodes changed since the last one, not a pass over every node.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from decimal import Decimal
from typing import Final

from tessera import resources as rn
from tessera.cluster_state import ClusterState
from tessera.gang.spec import MinResources
from tessera.node_state import NodeState

COUNTED: Final = (rn.GPU, rn.GPU_CORE, rn.GPU_MEMORY_RATIO, rn.GPU_MEMORY, rn.RDMA, rn.NVIDIA_GPU)
"""The resources `free_units` counts, in the order of `node_units`."""

Units = tuple[int, int, int, int, int, int]
"""A node's free units of each of COUNTED, in that order."""


def node_units(node: NodeState) -> Units:
    """What one node has free of each of COUNTED (see `free_units`)."""
    gpu = core_sum = ratio_sum = memory = whole = 0
    unit = node.inventory.memory_unit_mib
    for device, core, mem, total in zip(
        node.inventory.gpus, node.free_core, node.free_mem, node.total_mem, strict=True
    ):
        if not device.healthy or total <= 0:
            continue
        ratio = mem * rn.UNITS_PER_DEVICE // total
        gpu += min(core, ratio)
        core_sum += core
        ratio_sum += ratio
        memory += mem // unit
        if core == rn.UNITS_PER_DEVICE and mem == total:
            whole += 1
    rdma = sum(
        free for nic, free in zip(node.inventory.nics, node.nic_free, strict=True) if nic.healthy
    )
    return (gpu, core_sum, ratio_sum, memory, rdma, whole)


def _named(totals: Iterable[int], nvidia_gpu: bool) -> dict[str, int]:
    named = dict(zip(COUNTED, totals, strict=True))
    if not nvidia_gpu:
        del named[rn.NVIDIA_GPU]
    return named


def free_units(nodes: Iterable[NodeState], *, nvidia_gpu: bool = False) -> dict[str, int]:
    """What `nodes` have free of each tessera resource, in the units a pod asks for it: per
    healthy GPU, `gpu` the share of both compute and memory still free, `gpu-core` its
    free compute, `gpu-memory-ratio` its free memory in percent, `gpu-memory` its free
    memory in the node's memory units (rounded down); per healthy RDMA NIC, `rdma` its free
    share; and with `nvidia_gpu` (the scheduler manages `nvidia.com/gpu`), GPUs with
    nothing allocated. Pass the nodes that take new pods."""
    totals = [0] * len(COUNTED)
    for node in nodes:
        for i, value in enumerate(node_units(node)):
            totals[i] += value
    return _named(totals, nvidia_gpu)


class FreeTotals:
    """`free_units` of every node of a ClusterState, summed and kept as the state changes.
    A changed node is only marked; its units are read again when a total is next asked
    for, so the state's hot paths pay a set insertion per change and a question pays for
    the nodes changed since the last one. Not thread-safe: the caller's lock covers it and
    the state."""

    __slots__ = ("_dirty", "_state", "_sum", "_units")

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._units: dict[str, Units] = {}
        self._sum = [0] * len(COUNTED)
        self._dirty: set[str] = set(state.nodes)
        state.subscribe(self._dirty.add)

    def _catch_up(self) -> None:
        nodes, total = self._state.nodes, self._sum
        for name in self._dirty:
            before = self._units.pop(name, None)
            if before is not None:
                for i, value in enumerate(before):
                    total[i] -= value
            node = nodes.get(name)
            if node is not None:
                units = self._units[name] = node_units(node)
                for i, value in enumerate(units):
                    total[i] += value
        self._dirty.clear()

    def totals(
        self,
        *,
        leave_out: Collection[str] = (),
        replaced: Mapping[str, NodeState] | None = None,
        nvidia_gpu: bool = False,
    ) -> dict[str, int]:
        """`free_units` of every node of the state but those in `leave_out` (nodes that take
        no pods), with the nodes in `replaced` counted as the states given there (trial
        copies: a gang's own members released, lower-priority pods gone)."""
        self._catch_up()
        total = list(self._sum)
        swapped = replaced or {}
        for name in {*leave_out, *swapped}:
            units = self._units.get(name)
            if units is not None:
                for i, value in enumerate(units):
                    total[i] -= value
        for name, node in swapped.items():
            if name not in leave_out:
                for i, value in enumerate(node_units(node)):
                    total[i] += value
        return _named(total, nvidia_gpu)


def judged(wanted: MinResources, *, nvidia_gpu: bool) -> MinResources:
    """The part of `wanted` tessera judges: `nvidia.com/gpu` only when the scheduler manages
    it (else it is the NVIDIA device plugin's, and kube-scheduler's to judge)."""
    if nvidia_gpu:
        return wanted
    return MinResources(tuple((n, a) for n, a in wanted.amounts if n != rn.NVIDIA_GPU))


def _amount(value: Decimal) -> str:
    return f"{value.normalize():f}"


def min_resources_gap(wanted: MinResources, free: Mapping[str, int]) -> str | None:
    """None when every resource `wanted` names that `free` counts is free in that amount;
    else why the gang waits, naming each resource short (`free` may add what the gang's
    own bound members hold, as coscheduling counts a gang's own pods as free to it):
    `minResources not free: tessera.dev/gpu 800 wanted, 300 free`."""
    short = [
        f"{name} {_amount(amount)} wanted, {free[name]} free"
        for name, amount in wanted.amounts
        if name in free and amount > free[name]
    ]
    if not short:
        return None
    return "minResources not free: " + "; ".join(short)
