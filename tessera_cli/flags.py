"""Flags declared on the config dataclass they fill: each setting is written once.

A component's frozen config names each setting as a field; `FlagGroup.flag` gives the
field its flag (`node_name` is `--node-name`, with `dest` the field's name) and the
argparse keywords of that flag. The common kinds have their own names, so a field's kind
reads from its declaration: `switch` (a flag that turns something on), `off_switch` (a
`--no-...` flag that turns it off) and `duration` (a number of seconds). `add_flags` adds
the flags of a config class to a parser, group by group in field order, and `config_from`
(tessera_cli.parser) reads the parsed values back into the class. A field declared without
`flag` (a flag shared by several programs, such as `--log-level`, added by its own module)
is left to the caller.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tessera_cli.values import MAX_INTERVAL_S, absolute_path, seconds

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_FLAG = "tessera_cli.flag"
"""The key of a field's metadata that holds its `Flag`."""


@dataclasses.dataclass(frozen=True, slots=True)
class Flag:
    group: FlagGroup
    option: str | None
    """The flag's name when it is not the field's (`--no-heartbeat-check` sets
    `require_heartbeat`)."""
    short: str | None
    """A one-letter name as well (`-o`)."""
    default_factory: Callable[[], Any] | None
    """The default, computed when the parser is built (it reads the environment)."""
    kwargs: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class FlagGroup:
    """A titled section of --help; without a title, the parser's own options."""

    title: str | None
    description: str | None = None

    def flag(
        self,
        help: str | None,
        *,
        option: str | None = None,
        short: str | None = None,
        default_factory: Callable[[], Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """A config field set by a flag of this group; `kwargs` go to `add_argument`."""
        flag = Flag(self, option, short, default_factory, {"help": help, **kwargs})
        return dataclasses.field(metadata={_FLAG: flag})

    def switch(self, help: str) -> bool:
        """A bool field, off unless its flag is given."""
        field: bool = self.flag(help, action="store_true")
        return field

    def off_switch(self, help: str, *, option: str) -> bool:
        """A bool field, on unless its flag `option` (`--no-...`) is given."""
        field: bool = self.flag(help, option=option, action="store_false")
        return field

    def duration(
        self, help: str, *, default: float, high: float = MAX_INTERVAL_S, allow_zero: bool = False
    ) -> float:
        """A number of seconds in (0, high], or 0 too when `allow_zero` (it turns the
        thing off, as `help` says)."""
        field: float = self.flag(
            help,
            type=seconds(high=high, allow_zero=allow_zero),
            default=default,
            metavar="SECONDS",
        )
        return field

    def path(
        self,
        help: str | None,
        default: str | None = None,
        *,
        absolute: bool = False,
        metavar: str = "PATH",
    ) -> Any:
        """A file's path (None unless given, or `default`). `absolute`: a host path that is
        mounted or handed to another process, refused unless absolute."""
        if absolute:
            return self.flag(help, type=absolute_path, default=default, metavar=metavar)
        return self.flag(help, default=default, metavar=metavar)

    def directory(self, help: str | None, default: str, *, absolute: bool = False) -> str:
        """A folder's path (`path` with DIR in --help)."""
        field: str = self.path(help, default, absolute=absolute, metavar="DIR")
        return field

    def choice(self, help: str | None, choices: Sequence[str], default: str | None = None) -> Any:
        """One of `choices` (None unless given, or `default`)."""
        return self.flag(help, choices=choices, default=default)


def add_flags(
    parser: argparse.ArgumentParser, config: type[DataclassInstance]
) -> dict[str, argparse._ArgumentGroup]:
    """Add the flag of every `FlagGroup.flag` field of `config`; the titled groups, by title."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in dataclasses.fields(config):
        flag: Flag | None = field.metadata.get(_FLAG)
        if flag is None:
            continue
        group = _section(parser, groups, flag.group)
        kwargs = dict(flag.kwargs)
        if flag.default_factory is not None:
            kwargs["default"] = flag.default_factory()
        names = [flag.option or "--" + field.name.replace("_", "-")]
        if flag.short is not None:
            names.insert(0, flag.short)
        group.add_argument(*names, dest=field.name, **kwargs)
    return groups


def _section(
    parser: argparse.ArgumentParser,
    groups: dict[str, argparse._ArgumentGroup],
    group: FlagGroup,
) -> argparse._ActionsContainer:
    """Where a group's flags go: its section of --help, made on first use (an untitled
    group's flags are the parser's own options)."""
    if group.title is None:
        return parser
    if group.title not in groups:
        groups[group.title] = parser.add_argument_group(group.title, group.description)
    return groups[group.title]
