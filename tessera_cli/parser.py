"""`CliParser`: argparse with a `TESSERA_*` environment twin for every long flag.

`--metrics-port 9400` and `TESSERA_METRICS_PORT=9400` mean the same; a flag on the command
line wins over its variable. A variable's value goes through the flag's own type and choices,
so a bad value is refused the same way, in one line naming the variable and the flag.
Boolean flags take true/false (1/0, yes/no, on/off) in their variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from tessera.errors import InputError
from tessera_cli.exit_codes import exit_code

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    C = TypeVar("C", bound=DataclassInstance)

ENV_PREFIX = "TESSERA_"
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
ENV_NOTE = (
    "Every flag --FLAG-NAME can also be set in the environment as TESSERA_FLAG_NAME\n"
    "(switches: true or false); a flag on the command line wins."
)
_NOT_TWINNED = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def env_name(flag: str) -> str:
    """`--metrics-port` -> `TESSERA_METRICS_PORT`."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def config_from(cls: type[C], args: argparse.Namespace, **given: Any) -> C:
    """The config dataclass `cls` from parsed flags: each field from the flag with the same
    destination (a field the parser lacks keeps its default), or from `given`."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if f.name not in given and hasattr(args, f.name)
    }
    return cls(**values, **given)


class ConfigError(InputError):
    """A setting that cannot work, found after parsing; str() is `flag: problem`.

    `flag` is how the user gave it (`--topology`, or `--backend nvml`); `CliParser.fail`
    names the environment variable instead when the value came from there."""

    def __init__(self, flag: str, problem: str) -> None:
        super().__init__(f"{flag}: {problem}")
        self.flag = flag
        self.problem = problem


def _long_flag(action: argparse.Action) -> str | None:
    if isinstance(action, _NOT_TWINNED) or not action.option_strings:
        return None
    longs = [s for s in action.option_strings if s.startswith("--")]
    return longs[0] if longs else None


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` names each flag's default, except a switch's: `--no-watch-nodes (default:
    True)` would read as if the switch were on by default, when True is only the value the
    setting keeps without it. `--x/--no-x` pairs say theirs (both spellings are listed)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction):
            return action.help
        return super()._get_help_string(action)


class CliParser(argparse.ArgumentParser):
    """One-line usage errors (exit 2) and a `TESSERA_*` twin for every long flag.

    `env` is the environment to read (default: `os.environ` at parse time). Abbreviated
    flags are off: a variable's twin must be recognisable on the command line to lose to it.
    """

    def __init__(self, *args: Any, env: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.env = env
        self.from_env: dict[str, str] = {}
        """flag -> variable, for each value the last parse took from the environment."""

    # --- the twins ---------------------------------------------------------------------

    def twins(self) -> Iterator[tuple[argparse.Action, str, str]]:
        """(action, long flag, variable) for every flag of this parser."""
        for action in self._actions:
            flag = _long_flag(action)
            if flag is not None:
                yield action, flag, env_name(flag)

    def format_help(self) -> str:
        """The help names each flag's variable, and says how variables work once."""
        twinned = False
        for action, _flag, var in self.twins():
            twinned = True
            note = f"[env {var}]"
            if action.help is not argparse.SUPPRESS and note not in (action.help or ""):
                action.help = f"{action.help} {note}" if action.help else note
        if twinned and ENV_NOTE not in (self.epilog or ""):
            self.epilog = f"{self.epilog.rstrip()}\n\n{ENV_NOTE}" if self.epilog else ENV_NOTE
        return super().format_help()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        namespace = argparse.Namespace() if namespace is None else namespace
        env = os.environ if self.env is None else self.env
        given = _given(argv)
        self.from_env = {}
        for action, flag, var in self.twins():
            raw = env.get(var)
            if raw is None or any(_named(s, given) for s in action.option_strings):
                continue
            setattr(namespace, action.dest, self._env_value(action, flag, var, raw))
            action.required = False  # the variable gave it
            self.from_env[flag] = var
        return super().parse_known_args(argv, namespace)

    def _env_value(self, action: argparse.Action, flag: str, var: str, raw: str) -> Any:
        where = f"{var} ({flag})"
        if action.nargs == 0:  # store_true/false/const, --x/--no-x
            word = raw.strip().lower()
            if word not in TRUE_WORDS | FALSE_WORDS:
                self.error(f"{where}: expected true or false, got {raw[:80]!r}")
            if isinstance(action, argparse.BooleanOptionalAction):
                return word in TRUE_WORDS
            return action.const if word in TRUE_WORDS else action.default
        try:
            value = raw if action.type is None else action.type(raw)  # type: ignore[operator]
        except argparse.ArgumentTypeError as exc:
            self.error(f"{where}: {exc}")
        except (TypeError, ValueError):
            kind = getattr(action.type, "__name__", "")
            self.error(f"{where}: invalid {kind} value: {raw[:80]!r}")
        if action.choices is not None and value not in action.choices:
            options = ", ".join(repr(c) for c in action.choices)
            self.error(f"{where}: invalid choice: {raw[:80]!r} (choose from {options})")
        return value

    # --- errors ------------------------------------------------------------------------

    def describe(self, flag: str) -> str:
        """How the user gave `flag` (`--x value` too): the variable when it came from one."""
        name, _, rest = flag.partition(" ")
        var = self.from_env.get(name)
        if var is None:
            return flag
        return f"{var} ({name}" + (f" {rest}" if rest else "") + ")"

    def error(self, message: str) -> NoReturn:
        """A usage error: one line on stderr, exit status 2 (the usage text would bury it)."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def fail(self, exc: ConfigError) -> int:
        """Print a `ConfigError` as one line naming the flag or its variable; its exit
        status (2, from tessera_cli.exit_codes)."""
        print(f"{self.prog}: error: {self.describe(exc.flag)}: {exc.problem}", file=sys.stderr)
        return exit_code(exc)


class Commands:
    """A program of subcommands (`tessera-keys generate ...`): `parser` is the program's,
    its description kept as written; `add` makes each subcommand's `CliParser`."""

    def __init__(self, prog: str, description: str) -> None:
        self.parser = CliParser(
            prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        self._commands = self.parser.add_subparsers(
            dest="command", required=True, metavar="COMMAND", parser_class=CliParser
        )

    def add(self, name: str, help: str, description: str, *, as_written: bool = True) -> CliParser:
        """The subcommand `name`: `help` in the program's list, `description` atop its own
        --help, kept as written (its own line breaks) unless `as_written` is False."""
        kwargs: dict[str, Any] = {"help": help, "description": description}
        if as_written:
            kwargs["formatter_class"] = argparse.RawDescriptionHelpFormatter
        parser: CliParser = self._commands.add_parser(name, **kwargs)
        return parser


def _given(argv: Sequence[str]) -> list[str]:
    """The command-line words that may name flags (all before a lone `--`)."""
    words = []
    for word in argv:
        if word == "--":
            break
        if word.startswith("-"):
            words.append(word)
    return words


def _named(option: str, words: Sequence[str]) -> bool:
    if option.startswith("--"):
        return any(w == option or w.startswith(option + "=") for w in words)
    return any(w.startswith(option) and not w.startswith("--") for w in words)
