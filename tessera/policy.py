"""Placement policies: which GPUs inside a node, and how good a node is.

A policy answers two questions with plain numbers, so placement stays policy-agnostic:
- `option_score`: among ways to place one container on a node, which is best (higher wins);
- `node_score`: how good the node is after the whole pod is placed, in [0, 1].

The free vectors passed in are scratch copies (placement tries options before committing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera.node_state import NodeState
from tessera.resources import POLICY_BINPACK, POLICY_SPREAD, UNITS_PER_DEVICE


@dataclass(frozen=True)
class Option:
    """A way to place one container's GPUs: slots touched and their free amounts after."""

    slots: tuple[int, ...]
    core_after: tuple[int, ...]
    mem_after: tuple[int, ...]


class Policy:
    """Base policy; subclasses override the two scores."""

    name = "base"
    pack_nics = True
    """Whether NICs are packed (least free remaining first) or spread."""

    def option_score(
        self, node: NodeState, core: Sequence[int], mem: Sequence[int], option: Option
    ) -> float:
        raise NotImplementedError

    def node_score(
        self,
        node: NodeState,
        core_before: Sequence[int],
        mem_before: Sequence[int],
        core_after: Sequence[int],
        mem_after: Sequence[int],
    ) -> float:
        raise NotImplementedError

    def whole_set_score(self, node: NodeState, core: Sequence[int], slots: Sequence[int]) -> float:
        """Among whole-GPU sets with equal interconnect rank, which is best (higher wins)."""
        return 0.0


def utilization(node: NodeState, core: Sequence[int], mem: Sequence[int]) -> float:
    """Share of a node's GPU capacity in use, compute and memory averaged, in [0, 1]."""
    if not node.total_mem:
        return 0.0
    n = len(core)
    core_used = (UNITS_PER_DEVICE * n - sum(core)) / (UNITS_PER_DEVICE * n)
    total_mem = sum(node.total_mem)
    mem_used = (total_mem - sum(mem)) / total_mem if total_mem else 0.0
    return (core_used + mem_used) / 2


def _remaining(node: NodeState, option: Option) -> float:
    """Free fraction left on the touched GPUs after the option, averaged."""
    total = 0.0
    for slot, core, mem in zip(option.slots, option.core_after, option.mem_after, strict=True):
        total += core / UNITS_PER_DEVICE + mem / node.total_mem[slot]
    return total / (2 * len(option.slots)) if option.slots else 0.0


def _busy_neighbours(node: NodeState, core: Sequence[int], slots: Sequence[int]) -> int:
    """How many GPUs already in use share a PCIe switch or NUMA node with the chosen ones."""
    tiers = node.tiers
    chosen = set(slots)
    busy = [s for s in range(len(core)) if s not in chosen and core[s] < UNITS_PER_DEVICE]
    return sum(1 for s in slots for b in busy if tiers.tier[s][b] <= 3)


class BinpackPolicy(Policy):
    """Fill the fullest nodes and the fullest GPUs first (best fit)."""

    name = POLICY_BINPACK
    pack_nics = True

    def option_score(
        self, node: NodeState, core: Sequence[int], mem: Sequence[int], option: Option
    ) -> float:
        return -_remaining(node, option)

    def node_score(
        self,
        node: NodeState,
        core_before: Sequence[int],
        mem_before: Sequence[int],
        core_after: Sequence[int],
        mem_after: Sequence[int],
    ) -> float:
        return utilization(node, core_after, mem_after)

    def whole_set_score(self, node: NodeState, core: Sequence[int], slots: Sequence[int]) -> float:
        return float(_busy_neighbours(node, core, slots))


class SpreadPolicy(Policy):
    """Use the emptiest nodes and GPUs first, for isolation from noisy neighbours."""

    name = POLICY_SPREAD
    pack_nics = False

    def option_score(
        self, node: NodeState, core: Sequence[int], mem: Sequence[int], option: Option
    ) -> float:
        return _remaining(node, option)

    def node_score(
        self,
        node: NodeState,
        core_before: Sequence[int],
        mem_before: Sequence[int],
        core_after: Sequence[int],
        mem_after: Sequence[int],
    ) -> float:
        return 1.0 - utilization(node, core_after, mem_after)

    def whole_set_score(self, node: NodeState, core: Sequence[int], slots: Sequence[int]) -> float:
        return -float(_busy_neighbours(node, core, slots))
