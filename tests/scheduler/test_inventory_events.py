"""NodeDevices events: one whose spec generation was already handled (a status write, such
as the scheduler's own summaries) is skipped before parsing; an inventory equal to the one
held changes nothing (no node marked changed); a new generation or a new object counts."""

from __future__ import annotations

from typing import Any

from scheduler_plugin.state.cache import Cache
from scheduler_plugin.watches.handlers import InventoryHandler
from tessera_testbed.inventory import inventory_spec


def nodedevices(gpus: int, generation: int | None, uid: str = "u1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "n", "uid": uid}
    if generation is not None:
        meta["generation"] = generation
    return {"metadata": meta, "spec": inventory_spec("n", gpus), "status": {"x": generation}}


def gpus_of(cache: Cache) -> int:
    return len([g for g in cache.snapshot().gpus if g.node == "n"])


def test_status_only_events_are_skipped_and_spec_changes_count() -> None:
    cache = Cache("binpack", require_heartbeat=False)
    changed: list[str] = []
    cache.subscribe(changed.append)
    handler = InventoryHandler(cache)
    handler.replace(iter([nodedevices(2, 1)]))
    assert gpus_of(cache) == 2 and changed
    changed.clear()

    handler.event("MODIFIED", nodedevices(2, 1))  # a status write: same generation
    assert handler.skipped == 1 and changed == []
    handler.event("MODIFIED", nodedevices(2, None))  # no generation: parsed, equal devices
    assert handler.skipped == 1 and changed == []
    handler.event("MODIFIED", nodedevices(4, 2))
    assert gpus_of(cache) == 4 and changed == ["n"]

    handler.event("MODIFIED", nodedevices(3, 2, uid="u2"))  # re-created: another object
    assert gpus_of(cache) == 3
    handler.event("DELETED", nodedevices(3, 2, uid="u2"))
    assert gpus_of(cache) == 0
    handler.event("ADDED", nodedevices(3, 2, uid="u2"))
    assert gpus_of(cache) == 3 and handler.skipped == 1


def test_a_relist_parses_everything_and_remembers_generations() -> None:
    cache = Cache("binpack", require_heartbeat=False)
    handler = InventoryHandler(cache)
    handler.replace(iter([nodedevices(2, 5)]))
    handler.replace(iter([nodedevices(3, 6)]))
    assert gpus_of(cache) == 3
    handler.event("MODIFIED", nodedevices(3, 6))
    assert handler.skipped == 1
    handler.replace(iter([]))
    assert gpus_of(cache) == 0
