"""Every built-in placement policy by name, and building one with options.

The live scheduler, the simulator and the demo pick policies from here; the names are
those of `tessera.resources.PLACEMENT_POLICIES`.
"""

from __future__ import annotations

from typing import Any

from tessera.fragmentation import FragmentationPolicy
from tessera.resources import DEFAULT_POLICY
from tessera.scoring_policy import BinpackPolicy, Policy, SpreadPolicy

POLICIES: dict[str, type[Policy]] = {
    BinpackPolicy.name: BinpackPolicy,
    SpreadPolicy.name: SpreadPolicy,
    FragmentationPolicy.name: FragmentationPolicy,
}


def make_policy(name: str = DEFAULT_POLICY, **options: Any) -> Policy:
    """A new policy instance; `options` go to its constructor (e.g. `pack=0.2` for
    fragmentation). Raises ValueError for an unknown name or option."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown placement policy {name!r} (one of {', '.join(POLICIES)})")
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"policy {name!r}: {exc}") from None


def make_policies(**options_by_name: dict[str, Any]) -> dict[str, Policy]:
    """One instance of every built-in policy, e.g. for `Decider(state, make_policies(),
    DEFAULT_POLICY)`; keyword arguments give per-policy options."""
    return {name: make_policy(name, **options_by_name.get(name, {})) for name in POLICIES}
