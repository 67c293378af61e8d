"""JSON from untrusted writers, parsed within stated bounds, failing with one typed error.

The stdlib decoder raises RecursionError on deep nesting, ValueError on over-long integers
and accepts NaN/Infinity; callers that face pod authors, node agents or the network must
never see those. `loads` turns every way a document can be bad into JsonLimitError.
"""

from __future__ import annotations

import json
from typing import Any, Final

from tessera.errors import InputError

MAX_INT_DIGITS: Final = 20
"""Digits in a JSON integer. 20 holds every uint64 (18446744073709551615); nothing tessera
reads needs more, and refusing early avoids building huge integers."""
MAX_FLOAT_CHARS: Final = 40
"""Characters in a JSON number with a fraction or exponent (17 significant digits, sign,
point and a 3-digit exponent fit with room to spare)."""


class JsonLimitError(InputError, ValueError):
    """A JSON document is malformed or outside the bounds its reader accepts."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer with {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_FLOAT_CHARS:
        raise ValueError(f"number of {len(text)} characters (at most {MAX_FLOAT_CHARS})")
    return float(text)


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


_DECODER: Final = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)
"""One decoder for every call (json.loads with these hooks builds a new one each time)."""


def loads(raw: bytes | str, *, what: str, max_bytes: int, max_depth: int | None = None) -> Any:
    """Parse `raw` (at most `max_bytes`, nested at most `max_depth` deep when given)."""
    # surrogatepass: a lone surrogate (a JSON string's "\ud800", once decoded) is counted,
    # not an encoding error that would escape as something else than JsonLimitError
    size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise JsonLimitError(what, f"{size} bytes, over the {max_bytes}-byte limit")
    try:
        # as json.loads reads bytes: UTF-8, -16 or -32 told by the first bytes
        text = (
            raw if isinstance(raw, str) else raw.decode(json.detect_encoding(raw), "surrogatepass")
        )
        doc = _DECODER.decode(text)
    except RecursionError:
        raise JsonLimitError(what, "nested too deeply") from None
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        raise JsonLimitError(what, f"not valid JSON: {exc}") from None
    if max_depth is not None and _may_nest_deeper(text, max_depth):
        check_depth(doc, max_depth, what)
    return doc


def _may_nest_deeper(text: str, max_depth: int) -> bool:
    """False when the text's brackets alone show it nests at most `max_depth` deep (the
    usual body: no walk of the parsed document needed).

    Every container adds one level to a path through it, and only a path's last container
    can be empty, so the depth is at most the opening brackets plus one, less those that
    open an empty `{}` or `[]`: a Pod's managedFields are mostly such pairs. Brackets
    inside strings are counted too, and a `{}` or `[]` inside a string takes away no more
    than the `{` or `[` it added (neither pair can straddle a string's edge: a quote would
    lie between), so the bound is never below the real depth."""
    opening = text.count("[") + text.count("{")
    return opening > max_depth and opening - text.count("{}") - text.count("[]") >= max_depth


def check_depth(doc: Any, max_depth: int, what: str) -> None:
    """Raise JsonLimitError when containers nest deeper than `max_depth` (iterative).

    Level by level; a container whose children hold no container (e.g. thousands of node
    names) is passed over with one C-level look at their types, not a step per child."""
    level: list[Any] = [doc] if type(doc) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            raise JsonLimitError(what, f"nested deeper than {max_depth} levels")
        below: list[Any] = []
        for node in level:
            children = node.values() if type(node) is dict else node
            if not _CONTAINERS.isdisjoint(map(type, children)):
                below.extend(c for c in children if type(c) in _CONTAINERS)
        level = below


_CONTAINERS = frozenset({dict, list})
