"""The exit status of every tessera program, from one table.

0 is success; 2 is the caller's mistake (a flag, a variable, a file or a key that cannot
be used: fix the input and run again); 1 is anything else (the cluster said no, the
program failed). A usage error found by the parser itself is 2 as well (`CliParser`).
"""

from __future__ import annotations

from typing import Final

from tessera.errors import ErrorTable, InputError, TesseraError

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2

EXIT_CODES: Final[ErrorTable[int]] = ErrorTable(
    "exit status of every command",
    {
        TesseraError: EXIT_FAILURE,
        InputError: EXIT_USAGE,
    },
)
"""Error class -> exit status, for every program (subclasses take their nearest row)."""


def exit_code(error: BaseException) -> int:
    """The exit status for `error`."""
    return EXIT_CODES.lookup(error)
