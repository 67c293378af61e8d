"""Build a placement policy by name, with options (the live scheduler's entry point).

`tessera.policy.POLICIES` maps every built-in policy name to its class; this adds the
options and a readable error for an unknown name.
"""

from __future__ import annotations

from typing import Any

from tessera.policy import POLICIES, Policy
from tessera.resources import DEFAULT_POLICY


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
    """One instance of every registered policy, e.g. for `Decider(state, make_policies(),
    DEFAULT_POLICY)`; keyword arguments give per-policy options."""
    return {name: make_policy(name, **options_by_name.get(name, {})) for name in POLICIES}
