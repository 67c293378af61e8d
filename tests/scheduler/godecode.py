"""Decode JSON the way kube-scheduler does (Go encoding/json into extender/v1 structs).

Rules modelled (Go's encoding/json as kube-scheduler's extender client uses it):
- object keys match struct fields exactly, else case-insensitively; unknown keys are
  ignored (we also report them, so a misspelt key in our replies is caught);
- `null` leaves a slice or map nil (kept here as None) and a string or number at its zero
  value;
- an int64 field takes only a JSON integer: `7.0` or `7e0` is an error, as is a string;
- a wrong JSON type for a field is an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class GoDecodeError(ValueError):
    pass


@dataclass(frozen=True)
class _Float:
    text: str


String = "string"
Int64 = "int64"
Raw = "raw"


def List(elem: Any) -> tuple[str, Any]:
    return ("list", elem)


def Map(elem: Any) -> tuple[str, Any]:
    return ("map", elem)


def Struct(**fields: Any) -> tuple[str, dict[str, Any]]:
    return ("struct", fields)


Ptr = Struct  # a *struct decodes like the struct, or nil from null

NodeList = Struct(metadata=Raw, items=List(Raw))
ExtenderFilterResult = Struct(
    Nodes=NodeList,
    NodeNames=List(String),
    FailedNodes=Map(String),
    FailedAndUnresolvableNodes=Map(String),
    Error=String,
)
HostPriorityList = List(Struct(Host=String, Score=Int64))
ExtenderBindingResult = Struct(Error=String)
MetaVictims = Struct(Pods=List(Struct(UID=String)), NumPDBViolations=Int64)
ExtenderPreemptionResult = Struct(NodeNameToMetaVictims=Map(MetaVictims))


def loads(data: bytes) -> Any:
    return json.loads(data, parse_float=_Float)


def decode(schema: Any, data: bytes) -> tuple[Any, list[str]]:
    """(decoded value, unknown keys seen) or GoDecodeError."""
    unknown: list[str] = []
    return _decode(schema, loads(data), "$", unknown), unknown


def _decode(schema: Any, value: Any, path: str, unknown: list[str]) -> Any:
    if schema == Raw:
        return value
    if schema == String:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise GoDecodeError(f"{path}: cannot unmarshal {value!r} into a Go string")
        return value
    if schema == Int64:
        if value is None:
            return 0
        if isinstance(value, _Float):
            raise GoDecodeError(f"{path}: cannot unmarshal number {value.text} into Go int64")
        if isinstance(value, bool) or not isinstance(value, int):
            raise GoDecodeError(f"{path}: cannot unmarshal {value!r} into Go int64")
        if not -(2**63) <= value < 2**63:
            raise GoDecodeError(f"{path}: number {value} overflows int64")
        return value
    kind, inner = schema
    if value is None:
        return None
    if kind == "list":
        if not isinstance(value, list):
            raise GoDecodeError(f"{path}: cannot unmarshal {type(value).__name__} into a slice")
        return [_decode(inner, v, f"{path}[{i}]", unknown) for i, v in enumerate(value)]
    if kind == "map":
        if not isinstance(value, dict):
            raise GoDecodeError(f"{path}: cannot unmarshal {type(value).__name__} into a map")
        return {k: _decode(inner, v, f"{path}.{k}", unknown) for k, v in value.items()}
    if kind == "struct":
        if not isinstance(value, dict):
            raise GoDecodeError(f"{path}: cannot unmarshal {type(value).__name__} into a struct")
        result: dict[str, Any] = dict.fromkeys(inner)
        for key, v in value.items():
            field = (
                key if key in inner else next((f for f in inner if f.lower() == key.lower()), None)
            )
            if field is None:
                unknown.append(f"{path}.{key}")
                continue
            result[field] = _decode(inner[field], v, f"{path}.{field}", unknown)
        for field, sub in inner.items():
            if result[field] is None and sub in (String, Int64):
                result[field] = "" if sub == String else 0
        return result
    raise AssertionError(schema)


def filter_survivors(result: dict[str, Any], node_cache_capable: bool) -> list[str]:
    """The node names kube-scheduler takes from a decoded ExtenderFilterResult."""
    if result["Error"]:
        raise GoDecodeError(f"extender error: {result['Error']}")
    if node_cache_capable and result["NodeNames"] is not None:
        return list(result["NodeNames"])
    nodes = result["Nodes"]
    if nodes is None or nodes["items"] is None:
        return []
    return [item["metadata"]["name"] for item in nodes["items"]]
