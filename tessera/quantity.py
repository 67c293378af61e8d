"""Kubernetes resource quantities, parsed without the Kubernetes client (the core does no I/O).

Only what pod specs carry: decimal and binary suffixes, milli, and exponents. Pod authors
write these strings, so every quantity is bounded before any arithmetic: a short string
such as "1e999999" must be refused, never turned into a million-digit number.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

from tessera.errors import InputError

MAX_QUANTITY_CHARS: Final = 64
"""Characters in a quantity string. The largest meaningful value (int64, 19 digits) with a
fraction, an exponent and a suffix fits in about 40; longer strings are refused before the
regular expression looks at them."""
MAX_QUANTITY_DIGITS: Final = 30
"""Significant digits of the number part: int64 needs 19 and Kubernetes keeps at most
milli (3 decimal places) of precision, so 30 leaves room and bounds the arithmetic."""
MAX_QUANTITY_EXPONENT: Final = 30
"""Largest |exponent| in "1e30": the largest suffix, E, is 10^18 and int64 stops near 10^19,
so a bigger exponent can only name a value no resource has (or one that rounds to 0)."""
MAX_QUANTITY: Final = Decimal(2**63 - 1)
"""Largest quantity accepted: Kubernetes keeps quantities as int64 where it can, and the
scheduler's columns are int64."""

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    # decimal k M G T P E = 10^3 .. 10^18; binary Ki Mi .. Ei = 2^10 .. 2^60
    **{p: Decimal(10) ** (3 * n) for n, p in enumerate("kMGTPE", 1)},
    **{p + "i": Decimal(2) ** (10 * n) for n, p in enumerate("KMGTPE", 1)},
}
_QUANTITY = re.compile(
    r"^([+-]?)([0-9]*\.?[0-9]*)(?:[eE]([+-]?[0-9]+))?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
)


class QuantityError(InputError, ValueError):
    """A value is not a quantity, or one outside the bounds above (a ValueError too)."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_quantity(value: object) -> Decimal:
    """Parse "100m", "2", "1.5Gi", 3, ... into a Decimal; QuantityError when it is not one."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        if abs(value) > MAX_QUANTITY:
            raise QuantityError(f"quantity {_show(value)} is above {MAX_QUANTITY}")
        return Decimal(value)
    if isinstance(value, float):
        value = repr(value)  # inf and nan fall through to the string checks and fail there
    if not isinstance(value, str):
        raise QuantityError(f"not a quantity: {_show(value)}")
    text = value.strip()
    if len(text) > MAX_QUANTITY_CHARS:
        raise QuantityError(
            f"quantity of {len(text)} characters (at most {MAX_QUANTITY_CHARS}): {_show(value)}"
        )
    match = _QUANTITY.match(text)
    if not match or not any(ch.isdigit() for ch in match.group(2)):
        raise QuantityError(f"not a quantity: {_show(value)}")
    sign, number, exponent, suffix = match.group(1), match.group(2), match.group(3), match.group(4)
    digits = number.replace(".", "").lstrip("0")
    if len(digits) > MAX_QUANTITY_DIGITS:
        raise QuantityError(f"quantity {_show(value)} has more than {MAX_QUANTITY_DIGITS} digits")
    if exponent is not None and abs(int(exponent)) > MAX_QUANTITY_EXPONENT:
        raise QuantityError(
            f"quantity {_show(value)} has an exponent beyond +-{MAX_QUANTITY_EXPONENT}"
        )
    try:
        result = Decimal(f"{sign}{number}e{exponent or 0}") * _SUFFIXES[suffix or ""]
    except InvalidOperation:
        raise QuantityError(f"not a quantity: {_show(value)}") from None
    if abs(result) > MAX_QUANTITY:
        raise QuantityError(f"quantity {_show(value)} is above {MAX_QUANTITY}")
    return result


def _whole(q: Decimal, value: object, unit: str) -> int:
    result = int(q.to_integral_value(rounding="ROUND_CEILING"))
    if abs(result) > MAX_QUANTITY:
        raise QuantityError(f"quantity {_show(value)} is above {MAX_QUANTITY} {unit}")
    return result


def cpu_millis(value: object) -> int:
    """CPU quantity in millicores, rounded up as Kubernetes does."""
    return _whole(parse_quantity(value) * 1000, value, "millicores")


def memory_mib(value: object) -> int:
    """Memory quantity in MiB, rounded up."""
    return _whole(parse_quantity(value) / (2**20), value, "MiB")


def whole_count(value: object) -> int:
    """An extended-resource count: a non-negative whole number, else QuantityError."""
    q = parse_quantity(value)
    if q != q.to_integral_value() or q < 0:
        raise QuantityError(f"must be a non-negative whole number, got {_show(value)}")
    return int(q)
