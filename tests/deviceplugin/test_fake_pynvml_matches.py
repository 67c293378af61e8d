"""The stand-in pynvml (fake_pynvml.py) checked against the real `pynvml` of nvidia-ml-py.

The NVML backend's tests only prove something if the stand-in looks like pynvml: every
function it implements takes the parameters the real one takes (names, order, kinds,
defaults), every NVML name the backend and the preflight check use exists in pynvml, the
constants have pynvml's values, errors pynvml's classes and messages, and the structures
only fields that pynvml's ctypes structures have. A drift in either the stand-in or a new
nvidia-ml-py release fails here instead of hiding behind green backend tests.
"""

from __future__ import annotations

import ast
import ctypes
import inspect
import re
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pynvml
import pytest

from tests.deviceplugin import fake_pynvml as nv

REPO = Path(__file__).resolve().parents[2]
# the modules that call pynvml (the backend gets the module injected, preflight imports it)
NVML_CALLERS = [REPO / "deviceplugin" / "nvml_backend.py", REPO / "deviceplugin" / "preflight.py"]
NVML_NAME = re.compile(r"^(nvml[A-Z]\w*|NVML_\w+|NVMLError\w*)$")

FAKE_FUNCTIONS = sorted(
    name for name, value in vars(nv.FakeNvml).items() if name.startswith("nvml") and callable(value)
)
FAKE_CONSTANTS = sorted(
    name
    for name, value in vars(nv).items()
    if NVML_NAME.match(name) and isinstance(value, int) and not isinstance(value, bool)
)
# the stand-in's structures and the ctypes structures pynvml returns in their place
STRUCTURES: list[tuple[type[Any], type[ctypes.Structure]]] = [
    (nv.PciInfo, pynvml.nvmlPciInfo_t),
    (nv.Memory, pynvml.c_nvmlMemory_t),
    (nv.EventData, pynvml.c_nvmlEventData_t),
    (nv.ProcessInfo, pynvml.c_nvmlProcessInfo_v3_t),
    (nv.ProcessUtilizationSample, pynvml.c_nvmlProcessUtilizationSample_t),
]


def _shape(fn: Callable[..., Any]) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


def _names_used(path: Path) -> set[str]:
    """NVML names a module uses: attributes (`nvml.nvmlInit`) and the strings it looks
    names up by (`self._call("nvmlDeviceGetCount")`, `getattr(nvml, "NVML_...", 1)`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return {name for name in found if NVML_NAME.match(name)}


USED = sorted(set().union(*(_names_used(path) for path in NVML_CALLERS)))


def test_the_callers_are_found() -> None:
    # guards the scan itself: an empty list would make the checks below vacuous
    assert {"nvmlInit", "nvmlDeviceGetCount", "NVML_ERROR_NOT_SUPPORTED"} <= set(USED)
    assert {"nvmlDeviceGetMemoryInfo", "nvmlEventSetWait"} <= set(FAKE_FUNCTIONS)
    assert "NVML_ERROR_TIMEOUT" in FAKE_CONSTANTS


@pytest.mark.parametrize("name", FAKE_FUNCTIONS)
def test_each_fake_function_has_the_real_signature(name: str) -> None:
    fake = getattr(nv.FakeNvml([]), name)  # bound: `self` is not a parameter
    assert _shape(fake) == _shape(getattr(pynvml, name))


@pytest.mark.parametrize("name", USED)
def test_each_name_the_code_uses_exists_in_pynvml(name: str) -> None:
    assert hasattr(pynvml, name), f"pynvml has no {name}"


@pytest.mark.parametrize("name", USED)
def test_the_fake_provides_each_name_the_code_uses(name: str) -> None:
    assert hasattr(nv.FakeNvml([]), name), f"the stand-in lacks {name}"


@pytest.mark.parametrize("name", FAKE_CONSTANTS)
def test_each_constant_has_the_real_value(name: str) -> None:
    assert getattr(nv, name) == getattr(pynvml, name)


@pytest.mark.parametrize("code", sorted(nv._NAMES))
def test_errors_have_the_real_class_code_and_message(code: int) -> None:
    fake, real = nv.NVMLError(code), pynvml.NVMLError(code)
    assert type(fake).__name__ == type(real).__name__
    assert isinstance(real, getattr(pynvml, type(fake).__name__))
    assert (fake.value, str(fake)) == (real.value, str(real))


@pytest.mark.parametrize(
    ("fake", "real"), STRUCTURES, ids=[fake.__name__ for fake, _ in STRUCTURES]
)
def test_each_structure_field_exists_in_pynvml(
    fake: type[Any], real: type[ctypes.Structure]
) -> None:
    real_fields = {entry[0] for entry in real._fields_}
    assert {f.name for f in fields(fake)} <= real_fields
