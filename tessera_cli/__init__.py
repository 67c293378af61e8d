"""Command-line plumbing shared by every tessera program.

One parser (`CliParser`): each long flag has a `TESSERA_*` environment twin, checked by the
same value check as the flag; usage errors are one line on stderr and exit status 2. The
value checks for ports, addresses, durations, names and paths are in `tessera_cli.values`;
a program's flags are declared on the fields of its frozen config (`tessera_cli.flags`).
"""

from tessera_cli.exit_codes import EXIT_CODES, exit_code
from tessera_cli.parser import (
    ENV_PREFIX,
    CliParser,
    Commands,
    ConfigError,
    DefaultsHelpFormatter,
    config_from,
    env_name,
)

__all__ = [
    "ENV_PREFIX",
    "EXIT_CODES",
    "CliParser",
    "Commands",
    "ConfigError",
    "DefaultsHelpFormatter",
    "config_from",
    "env_name",
    "exit_code",
]
