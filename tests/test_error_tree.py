"""Every exception class the project defines is a TesseraError, or on a short allow-list."""

from __future__ import annotations

import pytest

from tessera.errors import ErrorTable, InputError, TesseraError
from tessera_ttrpc.errors import TtrpcError
from tools import errors_doc
from tools.errors_doc import project_exceptions, qualified

OUTSIDE_THE_TREE = set(errors_doc.OUTSIDE_THE_TREE)
"""The short allow-list (with the reason for each) lives beside the page it is shown on."""


def test_the_scan_finds_the_known_classes() -> None:
    names = {qualified(c) for c in project_exceptions()}
    assert "tessera.errors.RecordError" in names
    assert "scheduler_plugin.decisions.extender.BadArgsError" in names
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
    from scheduler_plugin.decisions.extender import BadArgsError
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


def test_the_scan_covers_every_package_of_the_import_contracts() -> None:
    import tomllib

    config = tomllib.loads((errors_doc.ROOT / "pyproject.toml").read_text())
    assert set(errors_doc.PACKAGES) == set(config["tool"]["importlinter"]["root_packages"])
