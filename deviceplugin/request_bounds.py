"""What a kubelet request to the device plugin may hold, checked before any work is done.

The kubelet only ever sends IDs it read from this plugin's own ListAndWatch snapshots, one
container per call, each ID at most once. Anything else (an unknown or malformed ID, a
duplicate, more IDs than the resource has, several containers) is a confused or hostile
caller; it gets one `BadRequestError` naming what is wrong, which the server turns into gRPC
INVALID_ARGUMENT. Every check is linear in the request's size, and the cheap count bounds
run first, so a huge request is refused before its IDs are looked at.

The bounds (all derived from the advertising limits in units.py):
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

from deviceplugin.units import KUBELET_MAX_MESSAGE_BYTES, MAX_UNIT_ID_LENGTH, MAX_UNITS_PER_RESOURCE
from tessera.errors import InputError

MAX_CONTAINER_REQUESTS = 16
"""Container requests in one Allocate/GetPreferredAllocation call. The kubelet sends exactly
one (one container, one resource per call); the API allows a list, so a small margin."""
MAX_IDS_PER_LIST = MAX_UNITS_PER_RESOURCE
"""IDs in one list (devices_ids, available_deviceIDs, must_include_deviceIDs). Each ID is
named at most once and must be advertised, so no honest list is longer than the resource."""
MAX_IDS_PER_REQUEST = 2 * MAX_UNITS_PER_RESOURCE
"""IDs over every list of one call. The largest honest request is GetPreferredAllocation
offering every unit as available and again as must-include."""
MAX_ID_LENGTH = MAX_UNIT_ID_LENGTH
"""Characters of one ID: no advertised ID is longer (the API's documented Device.ID max)."""
MAX_RECEIVE_MESSAGE_BYTES = MAX_IDS_PER_REQUEST * (MAX_ID_LENGTH + 2) + 64 * 1024
"""gRPC refuses a larger request (RESOURCE_EXHAUSTED) before our code sees it: the largest
honest request is MAX_IDS_PER_REQUEST IDs of MAX_ID_LENGTH characters (+2 bytes of tag and
length each), plus room for the envelope. About 4.3 MB."""
MAX_SEND_MESSAGE_BYTES = KUBELET_MAX_MESSAGE_BYTES
"""Never send what the kubelet would refuse: its gRPC receive limit is the 4 MiB default."""
MAX_CONCURRENT_RPCS = 64
"""Calls a plugin server runs or queues at once; more get RESOURCE_EXHAUSTED. The kubelet
makes a handful at a time (one ListAndWatch stream plus the call of the pod being admitted);
the bound keeps a flood of calls from queueing without end."""
_SHOWN_ID_CHARS = 80
"""An ID quoted in an error is cut to this many characters, so errors stay small."""


class BadRequestError(InputError, ValueError):
    """A request the kubelet would never send; the message says what is wrong."""


def shown(unit: str) -> str:
    """An ID as quoted in an error: repr, cut short."""
    if len(unit) > _SHOWN_ID_CHARS:
        return repr(unit[:_SHOWN_ID_CHARS]) + f"... ({len(unit)} characters)"
    return repr(unit)


def check_container_count(count: int) -> None:
    if count == 0:
        raise BadRequestError("no container requests (the kubelet sends one per call)")
    if count > MAX_CONTAINER_REQUESTS:
        raise BadRequestError(
            f"{count} container requests; at most {MAX_CONTAINER_REQUESTS} "
            "(the kubelet sends one per call)"
        )


def check_total(count: int) -> None:
    if count > MAX_IDS_PER_REQUEST:
        raise BadRequestError(f"{count} device IDs in one call; at most {MAX_IDS_PER_REQUEST}")


def check_ids(what: str, ids: Sequence[str], known: Container[str]) -> None:
    """Every ID of one list: within the bounds, advertised, and named once. Linear."""
    if len(ids) > MAX_IDS_PER_LIST:
        raise BadRequestError(f"{what}: {len(ids)} device IDs; at most {MAX_IDS_PER_LIST}")
    seen: set[str] = set()
    for unit in ids:
        if unit not in known:
            if not unit:
                raise BadRequestError(f"{what}: an empty device ID")
            if len(unit) > MAX_ID_LENGTH:
                raise BadRequestError(
                    f"{what}: device ID {shown(unit)} is longer than {MAX_ID_LENGTH} characters"
                )
            raise BadRequestError(f"{what}: unknown device ID {shown(unit)} (never advertised)")
        if unit in seen:
            raise BadRequestError(f"{what}: device ID {shown(unit)} appears more than once")
        seen.add(unit)


def check_container_requests(
    requests: Sequence[Any], id_lists: Sequence[str], known: Container[str]
) -> None:
    """A call's container requests, cheapest bound first: how many there are, how many IDs
    all their `id_lists` (the fields that hold IDs, named in errors) hold together, then each
    of those lists (`check_ids`)."""
    check_container_count(len(requests))
    check_total(sum(len(getattr(creq, field)) for creq in requests for field in id_lists))
    for creq in requests:
        for field in id_lists:
            check_ids(field, getattr(creq, field), known)


def check_allocation_size(size: int) -> None:
    """Negative sizes are refused. A size above the available count is honest: the kubelet
    offers only its NUMA-aligned devices and fills the shortfall itself."""
    if size < 0:
        raise BadRequestError(f"allocation_size {size} is negative")


def check_subset(must_include: Sequence[str], available: Sequence[str]) -> None:
    """The kubelet always offers its must-include IDs among the available ones."""
    offered = set(available)
    for unit in must_include:
        if unit not in offered:
            raise BadRequestError(
                f"must-include device ID {shown(unit)} is not among the available"
            )
