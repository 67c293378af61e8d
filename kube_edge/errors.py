"""The one error the Kubernetes edge raises: the API server said no, or did not answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.errors import TesseraError

NO_ANSWER = 0
"""`status` when no HTTP answer came back (refused, timeout, TLS, unreadable answer)."""


class ApiError(TesseraError):
    """A non-2xx answer (or none) from the API server.

    `status` is the HTTP status (0: no answer), `reason` the Status object's machine-readable
    reason (`NotFound`, `Conflict`, `AlreadyExists`, `Expired`...; "" when the answer had
    none), `message` what the server or the client said, `body` the decoded answer."""

    def __init__(
        self,
        status: int,
        message: str,
        body: Mapping[str, Any] | None = None,
        *,
        reason: str = "",
    ) -> None:
        self.status = status
        self.message = message
        self.body: dict[str, Any] = dict(body or {})
        found = self.body.get("reason")
        self.reason = reason or (found if isinstance(found, str) else "")
        head = " ".join(part for part in (str(status) if status else "", self.reason) if part)
        super().__init__(": ".join(part for part in (head, message) if part))

    @property
    def transient(self) -> bool:
        """Whether the request may have succeeded or may succeed if retried."""
        return self.status in {NO_ANSWER, 429} or self.status >= 500

    @property
    def gone(self) -> bool:
        """410 Gone: the resourceVersion asked for is older than the server's history."""
        return self.status == 410
