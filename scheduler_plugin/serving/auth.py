"""Who may call what: the client certificate a connection verified (the extender verbs
need one when a client CA is set), and who may read /debug: a verified client
certificate, or a Kubernetes bearer token.

A token is checked the way the API server's own delegated authentication does it: a
TokenReview says who it belongs to, a SubjectAccessReview whether that user may `get` the
non-resource URL asked for (grant it with a ClusterRole rule on nonResourceURLs
["/debug", "/debug/*"]). Answers are kept for AUTH_CACHE_SECONDS, keyed by a hash of the
token, so polling clients cost the API server little and no token is kept in memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from scheduler_plugin.serving import limits

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    user: str = ""


class TokenAuthorizer:
    """TokenReview + SubjectAccessReview through the scheduler's API client. Thread-safe."""

    def __init__(
        self,
        client: KubeClient,
        *,
        ttl: float = limits.AUTH_CACHE_SECONDS,
        entries: int = limits.AUTH_CACHE_ENTRIES,
    ) -> None:
        self.client = client
        self.ttl = ttl
        self.entries = entries
        self._cache: OrderedDict[tuple[bytes, str], tuple[float, Decision]] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, token: str, path: str, verb: str = "get") -> Decision:
        key = (hashlib.sha256(token.encode()).digest(), f"{verb} {path}")
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        decision = self._review(token, path, verb)
        with self._lock:
            self._cache[key] = (now + self.ttl, decision)
            self._cache.move_to_end(key)
            while len(self._cache) > self.entries:
                self._cache.popitem(last=False)
        return decision

    def _review(self, token: str, path: str, verb: str) -> Decision:
        try:
            review = self.client.create(
                TOKEN_REVIEWS,
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    "spec": {"token": token},
                },
            )
            status = _mapping(review.get("status"))
            if status.get("authenticated") is not True:
                return Decision(False, "the bearer token is not valid")
            user = _mapping(status.get("user"))
            name = user.get("username")
            if not isinstance(name, str) or not name:
                return Decision(False, "the bearer token names no user")
            spec: dict[str, Any] = {
                "user": name,
                "nonResourceAttributes": {"path": path, "verb": verb},
            }
            for field in ("uid", "groups", "extra"):
                if user.get(field):
                    spec[field] = user[field]
            access = self.client.create(
                ACCESS_REVIEWS,
                {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SubjectAccessReview",
                    "spec": spec,
                },
            )
        except ApiError as exc:
            log.warning("cannot review a /debug token: %s", exc)
            return Decision(False, "the token could not be reviewed")
        if _mapping(access.get("status")).get("allowed") is True:
            return Decision(True, "allowed", name)
        return Decision(False, f"{name} may not {verb} {path}", name)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def client_cert_name(transport: asyncio.BaseTransport) -> str | None:
    """The subject of the client certificate the TLS handshake verified, if any."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    parts = [f"{k}={v}" for rdn in cert.get("subject", ()) for k, v in rdn]
    return ",".join(parts) or "(no subject)"


def client_cert(scope: Mapping[str, Any]) -> bool:
    """Whether the request (its ASGI scope) came with a verified client certificate."""
    tls = (scope.get("extensions") or {}).get("tls") or {}
    return bool(tls.get("client_cert_name"))
