"""What the NRI hook answers containerd for each error: one table (NRI_ERRORS).

containerd fails the container creation (or the sandbox's) with the ttrpc status the hook
returns, and the kubelet shows its message in the pod's events and status. A bad or forged
record is the pod's problem (INVALID_ARGUMENT, PERMISSION_DENIED), a record this node
cannot honour is FAILED_PRECONDITION, anything else the hook's own failure (INTERNAL).
"""

from __future__ import annotations

from typing import Final

from nri_hook.netdev import NetdevError
from tessera.errors import (
    ErrorTable,
    InputError,
    IntegrityError,
    RecordMismatchError,
    TesseraError,
)
from tessera_ttrpc import Code, RpcError


class RejectError(TesseraError):
    """The container must not be created as asked. `code` is the gRPC status for the
    runtime, `reason` says what is wrong (naming the record field), `context` which pod
    and container it is about."""

    def __init__(self, code: int, reason: str, context: str = "") -> None:
        self.code = code
        self.reason = reason
        self.context = context
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return f"{self.context}: {self.reason}" if self.context else self.reason

    def with_context(self, context: str) -> RejectError:
        return RejectError(self.code, self.reason, context)


NRI_ERRORS: Final[ErrorTable[int]] = ErrorTable(
    "NRI hook: ttrpc status to containerd",
    {
        TesseraError: Code.INTERNAL,
        InputError: Code.INVALID_ARGUMENT,
        IntegrityError: Code.PERMISSION_DENIED,
        RecordMismatchError: Code.PERMISSION_DENIED,
        NetdevError: Code.FAILED_PRECONDITION,
    },
    carried={RejectError: "code", RpcError: "code"},
)
"""Error class -> ttrpc status code (subclasses take their nearest row). A `RejectError`
or an `RpcError` carries the code chosen where it was raised."""


def status_of(error: BaseException | type[BaseException]) -> int:
    """The ttrpc status code the runtime gets for `error`."""
    return NRI_ERRORS.lookup(error)
