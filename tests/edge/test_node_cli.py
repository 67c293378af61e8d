"""The flags several node programs share are one declaration: the same default, check and
--help wherever they are taken; the node's name defaults as the kubelet names its node."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable

import pytest

from deviceplugin.cli import build_parser as device_plugin_parser
from nri_hook.cli import build_parser as nri_hook_parser
from tessera_edge.isolation_cli import build_parser as isolation_parser
from tessera_edge.node_cli import default_node_name
from tests.cli.test_every_cli import _all_parsers

SHARED = {
    "--node-name": {"tessera-device-plugin", "tessera-nri-hook", "tessera-isolation mps"},
    "--isolation": {"tessera-device-plugin", "tessera-nri-hook"},
    "--hami-core-library": {"tessera-device-plugin", "tessera-isolation install"},
    "--mps-pipe-dir": {"tessera-device-plugin", "tessera-nri-hook", "tessera-isolation mps"},
    "--host-root": {"tessera-device-plugin", "tessera-isolation install"},
}
"""Each shared flag, and the programs that take it as declared once (the NRI hook's
--hami-core-library is its own: it may be given no library at all)."""
PROGRAMS: tuple[Callable[[], argparse.ArgumentParser], ...] = (
    device_plugin_parser,
    nri_hook_parser,
    isolation_parser,
)


def _takers(flag: str) -> dict[str, argparse.Action]:
    found = {}
    for build in PROGRAMS:
        for parser in _all_parsers(build()):
            for action in parser._actions:
                if flag in action.option_strings:
                    found[parser.prog] = action
    return found


@pytest.mark.parametrize("flag", sorted(SHARED))
def test_a_shared_flag_is_one_declaration_wherever_it_is_taken(
    flag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    takers = {prog: a for prog, a in _takers(flag).items() if prog in SHARED[flag]}
    assert set(takers) == SHARED[flag]
    facts = {(a.default, a.type, a.metavar, tuple(a.choices or ())) for a in takers.values()}
    assert len(facts) == 1, facts
    # one help, to which a program may add what it does with the value
    helps = [a.help or "" for a in takers.values()]
    shared = 0
    while all(len(h) > shared and h[shared] == helps[0][shared] for h in helps):
        shared += 1
    assert shared >= 16, helps


def test_the_hooks_own_library_flag_is_left_to_it() -> None:
    """The NRI hook may be given no library at all (the node or image provides one)."""
    assert _takers("--hami-core-library")["tessera-nri-hook"].default == ""


def test_the_node_name_defaults_to_node_name_else_the_lower_cased_host_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    assert default_node_name() == "gpu-7"
    monkeypatch.delenv("NODE_NAME")
    monkeypatch.setattr(socket, "gethostname", lambda: "GPU-Node-3")
    assert default_node_name() == "gpu-node-3"
    for action in _takers("--node-name").values():
        assert action.default is None or action.default == "gpu-node-3"
