"""Every flag of every tessera program has a TESSERA_* twin, named in --help; the real
console scripts take the twins and refuse a bad one in one line, exit status 2."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deviceplugin.cli import build_parser as device_plugin_parser
from deviceplugin.preflight import parser as node_check_parser
from kubectl_tessera.cli import parser as kubectl_parser
from nri_hook.cli import build_parser as nri_hook_parser
from scheduler_plugin.cli import build_parser as scheduler_parser
from tessera_cli import CliParser, env_name
from tessera_edge.isolation_cli import build_parser as isolation_parser
from tessera_edge.keys_cli import _parser as keys_parser

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "tessera-scheduler": scheduler_parser,
    "tessera-device-plugin": device_plugin_parser,
    "tessera-nri-hook": nri_hook_parser,
    "tessera-node-check": node_check_parser,
    "kubectl-tessera": kubectl_parser,
    "tessera-keys": keys_parser,
    "tessera-isolation": isolation_parser,
}
BIN = Path(sys.executable).parent


def _all_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


@pytest.mark.parametrize("program", sorted(PARSERS))
def test_every_flag_has_a_twin_named_in_help(program: str) -> None:
    flags = 0
    for parser in _all_parsers(PARSERS[program]()):
        assert isinstance(parser, CliParser), parser.prog
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            longs = [s for s in action.option_strings if s.startswith("--")]
            assert longs, f"{parser.prog}: {action.option_strings} has no long name"
            assert f"[env {env_name(longs[0])}]" in text, (parser.prog, longs[0])
            flags += 1
    assert flags


def _run(program: str, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    return subprocess.run(
        [str(BIN / program), *argv],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("program", "var", "value", "says"),
    [
        ("tessera-scheduler", "TESSERA_HEALTH_LISTEN", "1.2.3.4:-1", "HOST:PORT"),
        ("tessera-scheduler", "TESSERA_POLICY", "nope", "invalid choice"),
        ("tessera-device-plugin", "TESSERA_LEASE_DURATION", "0", "must be 1..86400"),
        ("tessera-device-plugin", "TESSERA_NO_INVENTORY", "perhaps", "true or false"),
        ("tessera-nri-hook", "TESSERA_METRICS_PORT", "70000", "must be 0..65535"),
        ("tessera-nri-hook", "TESSERA_MPS_PIPE_DIR", "relative", "absolute"),
        ("tessera-node-check", "TESSERA_BACKEND", "cuda", "invalid choice"),
        ("tessera-isolation", "TESSERA_HAMI_CORE_LIBRARY", "libvgpu.so", "absolute"),
        ("tessera-isolation", "TESSERA_CHECK_INTERVAL", "0", "above 0"),
    ],
)
def test_the_console_script_refuses_a_bad_twin_in_one_line(
    program: str, var: str, value: str, says: str
) -> None:
    args: tuple[str, ...] = ("nodes",) if program == "kubectl-tessera" else ()
    if program == "tessera-isolation":
        args = ("mps",) if var == "TESSERA_CHECK_INTERVAL" else ("install",)
    proc = _run(program, {var: value}, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    flag = "--" + var.removeprefix("TESSERA_").lower().replace("_", "-")
    assert f"{var} ({flag})" in lines[0] and says in lines[0], lines[0]


def test_the_scheduler_takes_its_listen_address_from_the_environment() -> None:
    """TESSERA_LISTEN reaches the checks after parsing, which name the variable; the flag
    beats it."""
    proc = _run("tessera-scheduler", {"TESSERA_LISTEN": "0.0.0.0:0"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("tessera-scheduler: error: TESSERA_LISTEN (--listen 0.0.0.0)")
    flag = _run("tessera-scheduler", {"TESSERA_LISTEN": "127.0.0.1:0"}, "--listen=10.0.0.1:0")
    assert flag.returncode == 2 and "error: --listen 10.0.0.1: not a loopback" in flag.stderr


def test_the_device_plugin_takes_its_settings_from_the_environment(tmp_path: Path) -> None:
    env = {
        "TESSERA_BACKEND": "fake",
        "TESSERA_TOPOLOGY": "t4-4x",
        "TESSERA_MEMORY_UNIT_MIB": "2048",
        "TESSERA_NO_INVENTORY": "true",
        "TESSERA_PRINT_INVENTORY": "1",
        "TESSERA_LOG_LEVEL": "error",
    }
    proc = _run("tessera-device-plugin", env)
    assert proc.returncode == 0, proc.stderr
    assert '"tessera.dev/gpu-memory": 28' in proc.stdout  # 4 x 15 GiB in 2 GiB units
    flag = _run("tessera-device-plugin", env, "--memory-unit-mib", "1024")
    assert '"tessera.dev/gpu-memory": 60' in flag.stdout, flag.stderr
    missing = _run("tessera-device-plugin", {**env, "TESSERA_TOPOLOGY": str(tmp_path / "x")})
    assert missing.returncode == 2
    assert missing.stderr.startswith(
        "tessera-device-plugin: error: TESSERA_TOPOLOGY (--topology): "
    ), missing.stderr


def test_kubectl_tessera_takes_a_request_timeout_from_the_environment() -> None:
    proc = _run("kubectl-tessera", {"TESSERA_REQUEST_TIMEOUT": "inf"}, "nodes")
    assert proc.returncode == 2
    assert "TESSERA_REQUEST_TIMEOUT (--request-timeout): must be a finite" in proc.stderr
