"""The root of every tessera error, the core's error types, and `ErrorTable`.

Every exception that leaves a component (an HTTP answer, a gRPC or ttrpc status, an exit
status, an Event or a log line) is a `TesseraError`; each edge says what each class becomes
in one `ErrorTable` in its own module. The tree and the tables: docs/errors.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class TesseraError(Exception):
    """Base class of every tessera error: the default row of every edge table."""


class InputError(TesseraError):
    """What a user or a client gave is wrong (a flag, a file, a request, a record): theirs
    to fix. Edges answer it as the caller's mistake (HTTP 4xx, INVALID_ARGUMENT, exit
    status 2), never as a server failure."""


class InventoryError(InputError):
    """A device inventory (topology file, custom resource, sysfs reading) is invalid.

    `source` names the file or object and `field` the offending field path, so the
    message can point an operator at the exact line to fix.
    """

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        super().__init__(f"{source}: {field}: {problem}")


class RequestError(InputError):
    """A pod's device request breaks a rule; names the container, resource and rule."""

    def __init__(self, container: str | None, resource: str | None, rule: str) -> None:
        self.container = container
        self.resource = resource
        self.rule = rule
        where = []
        if container is not None:
            where.append(f'container "{container}"')
        if resource is not None:
            where.append(resource)
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {rule}" if prefix else rule)


class GangError(InputError):
    """A gang's PodGroup, or a member's gang label or annotation, is invalid; the message
    names the gang and the field. Only that gang waits."""


class RecordError(InputError):
    """An allocation record is malformed, from an unknown schema, or fails integrity."""


class RecordVersionError(RecordError):
    """An allocation record of a schema major version this build does not read (written by
    a newer or an unknown release), or whose version fields are not integers."""


class RecordMismatchError(RecordError):
    """A well-formed record that belongs to another pod UID or another node (copied)."""


class IntegrityError(RecordError):
    """An allocation record's integrity proof is missing or does not verify."""


class StateError(TesseraError):
    """A change to cluster state would break an invariant (double allocation, unknown device)."""


class ErrorTable(Generic[T]):
    """What one edge returns for each error class.

    `lookup` walks the class's MRO, so a subclass gets its nearest listed ancestor's row;
    `TesseraError`'s row is required and is the answer for anything else (an unexpected
    exception included). `carried` names classes whose instances carry their own answer in
    an attribute (an RPC error raised to choose its status): their attribute wins over rows.
    """

    def __init__(
        self,
        edge: str,
        rows: Mapping[type[BaseException], T],
        *,
        carried: Mapping[type[BaseException], str] | None = None,
    ) -> None:
        if TesseraError not in rows:
            raise ValueError(f"{edge}: the table needs a TesseraError row (its default)")
        self.edge = edge
        self.rows: Mapping[type[BaseException], T] = dict(rows)
        self.carried: Mapping[type[BaseException], str] = dict(carried or {})

    def row_class(self, cls: type[BaseException]) -> type[BaseException]:
        """The class whose row (or carried attribute) answers for `cls`."""
        for base in cls.__mro__:
            if base in self.carried or base in self.rows:
                return base
        return TesseraError

    def lookup(self, error: BaseException | type[BaseException]) -> T:
        """The row for an error (instance or class); an instance of a carried class gives
        the value it carries."""
        cls = error if isinstance(error, type) else type(error)
        found = self.row_class(cls)
        attr = self.carried.get(found)
        if attr is not None:
            if isinstance(error, type):
                raise TypeError(f"{cls.__name__} carries its own answer: look up an instance")
            value: T = getattr(error, attr)
            return value
        return self.rows[found]
