"""Flags declared on config fields: the field's name makes the flag, its group the --help
section; the parsed values come back as the config, environment twins included."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from tessera_cli import CliParser, config_from
from tessera_cli.flags import FlagGroup, add_flags
from tessera_cli.values import seconds

_FIRST = FlagGroup("first", "what the first group is for")
_SECOND = FlagGroup("second")
_OWN = FlagGroup(None)
_BUILT: list[int] = []


def _when_built() -> str:
    _BUILT.append(1)
    return f"built-{len(_BUILT)}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Config:
    wait_time: float = _FIRST.flag("how long", type=seconds(), default=2.0)
    watch: bool = _SECOND.flag("do not watch", option="--no-watch", action="store_false")
    name: str = _FIRST.flag("a name", default_factory=_when_built)
    output: str = _OWN.flag(None, short="-o", choices=("table", "json"), default="table")
    shared: str
    """Added by the caller, not by add_flags."""


def _parser(env: dict[str, str]) -> CliParser:
    parser = CliParser(prog="prog", env=env)
    groups = add_flags(parser, _Config)
    groups["second"].add_argument("--shared", default="s", help="shared")
    return parser


def test_each_field_makes_its_flag_in_its_group() -> None:
    parser = _parser({})
    groups = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups}
    assert groups["first"] == ["wait_time", "name"]
    assert groups["second"] == ["watch", "shared"]
    assert "output" in groups["options"]  # an untitled group's flags are the parser's own
    assert "what the first group is for" in parser.format_help()
    options = {a.dest: a.option_strings for a in parser._actions}
    assert options["wait_time"] == ["--wait-time"] and options["watch"] == ["--no-watch"]
    assert options["output"] == ["-o", "--output"]


def test_the_parsed_flags_and_twins_are_the_config() -> None:
    config = config_from(_Config, _parser({}).parse_args([]))
    assert config == _Config(
        wait_time=2.0, watch=True, name=config.name, output="table", shared="s"
    )
    env = {"TESSERA_WAIT_TIME": "5", "TESSERA_NO_WATCH": "true"}
    argv = ["--name", "n", "--shared", "x", "-o", "json"]
    config = config_from(_Config, _parser(env).parse_args(argv))
    assert config == _Config(wait_time=5.0, watch=False, name="n", output="json", shared="x")


def test_a_default_factory_runs_when_the_parser_is_built() -> None:
    first = _parser({}).parse_args([]).name
    second = _parser({}).parse_args([]).name
    assert first != second and first.startswith("built-")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Kinds:
    verbose: bool = _FIRST.switch("say more")
    checks: bool = _FIRST.off_switch("skip the checks", option="--no-checks")
    wait: float = _FIRST.duration("how long", default=2.0)
    poll: float = _FIRST.duration("0: never", default=1.0, high=60.0, allow_zero=True)


def _kinds(argv: list[str], env: dict[str, str] | None = None) -> _Kinds:
    parser = CliParser(prog="prog", env=env or {})
    add_flags(parser, _Kinds)
    return config_from(_Kinds, parser.parse_args(argv))


def test_switches_and_durations_default_and_parse() -> None:
    assert _kinds([]) == _Kinds(verbose=False, checks=True, wait=2.0, poll=1.0)
    given = _kinds(["--verbose", "--no-checks", "--wait", "7.5", "--poll", "0"])
    assert given == _Kinds(verbose=True, checks=False, wait=7.5, poll=0.0)
    env = {"TESSERA_VERBOSE": "yes", "TESSERA_NO_CHECKS": "true", "TESSERA_POLL": "60"}
    assert _kinds([], env) == _Kinds(verbose=True, checks=False, wait=2.0, poll=60.0)


def _refused(
    parse: Callable[[list[str]], object], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error (exit status 2) naming the flag."""
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--wait", "0"], ["--poll", "61"], ["--wait", "soon"]])
def test_a_duration_out_of_its_range_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(_kinds, argv, capsys)


def test_a_duration_shows_seconds_in_help() -> None:
    parser = CliParser(prog="prog", env={})
    add_flags(parser, _Kinds)
    assert "--wait SECONDS" in parser.format_help()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Paths:
    config: str | None = _FIRST.path("a file")
    library: str = _FIRST.path("a host file", "/usr/lib/x.so", absolute=True)
    work: str = _FIRST.directory("a folder", "work")
    host: str = _FIRST.directory("a host folder", "/", absolute=True)
    mode: str | None = _FIRST.choice("how", ("fast", "slow"))
    side: str = _FIRST.choice("which", ("left", "right"), "left")


def _paths(argv: list[str]) -> _Paths:
    parser = CliParser(prog="prog", env={})
    add_flags(parser, _Paths)
    return config_from(_Paths, parser.parse_args(argv))


def test_paths_directories_and_choices_default_and_parse() -> None:
    assert _paths([]) == _Paths(
        config=None, library="/usr/lib/x.so", work="work", host="/", mode=None, side="left"
    )
    given = _paths(["--config", "c.yaml", "--work", "w", "--host", "/host", "--mode", "slow"])
    assert (given.config, given.work, given.host, given.mode) == ("c.yaml", "w", "/host", "slow")


def test_paths_and_directories_name_their_kind_in_help() -> None:
    parser = CliParser(prog="prog", env={})
    add_flags(parser, _Paths)
    text = " ".join(parser.format_help().split())
    for shown in ("--config PATH", "--library PATH", "--work DIR", "--host DIR", "{fast,slow}"):
        assert shown in text


@pytest.mark.parametrize(
    "argv",
    [["--library", "x.so"], ["--host", "host"], ["--mode", "medium"]],
)
def test_a_relative_host_path_or_an_unknown_choice_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(_paths, argv, capsys)


def test_a_relative_path_is_kept_where_it_may_be() -> None:
    assert _paths(["--config", "rel/c.yaml", "--work", "rel"]).work == "rel"
