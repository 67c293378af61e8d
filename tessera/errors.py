"""Error types of the core. Each names what is wrong so a user can fix it."""

from __future__ import annotations


class TesseraError(Exception):
    """Base class for every error the core raises on bad input."""


class InventoryError(TesseraError):
    """A device inventory (topology file, custom resource, sysfs reading) is invalid.

    `source` names the file or object and `field` the offending field path, so the
    message can point an operator at the exact line to fix.
    """

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        super().__init__(f"{source}: {field}: {problem}")


class RequestError(TesseraError):
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


class RecordError(TesseraError):
    """An allocation record is malformed, from an unknown schema, or fails integrity."""


class RecordMismatchError(RecordError):
    """A well-formed record that belongs to another pod UID or another node (copied)."""


class IntegrityError(RecordError):
    """An allocation record's integrity proof is missing or does not verify."""


class StateError(TesseraError):
    """A change to cluster state would break an invariant (double allocation, unknown device)."""
