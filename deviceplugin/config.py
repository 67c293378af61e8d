"""tessera-device-plugin's settings: each field declares its flag (tessera_cli.flags)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from deviceplugin.backend import BACKENDS
from deviceplugin.health import (
    DEFAULT_IGNORED_XIDS,
    DEFAULT_QUERY_INTERVAL_S,
    DEFAULT_QUIET_PERIOD_S,
    parse_xid_list,
)
from deviceplugin.inventory import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    DEFAULT_LEASE_DURATION_S,
    DEFAULT_RESYNC_INTERVAL_S,
)
from deviceplugin.server import (
    DEFAULT_PLUGIN_DIR,
    DEFAULT_POD_RESOURCES_SOCKET,
    DEFAULT_SOCKET_POLL_S,
)
from deviceplugin.usage_monitor import DEFAULT_USAGE_INTERVAL_S
from tessera.resources import (
    DEFAULT_HEARTBEAT_NAMESPACE,
    DEFAULT_INTEGRITY_KEY_FILE,
    DEFAULT_MEMORY_UNIT_MIB,
)
from tessera_cli.flags import FlagGroup
from tessera_cli.values import namespace, non_empty, whole
from tessera_edge.node_cli import (
    LOGS_AND_METRICS,
    hami_core_library_flag,
    host_root_flag,
    isolation_flag,
    mps_pipe_dir_flag,
    node_name_flag,
)

MAX_MEMORY_UNIT_MIB = 1 << 20
"""Largest gpu-memory unit (1 TiB); the real check is against the smallest GPU, later."""

_DISCOVERY = FlagGroup("discovery")
_KUBELET = FlagGroup("kubelet")
_HEALTH = FlagGroup("health")
_INVENTORY = FlagGroup("inventory")
_USAGE = FlagGroup("usage")
_ISOLATION = FlagGroup(
    "isolation layer",
    "What limits GPU shares on this node, as the NRI hook is told (give both the same "
    "values): probed at start and on every health query, published in the NodeDevices "
    "object (spec.isolation) and the tessera.dev/isolation label. The scheduler places no "
    "new GPU share on a node whose layer is down.",
)
_OUTPUT = LOGS_AND_METRICS


def _xids(text: str) -> frozenset[int]:
    try:
        return parse_xid_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicePluginConfig:
    backend: str = _DISCOVERY.choice(
        "where GPUs come from: nvml (the driver), fake (--topology), or auto (NVML when its "
        "library loads, else --topology if given). Default: %(default)s.",
        BACKENDS,
        "auto",
    )
    topology: str | None = _DISCOVERY.flag(
        "topology file (YAML/JSON, the inventory schema) or built-in name for the fake "
        "backend; a broken GPU/NIC entry is skipped with an error naming the field",
        metavar="FILE|NAME",
    )
    rdma: str = _DISCOVERY.choice(
        "where RDMA NICs come from: sysfs (+netlink), the topology file, or off; auto means "
        "the topology file with the fake backend and sysfs otherwise. Default: %(default)s.",
        ("auto", "sysfs", "topology", "off"),
        "auto",
    )
    sysfs_root: str = _DISCOVERY.directory(
        "sysfs mount to read PCI topology and /class/infiniband from. Default: %(default)s.",
        "/sys",
    )
    no_netlink: bool = _DISCOVERY.switch(
        "read NICs from sysfs only (netlink via pyroute2 adds interface names, link and VF "
        "state, and about 20 MB of memory)"
    )
    node_name: str = node_name_flag(_DISCOVERY, "the NodeDevices object, Lease and labels")

    device_plugin_dir: str = _KUBELET.directory(
        "the kubelet's device-plugins directory; one socket per resource is created here. "
        "Default: %(default)s.",
        DEFAULT_PLUGIN_DIR,
    )
    kubelet_socket: str | None = _KUBELET.path(
        "the kubelet's registration socket. Default: <device-plugin-dir>/kubelet.sock."
    )
    memory_unit_mib: int = _KUBELET.flag(
        "size of one tessera.dev/gpu-memory unit; published in the inventory so the "
        "scheduler converts the same way. A unit so small that a resource would need over "
        "32768 IDs is refused. Default: %(default)s.",
        type=whole(1, MAX_MEMORY_UNIT_MIB),
        default=DEFAULT_MEMORY_UNIT_MIB,
        metavar="MIB",
    )
    nvidia_gpu: bool = _KUBELET.switch(
        "also advertise whole GPUs as nvidia.com/gpu (only for clusters that do not run "
        "NVIDIA's device plugin). Default: off."
    )
    no_rdma_resource: bool = _KUBELET.switch(
        "do not advertise tessera.dev/rdma even when the node has RDMA NICs"
    )
    socket_poll_interval: float = _KUBELET.duration(
        "how often the sockets are checked for a kubelet restart. Default: %(default)s.",
        default=DEFAULT_SOCKET_POLL_S,
    )
    pod_resources_socket: str = _KUBELET.path(
        "the kubelet's pod-resources socket (<kubelet root dir>/pod-resources/kubelet.sock): "
        "which containers already hold units, so GetPreferredAllocation finds the pod being "
        "admitted. Default: %(default)s.",
        DEFAULT_POD_RESOURCES_SOCKET,
    )
    integrity_key_file: str = _KUBELET.path(
        "PEM public key file, or directory of them (the Secret tessera-record-verify), that "
        "verify the scheduler's record signatures: GetPreferredAllocation follows only records "
        "that verify. Missing: records are not followed (the default choice is used). "
        "Default: %(default)s.",
        DEFAULT_INTEGRITY_KEY_FILE,
    )

    health_ignore_xids: frozenset[int] = _HEALTH.flag(
        "comma-separated XIDs that do not mark a GPU unhealthy (application errors); 'none' "
        "for an empty list. Default: "
        + ",".join(str(x) for x in sorted(DEFAULT_IGNORED_XIDS))
        + ".",
        type=_xids,
        default=DEFAULT_IGNORED_XIDS,
        metavar="LIST",
    )
    no_xid_health: bool = _HEALTH.switch(
        "do not watch NVML XID events (periodic queries still run)"
    )
    health_query_interval: float = _HEALTH.duration(
        "how often each GPU is queried and each NIC's ports re-read; 0 turns the queries off "
        "(and with them recovery, which needs normal answers). Default: %(default)s.",
        default=DEFAULT_QUERY_INTERVAL_S,
        allow_zero=True,
    )
    health_recovery_seconds: float = _HEALTH.duration(
        "quiet period after which an unhealthy GPU that answers NVML normally is Healthy "
        "again; 0 keeps it unhealthy until the agent restarts. Default: %(default)s.",
        default=DEFAULT_QUIET_PERIOD_S,
        allow_zero=True,
    )

    no_inventory: bool = _INVENTORY.switch(
        "run without a cluster: no NodeDevices object, labels or Lease (demo, tests)"
    )
    kubeconfig: str | None = _INVENTORY.flag(
        "kubeconfig to reach the API server. Default: $KUBECONFIG, else the pod's service "
        "account (in-cluster) unless ~/.kube/config exists.",
        metavar="FILE",
        default_factory=lambda: os.environ.get("KUBECONFIG") or None,
    )
    kube_context: str | None = _INVENTORY.flag(
        "kubeconfig context to use", type=non_empty, metavar="NAME"
    )
    heartbeat_namespace: str = _INVENTORY.flag(
        "namespace of the heartbeat Lease. Default: %(default)s.",
        type=namespace,
        default=DEFAULT_HEARTBEAT_NAMESPACE,
        metavar="NS",
    )
    heartbeat_interval: float = _INVENTORY.duration(
        "how often the Lease is renewed. Default: %(default)s.",
        default=DEFAULT_HEARTBEAT_INTERVAL_S,
    )
    lease_duration: int = _INVENTORY.flag(
        "the Lease's leaseDurationSeconds; the scheduler treats an agent whose Lease is older "
        "than this as dead; must be longer than --heartbeat-interval. Default: %(default)s.",
        type=whole(1, 86400),
        default=DEFAULT_LEASE_DURATION_S,
        metavar="SECONDS",
    )
    gfd_labels: bool = _INVENTORY.switch(
        "also label the Node as NVIDIA GPU Feature Discovery does (nvidia.com/gpu.product, "
        ".memory, .count, .present, cuda.driver.*, cuda.runtime.*) so existing nodeSelectors "
        "work; only where GFD does not run (it owns those labels). Default: off."
    )
    resync_interval: float = _INVENTORY.duration(
        "how often the NodeDevices object and labels are compared with the API server even "
        "when nothing changed. Default: %(default)s.",
        default=DEFAULT_RESYNC_INTERVAL_S,
    )

    usage_interval: float = _USAGE.duration(
        "how often the agent reads which processes use each GPU (NVML), puts each on its pod "
        "and container (its cgroup in --proc-root) beside what the container was granted, "
        "and exports it (metrics, the heartbeat's tessera.dev/gpu-usage annotation); 0 "
        "turns it off. Default: %(default)s.",
        default=DEFAULT_USAGE_INTERVAL_S,
        allow_zero=True,
    )
    proc_root: str = _USAGE.directory(
        "the host's /proc, where NVML's process IDs (and the MPS control daemon's) are found "
        "(the DaemonSet runs in the host's PID namespace, so its own /proc is the host's). "
        "Default: %(default)s.",
        "/proc",
    )

    isolation: str | None = isolation_flag(
        _ISOLATION,
        "The agent reports whether it is in place (the library installed whole, the daemon "
        "running); give the NRI hook the same. Default: not reported (the scheduler then "
        "treats the node as before).",
    )
    hami_core_library: str = hami_core_library_flag(_ISOLATION)
    mps_pipe_dir: str = mps_pipe_dir_flag(_ISOLATION)
    host_root: str = host_root_flag(_ISOLATION)

    print_inventory: bool = _OUTPUT.switch(
        "discover, print the inventory (the NodeDevices spec) and the unit counts as JSON, "
        "and exit; to compare with `nvidia-smi -q` on a node"
    )
    # the flags every node program shares (tessera_edge.logs, tessera_cli.metrics)
    log_format: str
    log_level: str
    metrics_port: int
    metrics_address: str
