"""Upgrade from HMAC records: re-sign each running pod's valid old record with Ed25519.

Releases before Ed25519 signed records with an HMAC key that every node held. Nodes now
accept only Ed25519, so a container restart in a pod with an old record would be refused.
Given the old key (--legacy-hmac-key-file), the scheduler trusts old records while it
rebuilds its state and, once synced and leading, rewrites each running pod's record with the
same allocation signed by its own key (a merge patch of the annotation, pinned to the pod's
UID). It runs once per process; a record that does not verify is left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

from kube_edge.client import KubeClient, pod_path
from kube_edge.errors import ApiError
from scheduler_plugin.state.values import Holds
from scheduler_plugin.watches.recovery import judge, record_text
from tessera.errors import TesseraError
from tessera.pod_fields import pod_identity
from tessera.record import LEGACY_MAC_ALGORITHM, KeySource, encode, signature_algorithm
from tessera.resources import ALLOCATION_ANNOTATION

log = logging.getLogger(__name__)

PAGE_SIZE: Final = 500
"""Pods per list page: the same order of size as the informers' pages."""


@dataclass
class Resigned:
    resigned: int = 0
    skipped: int = 0
    """Old records that do not verify with the legacy keys or no longer count (finished)."""
    failed: int = 0


def has_legacy_keys(keys: KeySource) -> bool:
    ring = keys.get()
    return ring is not None and bool(ring.legacy_key_ids)


def resign_legacy_records(client: KubeClient, keys: KeySource) -> Resigned:
    """Re-sign every valid HMAC record of a running pod; never raises for one bad pod."""
    outcome = Resigned()
    token = ""
    while True:
        query: dict[str, Any] = {"limit": PAGE_SIZE}
        if token:
            query["continue"] = token
        try:
            page = client.list("/api/v1/pods", **query)
        except ApiError as exc:
            log.error("cannot list pods to re-sign legacy HMAC records: %s", exc)
            outcome.failed += 1
            return outcome
        for pod in page.get("items") or []:
            if isinstance(pod, dict):
                _resign_one(client, keys, pod, outcome)
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            break
    log.info(
        "legacy HMAC records: %d re-signed with Ed25519, %d left alone, %d failed",
        outcome.resigned,
        outcome.skipped,
        outcome.failed,
    )
    return outcome


def _resign_one(client: KubeClient, keys: KeySource, pod: dict[str, Any], out: Resigned) -> None:
    text = record_text(pod)
    if text is None or signature_algorithm(text) != LEGACY_MAC_ALGORITHM:
        return
    uid, namespace, name = pod_identity(pod)
    verdict = judge(pod, keys)
    if not isinstance(verdict, Holds):
        out.skipped += 1
        return
    try:
        signed = encode(verdict.allocation, keys)
        patch = {"metadata": {"uid": uid, "annotations": {ALLOCATION_ANNOTATION: signed}}}
        client.merge_patch(pod_path(namespace, name), patch)
    except (ApiError, TesseraError) as exc:
        log.warning("cannot re-sign the record of %s/%s: %s", namespace, name, exc)
        out.failed += 1
        return
    out.resigned += 1
