"""Kubernetes resource quantities, parsed without the Kubernetes client (the core does no I/O).

Only what pod specs carry: decimal and binary suffixes, milli, and exponents.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def parse_quantity(value: object) -> Decimal:
    """Parse "100m", "2", "1.5Gi", 3, ... into a Decimal; ValueError when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise ValueError(f"not a quantity: {value!r}")
    match = _QUANTITY.match(value.strip())
    if not match:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        return Decimal(number) * _SUFFIXES[suffix]
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None


def cpu_millis(value: object) -> int:
    """CPU quantity in millicores, rounded up as Kubernetes does."""
    q = parse_quantity(value) * 1000
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def memory_mib(value: object) -> int:
    """Memory quantity in MiB, rounded up."""
    q = parse_quantity(value) / (2**20)
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def whole_count(value: object) -> int:
    """An extended-resource count: a non-negative whole number, else ValueError."""
    q = parse_quantity(value)
    if q != q.to_integral_value() or q < 0:
        raise ValueError(f"must be a non-negative whole number, got {value!r}")
    return int(q)
