"""Whether a gang's `minResources` (its PodGroup's) exceed what is free, as scheduler-plugins'
coscheduling judges it before placing any member: per resource, summed over the nodes that
may take the gang's pods, against the amount the PodGroup names.

Only tessera's devices are counted here: `free_units` gives, for each tessera resource, the
units pods could still be given on the nodes passed (healthy devices only, each GPU counted
as the kubelet counts the resource on it). Resources tessera does not hold (cpu, memory,
pods, other extended resources) are kube-scheduler's to judge and are left out, so a
`minResources` naming only those never holds a gang here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from tessera import resources as rn
from tessera.gang.spec import MinResources
from tessera.node_state import NodeState


def free_units(nodes: Iterable[NodeState], *, nvidia_gpu: bool = False) -> dict[str, int]:
    """What `nodes` have free of each tessera resource, in the units a pod asks for it: per
    healthy GPU, `gpu` the share of both compute and memory still free, `gpu-core` its
    free compute, `gpu-memory-ratio` its free memory in percent, `gpu-memory` its free
    memory in the node's memory units (rounded down); per healthy RDMA NIC, `rdma` its free
    share; and with `nvidia_gpu` (the scheduler manages `nvidia.com/gpu`), GPUs with
    nothing allocated. Pass the nodes that take new pods."""
    totals = dict.fromkeys((rn.GPU, rn.GPU_CORE, rn.GPU_MEMORY_RATIO, rn.GPU_MEMORY, rn.RDMA), 0)
    whole = 0
    for node in nodes:
        unit = node.inventory.memory_unit_mib
        for gpu, core, mem, total in zip(
            node.inventory.gpus, node.free_core, node.free_mem, node.total_mem, strict=True
        ):
            if not gpu.healthy or total <= 0:
                continue
            ratio = mem * rn.UNITS_PER_DEVICE // total
            totals[rn.GPU] += min(core, ratio)
            totals[rn.GPU_CORE] += core
            totals[rn.GPU_MEMORY_RATIO] += ratio
            totals[rn.GPU_MEMORY] += mem // unit
            if core == rn.UNITS_PER_DEVICE and mem == total:
                whole += 1
        totals[rn.RDMA] += sum(
            free
            for nic, free in zip(node.inventory.nics, node.nic_free, strict=True)
            if nic.healthy
        )
    if nvidia_gpu:
        totals[rn.NVIDIA_GPU] = whole
    return totals


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
