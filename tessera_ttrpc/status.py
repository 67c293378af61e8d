"""Call status: the gRPC status codes that ttrpc uses, and the error a call raises."""

from __future__ import annotations

from enum import IntEnum

from protos.ttrpc import ttrpc_pb2
from tessera_ttrpc.errors import TtrpcError


class Code(IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def code_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return f"CODE_{code}"


class RpcError(TtrpcError):
    """A call that ended with a non-OK status (raised by clients, and by handlers to
    choose the status the peer gets)."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code_name(code)}: {message}")

    def to_status(self) -> ttrpc_pb2.Status:
        return ttrpc_pb2.Status(code=int(self.code), message=self.message)

    @classmethod
    def from_status(cls, status: ttrpc_pb2.Status) -> RpcError:
        return cls(status.code, status.message)


class ConnectionClosedError(RpcError):
    """The connection ended before the call completed (or was already closed)."""

    def __init__(self, message: str = "ttrpc connection closed") -> None:
        super().__init__(Code.UNAVAILABLE, message)
