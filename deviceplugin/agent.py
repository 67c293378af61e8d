"""The node agent: discovery once at start, then health, kubelet snapshots and the inventory.

Threads (all daemons, all stopped by `stop()`):
- `health-events`: blocks in the backend's XID event wait (1 s timeout) and marks GPUs;
- `health-query`: every `query_interval_s` asks each GPU whether it answers and re-reads
  each NIC's port states; GPUs recover after the quiet period, NICs as soon as every port
  is ACTIVE again; and probes the node's GPU isolation layer (tessera_edge.layer_probe),
  which the inventory carries as `isolation`;
- the plugin manager's watcher and registration threads (server.py);
- `inventory`: writes the NodeDevices object and labels when the inventory changed (and
  re-checks them every `resync_interval_s`), and renews the heartbeat Lease, which carries
  the last usage reading;
- `usage` (usage_monitor.py): every `usage_interval_s`, which processes use each GPU, whose
  they are and what their containers were granted.

Every health change produces a new immutable NodeInventory; from it the unit snapshots are
rebuilt, and only resources whose snapshot changed wake their ListAndWatch streams.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from deviceplugin.backend import GpuBackend, NicSource, XidEvent
from deviceplugin.health import (
    DEFAULT_QUERY_INTERVAL_S,
    DEFAULT_QUIET_PERIOD_S,
    HealthTracker,
    XidPolicy,
)
from deviceplugin.inventory import DEFAULT_RESYNC_INTERVAL_S, InventoryPublisher
from deviceplugin.rdma import port_health
from deviceplugin.server import DEFAULT_PLUGIN_DIR, DEFAULT_SOCKET_POLL_S, PluginManager
from deviceplugin.units import (
    ResourceUnits,
    UnitConfig,
    build_units,
    check_limits,
    validate_resource_name,
)
from kube_edge.errors import ApiError
from tessera.errors import InventoryError
from tessera.isolation import NodeIsolation
from tessera.model import NodeInventory

if TYPE_CHECKING:
    from deviceplugin.record_pods import RecordChooser
    from deviceplugin.usage_monitor import UsageMonitor
    from tessera_edge.layer_probe import LayerProbe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    units: UnitConfig = field(default_factory=UnitConfig)
    plugin_dir: Path = Path(DEFAULT_PLUGIN_DIR)
    kubelet_socket: Path | None = None
    xid_policy: XidPolicy = field(default_factory=XidPolicy)
    quiet_period_s: float = DEFAULT_QUIET_PERIOD_S
    query_interval_s: float = DEFAULT_QUERY_INTERVAL_S
    event_timeout_s: float = 1.0
    poll_interval_s: float = DEFAULT_SOCKET_POLL_S
    resync_interval_s: float = DEFAULT_RESYNC_INTERVAL_S
    retry_interval_s: float = 5.0
    """Wait after a failed API call before the next attempt."""


@dataclass(eq=False)
class Agent:
    config: AgentConfig
    backend: GpuBackend
    nic_source: NicSource | None = None
    publisher: InventoryPublisher | None = None
    clock: Callable[[], float] = time.monotonic
    chooser: RecordChooser | None = None
    """GetPreferredAllocation's record-based choice, if any."""
    usage: UsageMonitor | None = None
    """The usage loop, if on (started and stopped with the agent)."""
    layer: LayerProbe | None = None
    """Probes the node's GPU isolation layer (--isolation); None: not reported."""

    def __post_init__(self) -> None:
        config = self.config
        self.errors: list[InventoryError] = []
        """What discovery could not read (logged, and the rest is served)."""
        self._gpu_health = HealthTracker(config.quiet_period_s)
        self._nic_states: dict[str, tuple[str, ...]] = {}
        self._nic_unreadable: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._dirty = threading.Event()
        self._threads: list[threading.Thread] = []
        self._base = NodeInventory(config.node_name, memory_unit_mib=config.units.memory_unit_mib)
        self._inventory = self._base
        self._isolation: NodeIsolation | None = None
        self._units: dict[str, ResourceUnits] = {}
        self.manager: PluginManager | None = None
        self.inventory_error = ""
        """The last NodeDevices/labels failure; empty once a later attempt succeeds."""
        self.heartbeat_error = ""
        """The last heartbeat failure; empty once a later renewal succeeds."""

    # --- discovery ----------------------------------------------------------------------------

    def discover(self) -> NodeInventory:
        """Read the node's devices; raises LimitError if they cannot be advertised as configured."""
        found = self.backend.discover()
        nics, nic_errors = (
            self.nic_source.discover_nics() if self.nic_source is not None else ([], [])
        )
        self.errors = [*found.errors, *nic_errors]
        for error in self.errors:
            log.error("skipped a device: %s", error)
        gpus = tuple(sorted(found.gpus, key=lambda g: g.index))
        self._base = NodeInventory(
            self.config.node_name, gpus, tuple(nics), self.config.units.memory_unit_mib
        )
        self._gpu_health.track(g.uuid for g in gpus)
        self._nic_states = {n.ibdev: n.port_states for n in nics}
        layer = self._probe_layer()
        with self._lock:
            self._set_isolation(layer)
            self._refresh()
        check_limits(self._units, self.config.units.memory_unit_mib)
        log.info(
            "discovered %d GPU(s) and %d RDMA NIC(s) with the %s backend",
            len(gpus),
            len(nics),
            self.backend.name,
        )
        return self._inventory

    @property
    def inventory(self) -> NodeInventory:
        return self._inventory

    @property
    def units(self) -> dict[str, ResourceUnits]:
        return self._units

    def _refresh(self) -> None:
        """Rebuild the inventory from discovery + health; push what changed. Holds _lock."""
        gpus = []
        for gpu in self._base.gpus:
            healthy, reason = self._gpu_health.status(gpu.uuid)
            gpus.append(replace(gpu, healthy=healthy, health_reason=reason))
        nics = []
        for nic in self._base.nics:
            states = self._nic_states.get(nic.ibdev, nic.port_states)
            healthy, reason = port_health(states)
            if nic.ibdev in self._nic_unreadable:
                healthy, reason = False, self._nic_unreadable[nic.ibdev]
            nics.append(replace(nic, port_states=states, healthy=healthy, health_reason=reason))
        inventory = replace(
            self._base, gpus=tuple(gpus), nics=tuple(nics), isolation=self._isolation
        )
        if inventory == self._inventory and self._units:
            return
        self._inventory = inventory
        self._units = build_units(inventory, self.config.units)
        if self.manager is not None:
            changed = self.manager.update(self._units)
            if changed:
                log.info("new snapshot for %s", ", ".join(changed))
        self._dirty.set()

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Discover (if not done), serve every resource, then start health and inventory."""
        if not self._units:
            self.discover()
        resources = self.config.units.resources(self._inventory)
        for resource in resources:
            validate_resource_name(resource)  # the kubelet's rules, before anything listens
        self.manager = PluginManager(
            resources,
            self.config.plugin_dir,
            self.config.kubelet_socket,
            poll_interval_s=self.config.poll_interval_s,
            chooser=self.chooser,
        )
        self.manager.update(self._units)
        self.manager.start()
        if self.config.xid_policy.enabled:
            self._spawn("health-events", self._event_loop)
        if self.config.query_interval_s > 0:
            self._spawn("health-query", self._query_loop)
        if self.publisher is not None:
            self._spawn("inventory", self._inventory_loop)
        if self.usage is not None:
            self.usage.start()

    def gpu_indexes(self) -> dict[str, int]:
        """GPU UUID -> index, for the usage loop."""
        return {g.uuid: g.index for g in self._base.gpus}

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self.usage is not None:
            self.usage.stop()
        for thread in self._threads:
            thread.join(5)
        self.backend.close()
        if self.manager is not None:
            self.manager.stop()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until stop() (or the timeout); True if stopped."""
        return self._stop.wait(timeout_s)

    # --- health -------------------------------------------------------------------------------

    def apply_events(self, events: list[XidEvent]) -> None:
        now = self.clock()
        policy = self.config.xid_policy
        with self._lock:
            uuids = [g.uuid for g in self._base.gpus]
            for event in events:
                if not policy.is_critical(event.xid):
                    log.info("ignoring XID %d on %s (application error)", event.xid, event.uuid)
                    continue
                if event.uuid is None:
                    targets = uuids
                elif event.uuid in uuids:
                    targets = [event.uuid]
                else:
                    log.info("ignoring XID %d for unknown GPU %s", event.xid, event.uuid)
                    continue
                for uuid in targets:
                    if self._gpu_health.mark_unhealthy(uuid, event.detail, now):
                        log.warning("GPU %s is unhealthy: %s", uuid, event.detail)
            self._refresh()

    def _event_loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self.backend.wait_events(self.config.event_timeout_s)
            except Exception:
                log.exception("XID event wait")
                self._stop.wait(self.config.event_timeout_s)
                continue
            if events:
                self.apply_events(events)
                if any(e.uuid is None for e in events):  # a failing wait must not spin
                    self._stop.wait(self.config.event_timeout_s)

    def query_once(self) -> None:
        """Query every GPU and re-read every NIC's ports, then apply what was seen."""
        answers = {g.uuid: self.backend.query(g.uuid) for g in self._base.gpus}
        states: dict[str, tuple[str, ...]] = {}
        unreadable: dict[str, str] = {}
        if self.nic_source is not None:
            for nic in self._base.nics:
                try:
                    states[nic.ibdev] = self.nic_source.port_states(nic.ibdev)
                except InventoryError as exc:
                    unreadable[nic.ibdev] = f"ports unreadable: {exc}"
        layer = self._probe_layer()
        now = self.clock()
        with self._lock:
            self._set_isolation(layer)
            for uuid, problem in answers.items():
                if problem is None:
                    if self._gpu_health.observe_ok(uuid, now):
                        log.info("GPU %s is healthy again", uuid)
                elif self._gpu_health.mark_unhealthy(uuid, problem, now):
                    log.warning("GPU %s is unhealthy: %s", uuid, problem)
            self._nic_states.update(states)
            self._nic_unreadable = unreadable
            self._refresh()

    # --- the isolation layer ---------------------------------------------------------------

    def _probe_layer(self) -> NodeIsolation | None:
        """The layer as probed now (files only: no lock held); a probe that fails is the
        layer down, saying so."""
        if self.layer is None:
            return None
        try:
            return self.layer.probe()
        except Exception as exc:
            log.exception("probing the isolation layer")
            return NodeIsolation(
                self.layer.paths.layer, False, reason=f"the probe failed: {type(exc).__name__}"
            )

    def _set_isolation(self, found: NodeIsolation | None) -> None:
        """Keep what the probe found, logging a change. Holds _lock."""
        if found == self._isolation:
            return
        self._isolation = found
        if found is None:
            return
        if not found.up:
            log.warning(
                "isolation layer %s is down: %s; no new GPU share is placed on this node",
                found.layer,
                found.reason,
            )
            return
        commit = f", commit {found.commit[:12]}" if found.commit else ""
        version = f" (version {found.version}{commit})" if found.version else ""
        log.info("isolation layer %s is up%s", found.layer, version)

    def _query_loop(self) -> None:
        while not self._stop.wait(self.config.query_interval_s):
            try:
                self.query_once()
            except Exception:
                log.exception("health query")

    # --- inventory ----------------------------------------------------------------------------

    def _inventory_loop(self) -> None:
        """Heartbeat on its interval; NodeDevices and labels when dirty or due for resync.

        Failures (API server down, RBAC, an unexpected answer) are logged and retried after
        `retry_interval_s`; the thread never dies, and the kubelet side is not affected.
        """
        publisher = self.publisher
        assert publisher is not None
        cfg = self.config
        next_heartbeat = 0.0
        next_resync = 0.0
        next_publish = 0.0
        labels: object = None
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_heartbeat:
                try:
                    publisher.heartbeat(self.usage.annotation() if self.usage else None)
                    self.heartbeat_error = ""
                    next_heartbeat = now + publisher.config.heartbeat_interval_s
                except Exception as exc:
                    self.heartbeat_error = str(exc)
                    _log_api_failure("heartbeat Lease", exc)
                    next_heartbeat = now + min(
                        cfg.retry_interval_s, publisher.config.heartbeat_interval_s
                    )
            resync = now >= next_resync
            if (self._dirty.is_set() or resync) and now >= next_publish:
                self._dirty.clear()
                inventory = self._inventory
                try:
                    publisher.publish(inventory, force_check=resync)
                    wanted = publisher.labels(inventory)
                    if wanted != labels or resync:
                        publisher.update_labels(inventory)
                        labels = wanted
                    self.inventory_error = ""
                    if resync:
                        next_resync = now + cfg.resync_interval_s
                except Exception as exc:
                    self.inventory_error = str(exc)
                    _log_api_failure("node inventory", exc)
                    self._dirty.set()
                    next_publish = now + cfg.retry_interval_s
            wake = min(next_heartbeat, next_resync)
            if self._dirty.is_set():
                wake = min(wake, next_publish)
            delay = max(0.0, wake - time.monotonic())
            if self._dirty.is_set() and delay > 0:
                self._stop.wait(delay)
            else:
                self._dirty.wait(delay)


def _log_api_failure(what: str, exc: Exception) -> None:
    if isinstance(exc, ApiError):
        log.warning("%s: %s; retrying", what, exc)
    else:
        log.exception("%s: unexpected failure; retrying", what)
