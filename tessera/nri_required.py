"""The NRI plugins a pod's containers must be created through (NRI's required-plugins
annotation, read by containerd's default validator, 2.2 and later).

The scheduler writes the pod-scope key with the record so that containerd refuses to
create a container of that pod while tessera's NRI hook is not connected. A tenant may
already have written a pod-scope value naming other plugins: it is read here (a small,
bounded subset of YAML: a flow or block list of names) and kept beside the hook's name,
so tessera never drops a requirement the pod asked for. A value outside that subset is
refused with a RequestError rather than overwritten.

The container-scope keys (`.../container.<name>`) are left alone: containerd prefers them
over the pod key, so a tenant can lift the requirement for a container of their own pod,
and only that: the container then meets the node agent's gate instead, and it never gets
devices without the hook (docs/nri_hook.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from tessera import resources as rn
from tessera.errors import RequestError

MAX_VALUE_CHARS: Final = 4096
"""Longest tenant value read; real values name a few plugins."""
MAX_PLUGINS: Final = 32
"""Most plugin names one pod may require (containerd has no limit; nodes run a handful)."""
_NAME: Final = re.compile(r"[A-Za-z0-9_.+-]+")
"""NRI's rule for plugin names: letters, digits, `_ . + -`."""


def valid_plugin_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def _item(text: str, key: str) -> str:
    item = text.strip()
    if len(item) >= 2 and item[0] == item[-1] and item[0] in "\"'":
        item = item[1:-1]
    if not valid_plugin_name(item):
        raise RequestError(
            None,
            key,
            f"{text.strip()[:64]!r} is not an NRI plugin name (letters, digits, _ . + -)",
        )
    return item


def parse_names(value: Any, key: str) -> tuple[str, ...]:
    """The plugin names in a required-plugins value: `[a, b]`, `- a` lines, or empty.
    RequestError (naming `key`) for anything else."""
    if not isinstance(value, str):
        raise RequestError(None, key, "annotation values must be strings")
    if len(value) > MAX_VALUE_CHARS:
        raise RequestError(None, key, f"longer than {MAX_VALUE_CHARS} characters")
    text = value.strip()
    if not text:
        return ()
    if text.startswith("["):
        if not text.endswith("]"):
            raise RequestError(None, key, "a list that starts with '[' must end with ']'")
        parts = text[1:-1].split(",")
        if parts and not parts[-1].strip():
            parts.pop()  # YAML allows a trailing comma in a flow list
        items = parts
    else:
        items = []
        for line in text.splitlines():
            stripped = line.strip()
            if not stripped:
                continue
            if stripped != "-" and not stripped.startswith("- "):
                raise RequestError(
                    None, key, "expected a YAML list of NRI plugin names, e.g. [name, other]"
                )
            items.append(stripped[1:])
    if len(items) > MAX_PLUGINS:
        raise RequestError(None, key, f"names more than {MAX_PLUGINS} plugins")
    return tuple(_item(item, key) for item in items)


def required_plugins(annotations: Mapping[str, Any], plugin: str) -> tuple[str, ...]:
    """The names to write on the pod-scope key: `plugin` first, then those the pod already
    requires at pod scope (its `/pod` key, else the bare key, as containerd reads them),
    each once."""
    if not valid_plugin_name(plugin):
        raise ValueError(f"{plugin!r} is not an NRI plugin name")
    for key in (rn.NRI_REQUIRED_PLUGINS_POD_ANNOTATION, rn.NRI_REQUIRED_PLUGINS_ANNOTATION):
        if key in annotations:
            names = parse_names(annotations[key], key)
            break
    else:
        names = ()
    return tuple(dict.fromkeys((plugin, *names)))


def render(names: tuple[str, ...]) -> str:
    """The annotation value: a JSON list, which is YAML that NRI reads back name for name
    (every name quoted, so none reads as a number or null)."""
    return json.dumps(list(names))
