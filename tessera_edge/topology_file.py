"""Topology files: a node's devices written down (YAML or JSON, the inventory schema).

They drive the fake NVML backend, the tests, the simulator and the demo. Everything read
here goes through NodeInventory.from_dict, the core's one inventory parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tessera.errors import InventoryError
from tessera.model import NodeInventory

BUILTIN_TOPOLOGIES = ("h100-sxm-8x", "a100-pcie-8x", "t4-4x")
# next to this module in the package (importlib.resources would find the same files, and
# import tempfile, shutil, bz2, lzma and zipfile into every node agent to do it)
_BUILTIN_FOLDER = Path(__file__).resolve().with_name("topologies")


def builtin_topology_text(name: str) -> str:
    """The YAML of the built-in topology `name` (one of BUILTIN_TOPOLOGIES)."""
    if name not in BUILTIN_TOPOLOGIES:
        raise ValueError(f"no built-in topology {name!r}")
    return (_BUILTIN_FOLDER / f"{name}.yaml").read_text()


def load_document(text: str, source: str) -> Any:
    """The YAML (or JSON) document in `text`; InventoryError names the line on a syntax error."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "$"
        raise InventoryError(source, where, f"not valid YAML/JSON: {exc}") from None


def parse_topology_text(text: str, source: str, node_name: str = "") -> NodeInventory:
    doc = load_document(text, source)
    if doc is None:
        raise InventoryError(source, "$", "the file is empty")
    return NodeInventory.from_dict(doc, source=source, node_name=node_name or None)


def load_topology(name_or_path: str, node_name: str = "") -> NodeInventory:
    """Load a built-in topology by name (see BUILTIN_TOPOLOGIES) or a file by path."""
    if name_or_path in BUILTIN_TOPOLOGIES:
        text = builtin_topology_text(name_or_path)
        return parse_topology_text(text, f"builtin:{name_or_path}", node_name)
    path = Path(name_or_path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InventoryError(str(path), "$", f"cannot read topology file: {exc.strerror}") from None
    return parse_topology_text(text, str(path), node_name)
