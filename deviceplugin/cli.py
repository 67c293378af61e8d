"""tessera-device-plugin: the node agent's command line."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from deviceplugin.backend import BackendError, GpuBackend, NicSource, TopologyError
from deviceplugin.backend_choice import open_backend
from deviceplugin.config import DevicePluginConfig
from deviceplugin.fake_backend import FakeBackend
from deviceplugin.health import XidPolicy
from deviceplugin.inventory import DriverVersions, cr_spec
from deviceplugin.metrics import DEFAULT_METRICS_PORT, agent_registry
from deviceplugin.units import LimitError, UnitConfig, socket_name, validate_resource_name
from tessera.errors import InventoryError
from tessera.model import NodeInventory
from tessera.resources import ALL_RESOURCES
from tessera_cli import CliParser, ConfigError, config_from
from tessera_cli.metrics import serve_metrics
from tessera_cli.paths import (
    check_directory,
    check_readable_file,
    check_socket_dir,
    check_socket_path,
)
from tessera_edge.logs import setup_logging
from tessera_edge.node_cli import node_parser, stop_on_signals
from tessera_edge.threads import name_os_threads
from tessera_edge.topology_file import BUILTIN_TOPOLOGIES

if TYPE_CHECKING:
    from deviceplugin.agent import Agent
    from deviceplugin.record_pods import RecordChooser
    from deviceplugin.usage_monitor import UsageMonitor
    from kube_edge.client import KubeClient
    from tessera.record import KeySource
    from tessera_edge.layer_probe import LayerProbe

log = logging.getLogger("deviceplugin")

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


def build_parser() -> CliParser:
    return node_parser(
        "tessera-device-plugin", DESCRIPTION, EPILOG, DevicePluginConfig, DEFAULT_METRICS_PORT
    )


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
    name_os_threads()
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
        agent = Agent(agent_config, backend, nics, layer=_layer_probe(config))
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
        keys = _record_keys(config)
        agent.chooser = _record_chooser(config, api, agent, keys) if keys else None
    else:
        api, keys = None, None
    try:
        agent.usage = _usage_monitor(config, agent, api, keys)
    except ConfigError:
        backend.close()
        raise
    return _serve(agent, config.metrics_port, config.metrics_address)


def _usage_monitor(
    config: DevicePluginConfig, agent: Agent, api: KubeClient | None, keys: KeySource | None
) -> UsageMonitor | None:
    """The usage loop, unless --usage-interval is 0. Without a cluster (--no-inventory) it
    cannot name pods: container processes then count as no tessera container's. Without
    record keys, grants are read from records unverified (shown, never acted on)."""
    if config.usage_interval <= 0:
        return None
    from deviceplugin.usage_monitor import ApiPods, UsageMonitor

    check_directory("--proc-root", Path(config.proc_root))
    pods = None
    if api is not None:
        from deviceplugin.record_pods import list_node_pods

        client = api
        pods = ApiPods(
            lambda: list_node_pods(client, config.node_name, timeout_s=5.0),
            config.node_name,
            keys,
        )
    return UsageMonitor(
        agent.backend,
        agent.gpu_indexes,
        pods,
        proc_root=config.proc_root,
        interval_s=config.usage_interval,
    )


def _layer_probe(config: DevicePluginConfig) -> LayerProbe | None:
    """The isolation layer's probe, when --isolation names the layer to report."""
    if config.isolation is None:
        return None
    from tessera_edge.layer_probe import LayerPaths, LayerProbe

    return LayerProbe(
        LayerPaths(
            config.isolation,
            config.hami_core_library,
            config.mps_pipe_dir,
            root=config.host_root,
            proc_root=config.proc_root,
        )
    )


def _record_keys(config: DevicePluginConfig) -> KeySource | None:
    """The record keys (public), read once for everything that verifies records; None, with
    one warning, when they cannot be read."""
    from tessera.record_keys import KeyFileError
    from tessera_edge.keyfiles import KeyringSource

    try:
        return KeyringSource(config.integrity_key_file)
    except KeyFileError as exc:
        log.warning(
            "GetPreferredAllocation does not follow allocation records: %s "
            "(--integrity-key-file); the kubelet's units may name other GPUs than the "
            "records, and the usage loop reads grants from records unverified",
            exc,
        )
        return None


def _record_chooser(
    config: DevicePluginConfig, api: KubeClient, agent: Agent, keys: KeySource
) -> RecordChooser:
    """GetPreferredAllocation by the allocation record (only with record keys: records
    that cannot be verified must not steer the kubelet's units)."""
    from deviceplugin.record_pods import RecordChooser

    return RecordChooser(
        api,
        config.node_name,
        keys,
        lambda: agent.inventory,
        config.pod_resources_socket,
    )


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
    stop = stop_on_signals(log)
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
