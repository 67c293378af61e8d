"""tessera-device-plugin: the node agent's command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from deviceplugin.backend import (
    BACKENDS,
    BackendError,
    GpuBackend,
    NicSource,
    TopologyError,
    open_backend,
)
from deviceplugin.config import DevicePluginConfig
from deviceplugin.fake_backend import FakeBackend
from deviceplugin.health import DEFAULT_IGNORED_XIDS, XidPolicy, parse_xid_list
from deviceplugin.inventory import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    DEFAULT_LEASE_DURATION_S,
    DriverVersions,
    cr_spec,
)
from deviceplugin.metrics import DEFAULT_METRICS_PORT, agent_registry
from deviceplugin.server import DEFAULT_PLUGIN_DIR
from deviceplugin.units import LimitError, UnitConfig, socket_name, validate_resource_name
from tessera.errors import InventoryError
from tessera.model import NodeInventory
from tessera.resources import (
    ALL_RESOURCES,
    DEFAULT_HEARTBEAT_NAMESPACE,
    DEFAULT_MEMORY_UNIT_MIB,
)
from tessera_cli import CliParser, ConfigError, config_from
from tessera_cli.metrics import add_metrics_flags, serve_metrics
from tessera_cli.paths import (
    check_directory,
    check_readable_file,
    check_socket_dir,
    check_socket_path,
)
from tessera_cli.values import namespace, node_name, non_empty, seconds, whole
from tessera_edge.logs import add_log_flags, setup_logging
from tessera_edge.topology_file import BUILTIN_TOPOLOGIES

if TYPE_CHECKING:
    from deviceplugin.agent import Agent

log = logging.getLogger("deviceplugin")

MAX_MEMORY_UNIT_MIB = 1 << 20
"""Largest gpu-memory unit (1 TiB); the real check is against the smallest GPU, later."""

DESCRIPTION = """\
tessera's node agent. Discovers the node's GPUs (NVML, or a topology file) and RDMA NICs
(sysfs and netlink), advertises fractional resources to the kubelet through the device
plugin API (one socket per resource), watches device health, and publishes the node's
NodeDevices object, GPU labels and heartbeat Lease for the scheduler.
"""

EPILOG = f"""\
built-in topologies: {", ".join(BUILTIN_TOPOLOGIES)}
exit status: 0 after SIGTERM/SIGINT; 2 on a configuration error, printed as one line
naming the flag or its variable (a bad value, a directory where no socket can be created, a
missing, empty or unreadable topology file, no GPUs found, more unit IDs than the kubelet
can take).
docs: docs/deviceplugin.md
"""


def _xids(text: str) -> frozenset[int]:
    try:
        return parse_xid_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> CliParser:
    p = CliParser(
        prog="tessera-device-plugin",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = p.add_argument_group("discovery")
    d.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="where GPUs come from: nvml (the driver), fake (--topology), or auto (NVML when "
        "its library loads, else --topology if given). Default: %(default)s.",
    )
    d.add_argument(
        "--topology",
        metavar="FILE|NAME",
        help="topology file (YAML/JSON, the inventory schema) or built-in name for the fake "
        "backend; a broken GPU/NIC entry is skipped with an error naming the field",
    )
    d.add_argument(
        "--rdma",
        choices=("auto", "sysfs", "topology", "off"),
        default="auto",
        help="where RDMA NICs come from: sysfs (+netlink), the topology file, or off; auto "
        "means the topology file with the fake backend and sysfs otherwise. Default: "
        "%(default)s.",
    )
    d.add_argument(
        "--sysfs-root",
        default="/sys",
        metavar="DIR",
        help="sysfs mount to read PCI topology and /class/infiniband from. Default: %(default)s.",
    )
    d.add_argument(
        "--no-netlink",
        action="store_true",
        help="read NICs from sysfs only (netlink via pyroute2 adds interface names, link and "
        "VF state, and about 20 MB of memory)",
    )
    d.add_argument(
        "--node-name",
        type=node_name,
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="this node's name (the NodeDevices object, Lease and labels). Default: $NODE_NAME, "
        "else the host name (%(default)s).",
    )

    k = p.add_argument_group("kubelet")
    k.add_argument(
        "--device-plugin-dir",
        default=DEFAULT_PLUGIN_DIR,
        metavar="DIR",
        help="the kubelet's device-plugins directory; one socket per resource is created here. "
        "Default: %(default)s.",
    )
    k.add_argument(
        "--kubelet-socket",
        metavar="PATH",
        help="the kubelet's registration socket. Default: <device-plugin-dir>/kubelet.sock.",
    )
    k.add_argument(
        "--memory-unit-mib",
        type=whole(1, MAX_MEMORY_UNIT_MIB),
        default=DEFAULT_MEMORY_UNIT_MIB,
        metavar="MIB",
        help="size of one tessera.dev/gpu-memory unit; published in the inventory so the "
        "scheduler converts the same way. A unit so small that a resource would need over "
        "32768 IDs is refused. Default: %(default)s.",
    )
    k.add_argument(
        "--nvidia-gpu",
        action="store_true",
        help="also advertise whole GPUs as nvidia.com/gpu (only for clusters that do not run "
        "NVIDIA's device plugin). Default: off.",
    )
    k.add_argument(
        "--no-rdma-resource",
        action="store_true",
        help="do not advertise tessera.dev/rdma even when the node has RDMA NICs",
    )
    k.add_argument(
        "--socket-poll-interval",
        type=seconds(),
        default=0.1,
        metavar="SECONDS",
        help="how often the sockets are checked for a kubelet restart. Default: %(default)s.",
    )

    h = p.add_argument_group("health")
    h.add_argument(
        "--health-ignore-xids",
        type=_xids,
        default=DEFAULT_IGNORED_XIDS,
        metavar="LIST",
        help="comma-separated XIDs that do not mark a GPU unhealthy (application errors); "
        "'none' for an empty list. Default: "
        + ",".join(str(x) for x in sorted(DEFAULT_IGNORED_XIDS))
        + ".",
    )
    h.add_argument(
        "--no-xid-health",
        action="store_true",
        help="do not watch NVML XID events (periodic queries still run)",
    )
    h.add_argument(
        "--health-query-interval",
        type=seconds(allow_zero=True),
        default=5.0,
        metavar="SECONDS",
        help="how often each GPU is queried and each NIC's ports re-read; 0 turns the queries "
        "off (and with them recovery, which needs normal answers). Default: %(default)s.",
    )
    h.add_argument(
        "--health-recovery-seconds",
        type=seconds(allow_zero=True),
        default=300.0,
        metavar="SECONDS",
        help="quiet period after which an unhealthy GPU that answers NVML normally is Healthy "
        "again; 0 keeps it unhealthy until the agent restarts. Default: %(default)s.",
    )

    i = p.add_argument_group("inventory")
    i.add_argument(
        "--no-inventory",
        action="store_true",
        help="run without a cluster: no NodeDevices object, labels or Lease (demo, tests)",
    )
    i.add_argument(
        "--kubeconfig",
        metavar="FILE",
        default=os.environ.get("KUBECONFIG") or None,
        help="kubeconfig to reach the API server. Default: $KUBECONFIG, else the pod's "
        "service account (in-cluster) unless ~/.kube/config exists.",
    )
    i.add_argument(
        "--kube-context", type=non_empty, metavar="NAME", help="kubeconfig context to use"
    )
    i.add_argument(
        "--heartbeat-namespace",
        type=namespace,
        default=DEFAULT_HEARTBEAT_NAMESPACE,
        metavar="NS",
        help="namespace of the heartbeat Lease. Default: %(default)s.",
    )
    i.add_argument(
        "--heartbeat-interval",
        type=seconds(),
        default=DEFAULT_HEARTBEAT_INTERVAL_S,
        metavar="SECONDS",
        help="how often the Lease is renewed. Default: %(default)s.",
    )
    i.add_argument(
        "--lease-duration",
        type=whole(1, 86400),
        default=DEFAULT_LEASE_DURATION_S,
        metavar="SECONDS",
        help="the Lease's leaseDurationSeconds; the scheduler treats an agent whose Lease is "
        "older than this as dead; must be longer than --heartbeat-interval. Default: %(default)s.",
    )
    i.add_argument(
        "--gfd-labels",
        action="store_true",
        help="also label the Node as NVIDIA GPU Feature Discovery does (nvidia.com/gpu.product, "
        ".memory, .count, .present, cuda.driver.*, cuda.runtime.*) so existing nodeSelectors "
        "work; only where GFD does not run (it owns those labels). Default: off.",
    )
    i.add_argument(
        "--resync-interval",
        type=seconds(),
        default=300.0,
        metavar="SECONDS",
        help="how often the NodeDevices object and labels are compared with the API server "
        "even when nothing changed. Default: %(default)s.",
    )

    o = p.add_argument_group("logs and metrics")
    add_log_flags(o)
    add_metrics_flags(o, DEFAULT_METRICS_PORT)
    o.add_argument(
        "--print-inventory",
        action="store_true",
        help="discover, print the inventory (the NodeDevices spec) and the unit counts as "
        "JSON, and exit; to compare with `nvidia-smi -q` on a node",
    )
    return p


def _nic_source(config: DevicePluginConfig, backend: GpuBackend) -> NicSource | None:
    mode = config.rdma
    if mode == "off":
        return None
    if mode == "auto":
        mode = "topology" if isinstance(backend, FakeBackend) else "sysfs"
    if mode == "topology":
        if not isinstance(backend, FakeBackend):
            raise ConfigError("--rdma", "'topology' needs the fake backend (--backend fake)")
        return backend
    check_directory("--sysfs-root", Path(config.sysfs_root))
    from deviceplugin.rdma import Pyroute2Links, SysfsRdma
    from deviceplugin.sysfs import Sysfs

    return SysfsRdma(
        Sysfs(config.sysfs_root), link_source_factory=None if config.no_netlink else Pyroute2Links
    )


def _driver_versions(backend: object) -> DriverVersions:
    """The driver and CUDA versions for the GFD labels, from backends that know them."""
    versions = getattr(backend, "versions", None)
    return versions() if callable(versions) else DriverVersions()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    config = config_from(DevicePluginConfig, parser.parse_args(argv))
    setup_logging(config.log_format, config.log_level)
    try:
        return _run(config)
    except ConfigError as exc:
        return parser.fail(exc)


def _check_flags(config: DevicePluginConfig) -> None:
    """What the file system or several flags together must allow, before anything starts."""
    if config.lease_duration <= config.heartbeat_interval and not config.no_inventory:
        raise ConfigError(
            "--lease-duration",
            f"{config.lease_duration} s is not longer than --heartbeat-interval "
            f"({config.heartbeat_interval:g} s); the agent would look dead between renewals",
        )
    if config.topology and config.topology not in BUILTIN_TOPOLOGIES:
        path = Path(config.topology)
        check_readable_file("--topology", path)
        if path.stat().st_size == 0:
            raise ConfigError("--topology", f"{path} is empty")
    if config.kubeconfig and not config.no_inventory and not config.print_inventory:
        check_readable_file("--kubeconfig", Path(config.kubeconfig))


def _check_sockets(config: DevicePluginConfig) -> None:
    """The socket directory is usable (created if missing) and the kubelet socket plausible;
    only once discovery succeeded, so a bad topology does not leave a directory behind."""
    longest = max((socket_name(r) for r in ALL_RESOURCES), key=len)
    check_socket_dir("--device-plugin-dir", Path(config.device_plugin_dir), longest)
    if config.kubelet_socket:
        check_socket_path("--kubelet-socket", Path(config.kubelet_socket))


def _open_backend(config: DevicePluginConfig) -> GpuBackend:
    try:
        backend = open_backend(config.backend, config.topology, config.sysfs_root)
    except TopologyError as exc:
        raise ConfigError("--topology", str(exc)) from None
    except BackendError as exc:
        raise ConfigError(f"--backend {config.backend}", str(exc)) from None
    if not isinstance(backend, FakeBackend):
        check_directory("--sysfs-root", Path(config.sysfs_root))
    return backend


def _discovery_flag(config: DevicePluginConfig, backend: GpuBackend) -> str:
    return "--topology" if isinstance(backend, FakeBackend) else f"--backend {config.backend}"


def _run(config: DevicePluginConfig) -> int:
    from deviceplugin.agent import Agent, AgentConfig
    from deviceplugin.units import build_units

    _check_flags(config)
    units = UnitConfig(
        memory_unit_mib=config.memory_unit_mib,
        nvidia_gpu=config.nvidia_gpu,
        rdma=not config.no_rdma_resource,
    )
    backend = _open_backend(config)
    try:
        nics = _nic_source(config, backend)
        agent_config = AgentConfig(
            node_name=config.node_name,
            units=units,
            plugin_dir=Path(config.device_plugin_dir),
            kubelet_socket=Path(config.kubelet_socket) if config.kubelet_socket else None,
            xid_policy=XidPolicy(
                ignored=config.health_ignore_xids, enabled=not config.no_xid_health
            ),
            quiet_period_s=config.health_recovery_seconds,
            query_interval_s=config.health_query_interval,
            poll_interval_s=config.socket_poll_interval,
            resync_interval_s=config.resync_interval,
        )
        agent = Agent(agent_config, backend, nics)
        try:
            inventory = agent.discover()
            for resource in units.resources(inventory):
                validate_resource_name(resource)
        except LimitError as exc:
            flag = "--memory-unit-mib" if "--memory-unit-mib" in str(exc) else None
            raise ConfigError(flag or _discovery_flag(config, backend), str(exc)) from None
        _check_inventory(config, backend, inventory, agent.errors)
        if not config.print_inventory:
            _check_sockets(config)
    except ConfigError:
        backend.close()
        raise
    if config.print_inventory:
        report = {
            "spec": cr_spec(inventory),
            "units": {r: len(u.units) for r, u in build_units(inventory, units).items()},
            "errors": [str(e) for e in agent.errors],
        }
        print(json.dumps(report, indent=2))
        backend.close()
        return 0
    if not config.no_inventory:
        from deviceplugin.inventory import MAX_ANSWER_BYTES, InventoryConfig, InventoryPublisher
        from kube_edge.client import KubeClient

        try:
            api = KubeClient.connect(
                config.kubeconfig,
                config.kube_context,
                user_agent="tessera-device-plugin",
                max_response_bytes=MAX_ANSWER_BYTES,
            )
        except Exception as exc:  # ApiError; anything else the loaders may raise
            backend.close()
            flag = "--kubeconfig" if config.kubeconfig else "--kubeconfig (in-cluster)"
            detail = " ".join(str(exc).split())[:300]
            raise ConfigError(
                flag,
                f"cannot configure the Kubernetes client: {detail} (use --no-inventory to run "
                "without a cluster)",
            ) from None
        agent.publisher = InventoryPublisher(
            api,
            InventoryConfig(
                node_name=config.node_name,
                heartbeat_namespace=config.heartbeat_namespace,
                lease_duration_s=config.lease_duration,
                heartbeat_interval_s=config.heartbeat_interval,
                gfd_labels=_driver_versions(backend) if config.gfd_labels else None,
            ),
        )
    return _serve(agent, config.metrics_port, config.metrics_address)


def _check_inventory(
    config: DevicePluginConfig,
    backend: GpuBackend,
    inventory: NodeInventory,
    errors: Sequence[InventoryError],
) -> None:
    if not inventory.gpus:
        note = f" ({len(errors)} broken entries skipped; first: {errors[0]})" if errors else ""
        raise ConfigError(_discovery_flag(config, backend), f"no usable GPUs found{note}")
    smallest = min(g.memory_mib for g in inventory.gpus)
    if config.memory_unit_mib > smallest:
        raise ConfigError(
            "--memory-unit-mib",
            f"{config.memory_unit_mib} MiB is more than the smallest GPU's memory ({smallest} "
            "MiB): that GPU would have no tessera.dev/gpu-memory units",
        )


def _serve(agent: Agent, metrics_port: int = 0, metrics_address: str = "") -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if metrics_port:  # before the kubelet hears of us: a taken port is a usage error
        try:
            serve_metrics(agent_registry(agent), metrics_port, metrics_address)
        except ConfigError:
            agent.backend.close()
            raise
        log.info("metrics on %s:%d", metrics_address or "0.0.0.0", metrics_port)
    try:
        agent.start()
    except (OSError, RuntimeError) as exc:  # gRPC reports a failed bind as RuntimeError
        agent.stop()
        raise ConfigError("--device-plugin-dir", f"cannot serve: {exc}") from None
    log.info("serving %s", ", ".join(agent.units))
    while not stop.wait(1.0):
        pass
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
