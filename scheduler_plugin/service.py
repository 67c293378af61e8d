"""The running extender: the pieces wired together, with their life cycle.

start(): the informers list and watch; the HTTP servers serve at once (health and metrics
answer), but extender calls get 503 until every informer has synced and, with leader
election, this replica leads. A ticker re-checks heartbeats every second and reads back
assumed binds that the watch has not confirmed. stop(): the server, the informers and the
status writer stop; the leader Lease is released.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kube_edge.client import KubeClient
from kube_edge.informer import Informer
from kube_edge.leader import LeaderElector
from scheduler_plugin.decisions.binder import Binder
from scheduler_plugin.decisions.extender import Extender
from scheduler_plugin.decisions.gangs import Gangs
from scheduler_plugin.decisions.nudger import Nudger
from scheduler_plugin.decisions.verbs import Verbs
from scheduler_plugin.heap import limit_arenas
from scheduler_plugin.serving import limits
from scheduler_plugin.serving.app import App
from scheduler_plugin.serving.auth import TokenAuthorizer
from scheduler_plugin.serving.server import Server, requires_client_cert
from scheduler_plugin.state.cache import DEFAULT_HEARTBEAT_GRACE, Cache
from scheduler_plugin.views.debug import DebugViews
from scheduler_plugin.views.events import EVENT_REASONS, EventRecorder, PodEvent
from scheduler_plugin.views.metrics import Metrics
from scheduler_plugin.views.pending import Refusals
from scheduler_plugin.views.status_writer import StatusWriter
from scheduler_plugin.views.stranded_reporter import StrandedReporter
from scheduler_plugin.watches.informers import gang_informers, informers
from scheduler_plugin.watches.reconciler import Reconciler
from scheduler_plugin.watches.resign import has_legacy_keys, resign_legacy_records
from tessera.errors import RecordError
from tessera.gang.spec import PodGroupSource
from tessera.record import KeySource
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
                nvidia_gpu=options.manage_nvidia_gpu,
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
        self.metrics.attach(self.cache, self.gangs)
        self.leader: LeaderElector | None = None
        # without an election this replica is the one that serves (`_leading`): it says so
        self.metrics.leader.set(0 if options.leader_elect else 1)
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
        self.cache.problems.subscribe_fences(self._fence_changed)
        self.refusals = Refusals()
        self.verbs = Verbs(self.extender, self.binder, self.refusals)
        self.views = DebugViews(
            self.cache, self.gangs, self.refusals, max_watchers=limits.MAX_WATCHERS
        )
        self.cache.subscribe(self.views.feed)
        self.stranded = StrandedReporter(self.cache, self.events.warn, self.metrics.stranded)
        self.cache.subscribe(self.stranded.mark)
        self.cache.leases.subscribe_usage(self.views.feed)  # the page redraws use beside grants
        self.stopping = threading.Event()
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
        self._ticker: threading.Thread | None = None
        self._settled = False
        self._resign_pending = has_legacy_keys(keyring)

    def _app(self, role: str, tls: ssl.SSLContext | None) -> App:
        return App(
            self.verbs,
            self.views,
            self.metrics,
            self,
            self.client,
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
                self.cache.problems.check(every_node=sweep)
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
            for fence in self.cache.problems.fences():
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
