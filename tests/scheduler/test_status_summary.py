"""The node totals `kubectl get nodedevices` prints, computed from the per-GPU summaries."""

from __future__ import annotations

from typing import Any

from scheduler_plugin.views.status_writer import mib_quantity, node_totals


def _gpu(used: int, mem_total: int, mem_used: int, healthy: bool = True) -> dict[str, Any]:
    return {
        "healthy": healthy,
        "core": {"total": 100, "used": used, "free": 100 - used},
        "memoryMiB": {"total": mem_total, "used": mem_used, "free": mem_total - mem_used},
    }


def test_totals_add_the_gpus_and_free_counts_only_healthy_ones() -> None:
    gpus = [
        _gpu(30, 81920, 24576),
        _gpu(100, 81920, 81920),
        _gpu(0, 81920, 0, healthy=False),  # its free part takes no pod
        _gpu(25, 40960, 10240 + 512),
    ]
    assert node_totals(gpus) == {
        "coreAllocated": 155,
        "coreFree": 70 + 0 + 75,
        "memoryAllocated": f"{24576 + 81920 + 10240 + 512}Mi",
        "memoryFree": f"{(81920 - 24576) + (40960 - 10752)}Mi",
    }


def test_an_empty_node_and_whole_gib() -> None:
    assert node_totals([]) == {
        "coreAllocated": 0,
        "coreFree": 0,
        "memoryAllocated": "0",
        "memoryFree": "0",
    }
    idle = node_totals([_gpu(0, 81920, 0), _gpu(0, 81920, 0)])
    assert idle["memoryFree"] == "160Gi" and idle["memoryAllocated"] == "0"


def test_quantities_parse_back_to_the_same_bytes() -> None:
    from tessera.quantity import parse_quantity

    for mib in (0, 1, 512, 1024, 1536, 81920, 81920 * 8 + 7):
        assert parse_quantity(mib_quantity(mib)) == mib * 2**20
