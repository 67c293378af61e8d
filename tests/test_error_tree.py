"""Every exception class the project defines is a TesseraError, or on a short allow-list."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from tessera.errors import ErrorTable, InputError, TesseraError
from tessera_ttrpc.errors import TtrpcError

PACKAGES = (
    "tessera",
    "tessera_cli",
    "tessera_edge",
    "tessera_sim",
    "tessera_ttrpc",
    "kube_edge",
    "deviceplugin",
    "nri_hook",
    "scheduler_plugin",
    "tessera_testbed",
    "kubectl_tessera",
)

OUTSIDE_THE_TREE = {
    # private control flow: raised and caught inside one module, never crosses an edge
    "tessera.node_placement._NoFitError",
    "deviceplugin.nvml_backend._CallError",
    "scheduler_plugin.http._ReplyError",
    # the ttrpc library's own root: usable without tessera, mapped at the NRI hook's edge
    "tessera_ttrpc.errors.TtrpcError",
}
"""Exception classes that may stay outside TesseraError, each for the reason given."""


def project_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in a module of the project's packages."""
    found: dict[str, type[BaseException]] = {}
    for name in PACKAGES:
        package = importlib.import_module(name)
        modules = [package]
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            modules.append(importlib.import_module(info.name))
        for module in modules:
            for _, obj in inspect.getmembers(module, inspect.isclass):
                if issubclass(obj, BaseException) and obj.__module__.split(".")[0] in PACKAGES:
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_the_scan_finds_the_known_classes() -> None:
    names = {qualified(c) for c in project_exceptions()}
    assert "tessera.errors.RecordError" in names
    assert "scheduler_plugin.extender.BadArgsError" in names
    assert "tessera.node_placement._NoFitError" in names
    assert names >= OUTSIDE_THE_TREE  # no stale entry on the allow-list


def test_every_exception_is_a_tessera_error_or_allowed() -> None:
    strays = [
        qualified(c)
        for c in project_exceptions()
        if not issubclass(c, TesseraError)
        and qualified(c) not in OUTSIDE_THE_TREE
        and not issubclass(c, TtrpcError)
    ]
    assert strays == []


def test_the_private_ones_are_private() -> None:
    for name in OUTSIDE_THE_TREE:
        if "ttrpc" not in name:
            assert name.rsplit(".", 1)[1].startswith("_"), name


def test_callers_that_catch_builtins_still_catch() -> None:
    from deviceplugin.request_bounds import BadRequestError
    from nri_hook.mux import MuxError
    from scheduler_plugin.extender import BadArgsError
    from tessera_ttrpc.frame import FrameTooLargeError

    assert issubclass(BadArgsError, ValueError)
    assert issubclass(BadRequestError, ValueError)
    assert issubclass(MuxError, ConnectionError)
    assert issubclass(FrameTooLargeError, ValueError)


class _SubError(InputError):
    pass


class _SubSubError(_SubError):
    pass


class _CarrierError(TesseraError):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def test_lookup_walks_the_mro() -> None:
    table = ErrorTable("t", {TesseraError: "default", InputError: "input", _SubSubError: "subsub"})
    assert table.lookup(_SubSubError()) == "subsub"
    assert table.lookup(_SubError) == "input"  # nearest listed ancestor
    assert table.lookup(TesseraError("x")) == "default"
    assert table.lookup(KeyError("bug")) == "default"  # not in the tree: the root's row
    assert table.row_class(_SubError) is InputError


def test_carried_answers_win_for_instances() -> None:
    table = ErrorTable("t", {TesseraError: 0}, carried={_CarrierError: "code"})
    assert table.lookup(_CarrierError(7)) == 7
    with pytest.raises(TypeError):
        table.lookup(_CarrierError)


def test_a_table_needs_the_root_row() -> None:
    with pytest.raises(ValueError, match="TesseraError row"):
        ErrorTable("t", {InputError: 1})
