"""The running extender: the pieces wired together, with their life cycle.

start(): the informers list and watch; the HTTP servers serve at once (health and metrics
answer), but extender calls get 503 until every informer has synced and, with leader
election, this replica leads. A ticker re-checks heartbeats every second and reads back
assumed binds that the watch has not confirmed. stop(): the server, the informers and the
status writer stop; the leader Lease is released.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from kube_edge.client import KubeClient
from kube_edge.informer import Informer
from kube_edge.leader import LeaderElector
from scheduler_plugin.decisions.binder import BindApi, Binder
from scheduler_plugin.decisions.extender import Extender
from scheduler_plugin.decisions.gangs import Gangs
from scheduler_plugin.decisions.nudger import Nudger
from scheduler_plugin.heap import limit_arenas
from scheduler_plugin.serving import limits
from scheduler_plugin.serving.app import App, ChangeFeed, Server, requires_client_cert
from scheduler_plugin.serving.auth import TokenAuthorizer
from scheduler_plugin.state.cache import DEFAULT_HEARTBEAT_GRACE, Cache
from scheduler_plugin.views import overview
from scheduler_plugin.views.events import EVENT_REASONS, EventRecorder, PodEvent
from scheduler_plugin.views.metrics import Metrics
from scheduler_plugin.views.pending import (
    EXPLAINED,
    Refusals,
    explanation,
    refusal_json,
    top_reasons,
)
from scheduler_plugin.views.status_writer import StatusWriter
from scheduler_plugin.views.stranded_reporter import StrandedReporter
from scheduler_plugin.watches.cluster import Reconciler, gang_informers, informers
from scheduler_plugin.watches.resign import has_legacy_keys, resign_legacy_records
from tessera.errors import RecordError, RequestError
from tessera.gang.spec import PodGroupSource
from tessera.record import KeySource
from tessera.request import PodRequest
from tessera.resources import (
    DEFAULT_GANG_TIMEOUT_SECONDS,
    DEFAULT_HEARTBEAT_NAMESPACE,
    DEFAULT_NRI_PLUGIN_NAME,
)

log = logging.getLogger(__name__)

HEARTBEAT_SWEEP_SECONDS = 60.0
"""How often the ticker re-checks every node's heartbeat rather than only those that just
ran out (a safety net; each second costs only the nodes whose heartbeat expired)."""


@dataclass(frozen=True, slots=True)
class Options:
    """What a running extender needs. tessera-scheduler's flags start from these defaults;
    an embedder (tests, the demo, benchmarks) builds one directly. Two differ on the command
    line: the policy (the flag defaults to the project's default policy) and the health
    port (the flag serves one, on 8081)."""

    host: str = "0.0.0.0"
    port: int = 8888
    policy: str = "binpack"
    leader_elect: bool = True
    leader_namespace: str = DEFAULT_HEARTBEAT_NAMESPACE
    leader_name: str = "tessera-scheduler"
    identity: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    heartbeat_namespace: str = DEFAULT_HEARTBEAT_NAMESPACE
    heartbeat_grace: float = DEFAULT_HEARTBEAT_GRACE
    require_heartbeat: bool = True
    watch_nodes: bool = True
    status_interval: float = 10.0
    write_status: bool = True
    manage_nvidia_gpu: bool = False
    nri_plugin: str | None = DEFAULT_NRI_PLUGIN_NAME
    """The NRI hook's name, written on each pod bound with a record as the plugin containerd
    must have connected to create its containers (None: not written)."""
    filter_answer: str = "best"
    """What filter answers when a pod fits (extender.FILTER_ANSWERS)."""
    gangs: bool = True
    """Place pods of one PodGroup all together or not at all (docs/gangs.md)."""
    gang_timeout: float = float(DEFAULT_GANG_TIMEOUT_SECONDS)
    """A reservation's wait for its members when the PodGroup sets no timeout."""
    max_body: int = limits.MAX_BODY_BYTES
    assume_ttl: float = 30.0
    health_host: str = "0.0.0.0"
    health_port: int | None = None
    """Plain-HTTP port for /healthz, /readyz and /metrics (None: no health server)."""
    open_debug: bool = False
    """Serve /debug without a client certificate or bearer token (tests, local use)."""


def default_identity() -> str:
    """The pod's name where the manifest passes it (POD_NAME, from the downward API):
    replicas with hostNetwork share the host name, and each is pid 1 in its own PID
    namespace, so hostname_pid alone would give two replicas one identity."""
    pod = os.environ.get("POD_NAME", "").strip()
    if pod:
        return f"{pod}_{socket.gethostname()}"
    return f"{socket.gethostname()}_{os.getpid()}"


def _log_orphaned_bind(task: asyncio.Future[dict[str, Any]]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("a bind whose request was cancelled failed: %s", exc, exc_info=exc)


class Service:
    def __init__(
        self,
        options: Options,
        client: KubeClient,
        keyring: KeySource,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        limit_arenas()  # before any thread of ours allocates (scheduler_plugin/heap.py)
        self.options = options
        self.client = client
        self.keyring = keyring
        self.metrics = Metrics()
        self.cache = Cache(
            options.policy,
            heartbeat_namespace=options.heartbeat_namespace,
            heartbeat_grace=options.heartbeat_grace,
            require_heartbeat=options.require_heartbeat,
        )
        self.metrics.attach(self.cache)
        self.extender = Extender(
            self.cache,
            self.metrics,
            manage_nvidia_gpu=options.manage_nvidia_gpu,
            answer=options.filter_answer,
            nri_plugin=options.nri_plugin,
        )
        self.nudger = Nudger(client, enabled=self._leading)
        self.gangs: Gangs | None = None
        self.gang_informers: list[Informer] = []
        if options.gangs:
            self.gangs = Gangs(
                self.cache,
                self.extender.parse,
                source=PodGroupSource(default_timeout=max(1, round(options.gang_timeout))),
                on_reserved=self.nudger.nudge,
            )
            self.extender.gangs = self.gangs
            self.gang_informers = gang_informers(client, self.gangs, metrics=self.metrics)
        self.reconciler = Reconciler(self.cache, keyring, assume_ttl=options.assume_ttl)
        self.binder = Binder(
            self.cache, self.extender, client, keyring, self.metrics, self.reconciler.signed
        )
        self.informers: list[Informer] = informers(
            client,
            self.cache,
            self.reconciler,
            heartbeat_namespace=options.heartbeat_namespace,
            watch_nodes=options.watch_nodes,
            metrics=self.metrics,
            on_labels=None if self.gangs is None else self.gangs.node_labels,
        )
        self.leader: LeaderElector | None = None
        if options.leader_elect:
            self.leader = LeaderElector(
                client,
                options.leader_namespace,
                options.leader_name,
                options.identity or default_identity(),
                lease_duration=options.lease_duration,
                renew_deadline=options.renew_deadline,
                retry_period=options.retry_period,
                on_change=self._leadership,
            )
        self.status_writer = StatusWriter(
            self.cache,
            client,
            interval=options.status_interval,
            enabled=self._leading,
            metrics=self.metrics,
        )
        self.events = EventRecorder(
            client, instance=options.identity or default_identity(), enabled=self._leading
        )
        self.cache.records.subscribe(self._fence_changed)
        self.refusals = Refusals()
        self._binds: set[asyncio.Future[dict[str, Any]]] = set()
        """Binds running on the extender's event loop (`bind_on_loop`)."""
        self._feeds: set[ChangeFeed] = set()
        self._feeds_lock = threading.Lock()
        self.cache.subscribe(self._feed)
        self.stranded = StrandedReporter(self.cache, self.events.warn, self.metrics.stranded)
        self.cache.subscribe(self.stranded.mark)
        self.cache.leases.subscribe_usage(self._feed)  # the page redraws use beside grants
        self.pool = ThreadPoolExecutor(limits.BLOCKING_WORKERS, thread_name_prefix="verb")
        self.watch_pool = ThreadPoolExecutor(limits.MAX_WATCHERS, thread_name_prefix="watch")
        self.authorizer = TokenAuthorizer(client)
        self.server = Server((options.host, options.port), self._app("extender", tls), tls=tls)
        self.health_server: Server | None = None
        if options.health_port is not None:
            try:
                self.health_server = Server(
                    (options.health_host, options.health_port), self._app("health", None), tls=None
                )
            except OSError:
                self.server.sock.close()
                raise
        self.stopping = threading.Event()
        self._ticker: threading.Thread | None = None
        self._settled = False
        self._resign_pending = has_legacy_keys(keyring)

    def _app(self, role: str, tls: ssl.SSLContext | None) -> App:
        return App(
            self,
            role=role,
            max_body=self.options.max_body,
            require_client_cert=requires_client_cert(tls),
            authorizer=self.authorizer,
            open_debug=self.options.open_debug,
            pool=self.pool,
            watch_pool=self.watch_pool,
        )

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> Service:
        for informer in [*self.informers, *self.gang_informers]:
            informer.start()
        if self.leader is not None:
            self.leader.start()
        self.server.start()
        if self.health_server is not None:
            self.health_server.start()
        self._ticker = threading.Thread(target=self._tick, daemon=True, name="ticker")
        self._ticker.start()
        if self.options.write_status:
            self.status_writer.start()
        self.events.start()
        self.nudger.start()
        log.info(
            "tessera-scheduler serving on %s:%d%s, health on %s (policy %s)",
            self.options.host,
            self.server.port,
            " (HTTPS)" if self.server.tls is not None else "",
            f"{self.options.health_host}:{self.health_server.port}"
            if self.health_server is not None
            else "no port",
            self.options.policy,
        )
        return self

    def stop(self, release: bool = True) -> None:
        self.stopping.set()
        self.server.stop()
        if self.health_server is not None:
            self.health_server.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.watch_pool.shutdown(wait=False, cancel_futures=True)
        for informer in [*self.informers, *self.gang_informers]:
            informer.stop()
        self.nudger.stop()
        self.status_writer.stop()
        self.events.stop()
        if self.leader is not None:
            self.leader.stop(release=release)
        self.client.close()

    def settle_memory(self) -> None:
        """After the initial sync: move everything alive into the GC's permanent generation
        and collect less often. The cluster state is a large, long-lived heap; without this,
        the cyclic GC walks it again and again during decisions (it doubled the median
        filter latency at 5,000 nodes). Objects still free by reference counting."""
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 100)
        self._settled = True

    def _tick(self) -> None:
        last_expiry = last_sweep = time.monotonic()
        while not self.stopping.wait(1.0):
            try:
                if not self._settled and self.synced:
                    self.settle_memory()
                if self._resign_pending and self.answering():
                    self._resign_pending = False  # once, by the leader (docs/record.md)
                    threading.Thread(
                        target=resign_legacy_records,
                        args=(self.client, self.keyring),
                        daemon=True,
                        name="resign",
                    ).start()
                sweep = time.monotonic() - last_sweep >= HEARTBEAT_SWEEP_SECONDS
                if sweep:
                    last_sweep = time.monotonic()
                self.cache.usability.check(every_node=sweep)
                if self.gangs is not None and self.answering():
                    self.gangs.tick()
                self.stranded.flush()
                now = time.monotonic()
                if now - last_expiry >= 5.0:
                    last_expiry = now
                    self.reconciler.expire_assumed(self.client, now)
                self.metrics.ready.set(1 if self.answering() else 0)
            except Exception:
                log.exception("ticker round failed")

    # --- readiness ----------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    def _leading(self) -> bool:
        return self.leader is None or self.leader.leading

    def _leadership(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if leading:
            self.status_writer.mark_all()
            for fence in self.cache.records.fences():
                self._fence_changed(fence.node, fence.pod, fence.uid, fence.problem)
            self.stranded.replay()

    def _fence_changed(self, node: str, key: str, uid: str, problem: str | None) -> None:
        """A pod started fencing its node: a Warning Event on the pod (rate-limited)."""
        if problem is None:
            return
        namespace, _, name = key.partition("/")
        message = (
            f"node {node} is fenced for new tessera pods: this pod's allocation record "
            f"cannot be trusted ({problem}), so the devices it uses are unknown; delete "
            "the pod or restore its record to lift the fence"
        )
        # a fence is a record that does not count: RecordError or StateError, one reason
        reason = EVENT_REASONS.lookup(RecordError)
        if reason is not None:
            self.events.warn(PodEvent(namespace, name, uid, reason, message))

    def answering(self) -> bool:
        return self.synced and self._leading() and not self.stopping.is_set()

    def readiness(self) -> tuple[bool, str]:
        if self.stopping.is_set():
            return False, "stopping"
        if not self.synced:
            waiting = [i.name for i in self.informers if not i.synced.is_set()]
            return False, f"waiting for the initial list of {', '.join(waiting)}"
        if not self._leading():
            return False, "not the leader"
        return True, "ok"

    def wait_ready(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.answering():
                return True
            time.sleep(0.01)
        return False

    # --- calls ----------------------------------------------------------------------------

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

    # --- debug views ------------------------------------------------------------------------

    def debug_overview(self) -> dict[str, Any]:
        return self.cache.reading(overview.overview)

    def debug_search(self, query: str) -> dict[str, Any]:
        return self.cache.reading(lambda reading: overview.search(reading, query))

    def debug_pending(self, only: str | None = None) -> dict[str, Any]:
        """The pods tessera refused lately, newest first; the first EXPLAINED (or the pod
        `only`, namespace/name) with their explanation from the state as it is now."""
        now = time.time()
        refused = self.refusals.current(self.cache.pods.bound)
        if only is not None:
            refused = [r for r in refused if r.pod == only]
        out = []
        explained = 0
        for r in refused:
            entry = refusal_json(r, now)
            gang = None if self.gangs is None else self.gangs.key_of(r.uid)
            request = r.request
            if gang is not None:
                # placed whole or not at all: one pod's nearest fit would mislead
                entry["gang"] = str(gang)
            elif request is not None and explained < EXPLAINED:
                entry["explain"] = self.cache.reading(partial(explanation, request=request))
                explained += 1
            out.append(entry)
        gangs, total = ([], 0) if self.gangs is None else self.gangs.waiting()
        if only is not None:
            mine = {e["gang"] for e in out if "gang" in e}
            gangs = [g for g in gangs if g["gang"] in mine]
        return {
            "pods": out,
            "gangs": gangs,
            "gangsWaiting": total,
            "ttlS": self.refusals.ttl,
            "explained": EXPLAINED,
        }

    def debug_nodes(self) -> dict[str, Any]:
        views = [self.cache.node_view(n) for n in self.cache.node_names()]
        nodes = [n for n in views if n is not None]
        # countable: nodes whose agent wrote a usage annotation that does not read
        invalid = sum(1 for n in nodes if n["usage"]["invalid"])
        return {"nodes": nodes, "usageInvalid": invalid}

    def debug_pods(self) -> dict[str, Any]:
        summary = self.cache.pods_summary()
        if self.gangs is not None:
            summary |= self.gangs.summary()
        return summary

    def _feed(self, node: str) -> None:
        with self._feeds_lock:
            feeds = list(self._feeds)
        for feed in feeds:
            feed.add(node)

    def watchers_full(self) -> bool:
        with self._feeds_lock:
            return len(self._feeds) >= limits.MAX_WATCHERS

    def watch_changes(self) -> ChangeFeed:
        feed = ChangeFeed(self._drop_feed)
        with self._feeds_lock:
            self._feeds.add(feed)
        return feed

    def _drop_feed(self, feed: ChangeFeed) -> None:
        with self._feeds_lock:
            self._feeds.discard(feed)
