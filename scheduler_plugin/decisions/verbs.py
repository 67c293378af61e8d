"""The extender verbs as the HTTP edge serves them: which part answers each, the outcome
each answer is counted under, and what follows an answer (a refused pod noted for the
page's "why pending", the filter's catch-up once kube-scheduler has its answer)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from scheduler_plugin.decisions.binder import BindApi, Binder
from scheduler_plugin.decisions.extender import Extender
from scheduler_plugin.views.pending import Refusals, top_reasons
from tessera.errors import RequestError
from tessera.request import PodRequest

log = logging.getLogger(__name__)


def _log_orphaned_bind(task: asyncio.Future[dict[str, Any]]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("a bind whose request was cancelled failed: %s", exc, exc_info=exc)


class Verbs:
    """filter, prioritize and preempt (the Extender) and bind (the Binder), answered."""

    def __init__(self, extender: Extender, binder: Binder, refusals: Refusals) -> None:
        self.extender = extender
        self.binder = binder
        self.refusals = refusals
        self._binds: set[asyncio.Future[dict[str, Any]]] = set()
        """Binds running on the extender's event loop (`bind_on_loop`)."""

    def call(self, verb: str, args: Any) -> tuple[Any, str]:
        """Answer one extender verb; returns (reply, outcome label for the metrics)."""
        if verb == "filter":
            reply = self.extender.filter(args)
            passed = reply.get("NodeNames") or (reply.get("Nodes") or {}).get("items") or []
            if not passed:
                self._refused(args, reply)
            return reply, "fit" if passed else "no_fit"
        if verb == "prioritize":
            return self.extender.prioritize_json(args), "ok"
        if verb == "bind":
            return self._bound(args, self.binder.bind(args))
        if verb == "preempt":
            result = self.extender.preempt(args)
            return result, "ok"
        raise ValueError(verb)

    def answered(self, verb: str) -> None:
        """Called once a verb's answer is written (on the serving loop): the work that
        can wait until kube-scheduler has its answer."""
        if verb == "filter":
            self.extender.catch_up()

    async def bind_on_loop(self, args: Any, api: BindApi) -> tuple[Any, str]:
        """`call("bind", args)` with the API calls awaited on the running event loop. The
        bind runs to its end even if the request is cancelled (a cancelled Binding would
        leave its devices assumed, or free them while the write may yet land)."""
        task = asyncio.ensure_future(self.binder.bind_with(args, api))
        # held until done (the loop keeps only weak references to tasks); its outcome is
        # taken even when nobody awaits it any more
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            # nobody reads this bind's end any more: a failure in it is logged, not lost
            task.add_done_callback(_log_orphaned_bind)
            raise
        return self._bound(args, result)

    async def bind_in_task(self, args: Any, api: BindApi) -> tuple[Any, str]:
        """`bind_on_loop` in the caller's task, for a caller that holds its task and
        never cancels it (HTTP/1.1's direct path): the bind's own task and shield cost two
        turns of the loop, each a wait behind whatever is ready on a busy scheduler."""
        return self._bound(args, await self.binder.bind_with(args, api))

    def _bound(self, args: Any, result: dict[str, Any]) -> tuple[Any, str]:
        if not result["Error"] and isinstance(args, dict):
            self.refusals.forget(str(args.get("PodUID", "")))
        return result, "refused" if result["Error"] else "bound"

    def _refused(self, args: Any, reply: Mapping[str, Any]) -> None:
        """Note a pod the filter passed no node for (the allocation page's "why pending")."""
        try:
            pod = args.get("Pod") if isinstance(args, Mapping) else None
            failed = {
                **(reply.get("FailedNodes") or {}),
                **(reply.get("FailedAndUnresolvableNodes") or {}),
            }
            if not isinstance(pod, Mapping) or not failed:
                return
            try:
                request: PodRequest | None = self.extender.request_of(pod)
            except RequestError:
                request = None
            if request is not None and not request.wants_devices:
                return
            self.refusals.note(pod, request, top_reasons(failed), len(failed))
        except Exception:
            log.exception("bug: noting a refused pod failed")
