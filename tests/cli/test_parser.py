"""CliParser: every long flag has a TESSERA_* twin, checked exactly like the flag; the flag
wins; a bad value is one line naming the variable and the flag, exit status 2."""

from __future__ import annotations

import argparse

import pytest

from tessera_cli import CliParser, Commands, ConfigError, env_name
from tessera_cli.values import listen_address, port, seconds


def _parser(env: dict[str, str]) -> CliParser:
    p = CliParser(prog="prog", env=env)
    p.add_argument("--metrics-port", type=port, default=0, help="port")
    p.add_argument("--listen", type=listen_address, default=("0.0.0.0", 1), help="addr")
    p.add_argument("--wait", type=seconds(), default=1.0, help="seconds")
    p.add_argument("--mode", choices=("a", "b"), default="a", help="mode")
    p.add_argument("--fast", action="store_true", help="fast")
    p.add_argument("--no-watch", dest="watch", action="store_false", help="no watch")
    p.add_argument("--elect", action=argparse.BooleanOptionalAction, default=True, help="e")
    p.add_argument("-n", "--namespace", help="namespace")
    p.add_argument("--out", required=True, help="out")
    return p


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], env: dict[str, str]) -> str:
    with pytest.raises(SystemExit) as exited:
        _parser(env).parse_args(["--out", "x"])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_env_name_is_the_long_flag_upper_cased() -> None:
    assert env_name("--metrics-port") == "TESSERA_METRICS_PORT"
    assert env_name("--no-heartbeat-check") == "TESSERA_NO_HEARTBEAT_CHECK"


def test_twins_are_parsed_with_the_flags_own_types() -> None:
    env = {
        "TESSERA_METRICS_PORT": "9400",
        "TESSERA_LISTEN": "localhost:8443",
        "TESSERA_WAIT": "2.5",
        "TESSERA_MODE": "b",
        "TESSERA_FAST": "yes",
        "TESSERA_NO_WATCH": "true",
        "TESSERA_ELECT": "off",
        "TESSERA_NAMESPACE": "ml",
        "TESSERA_OUT": "dir",
    }
    parser = _parser(env)
    args = parser.parse_args([])  # --out is required, and its variable gives it
    assert (args.metrics_port, args.listen, args.wait, args.mode) == (
        9400,
        ("127.0.0.1", 8443),
        2.5,
        "b",
    )
    assert (args.fast, args.watch, args.elect, args.namespace, args.out) == (
        True,
        False,
        False,
        "ml",
        "dir",
    )
    assert parser.describe("--wait") == "TESSERA_WAIT (--wait)"


def test_false_words_leave_boolean_flags_off() -> None:
    args = _parser({"TESSERA_FAST": "0", "TESSERA_NO_WATCH": "no"}).parse_args(["--out", "x"])
    assert args.fast is False and args.watch is True


@pytest.mark.parametrize(
    ("argv", "metrics", "namespace", "elect"),
    [
        (["--metrics-port", "1"], 1, "env", True),
        (["--metrics-port=1"], 1, "env", True),
        (["-n", "flag"], 2, "flag", True),
        (["-nflag"], 2, "flag", True),
        (["--namespace=flag"], 2, "flag", True),
        (["--no-elect"], 2, "env", False),
    ],
)
def test_the_flag_wins_over_its_variable(
    argv: list[str], metrics: int, namespace: str, elect: bool
) -> None:
    env = {"TESSERA_METRICS_PORT": "2", "TESSERA_NAMESPACE": "env", "TESSERA_ELECT": "1"}
    parser = _parser(env)
    args = parser.parse_args(["--out", "x", *argv])
    assert (args.metrics_port, args.namespace, args.elect) == (metrics, namespace, elect)
    assert parser.describe("--metrics-port") == (
        "--metrics-port" if metrics == 1 else "TESSERA_METRICS_PORT (--metrics-port)"
    )


def test_a_flag_wins_even_over_a_broken_variable() -> None:
    """The variable is not read when its flag is given (a stale value in the environment
    does not stop an operator who overrides it)."""
    args = _parser({"TESSERA_METRICS_PORT": "x"}).parse_args(["--out", "x", "--metrics-port=3"])
    assert args.metrics_port == 3


@pytest.mark.parametrize(
    ("var", "value", "says"),
    [
        ("TESSERA_METRICS_PORT", "70000", "must be 0..65535"),
        ("TESSERA_METRICS_PORT", "http", "not a whole number"),
        ("TESSERA_LISTEN", "example.com:1", "IP address"),
        ("TESSERA_WAIT", "nan", "finite"),
        ("TESSERA_MODE", "c", "invalid choice"),
        ("TESSERA_FAST", "maybe", "true or false"),
        ("TESSERA_ELECT", "", "true or false"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it_and_the_flag(
    capsys: pytest.CaptureFixture[str], var: str, value: str, says: str
) -> None:
    line = _one_line_exit_2(capsys, {var: value})
    flag = "--" + var.removeprefix("TESSERA_").lower().replace("_", "-")
    assert line.startswith(f"prog: error: {var} ({flag}): "), line
    assert says in line, line


def test_help_names_every_variable() -> None:
    parser = _parser({})
    text = " ".join(parser.format_help().split())
    for _action, _flag, var in parser.twins():
        assert f"[env {var}]" in text
    assert "can also be set in the environment as TESSERA_FLAG_NAME" in text
    assert text == " ".join(parser.format_help().split())  # annotating twice adds nothing


def test_fail_names_the_variable_a_bad_setting_came_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = _parser({"TESSERA_LISTEN": "10.0.0.1:80"})
    parser.parse_args(["--out", "x"])
    assert parser.fail(ConfigError("--listen 10.0.0.1", "not a loopback address")) == 2
    assert parser.fail(ConfigError("--out", "is not a directory")) == 2
    assert capsys.readouterr().err.splitlines() == [
        "prog: error: TESSERA_LISTEN (--listen 10.0.0.1): not a loopback address",
        "prog: error: --out: is not a directory",
    ]


def test_commands_make_a_program_of_subcommands_with_twins(
    capsys: pytest.CaptureFixture[str],
) -> None:
    commands = Commands("prog", "Do things.\n\n  one   the first thing\n  two   the second")
    one = commands.add("one", "the first thing", "The first thing,\n  kept as written.")
    one.add_argument("--size", type=port, default=1, help="how big")
    two = commands.add("two", "the second", "The second  thing, wrapped.", as_written=False)
    two.add_argument("name")
    args = commands.parser.parse_args(["one", "--size", "7"])
    assert (args.command, args.size) == ("one", 7)
    assert commands.parser.parse_args(["two", "x"]).name == "x"
    assert "  one   the first thing" in commands.parser.format_help()
    assert "The first thing,\n  kept as written." in one.format_help()
    assert "The second thing, wrapped." in two.format_help()
    assert isinstance(one, CliParser) and "[env TESSERA_SIZE]" in one.format_help()
    with pytest.raises(SystemExit) as exited:
        commands.parser.parse_args([])
    assert exited.value.code == 2
    assert "COMMAND" in capsys.readouterr().err
