"""tessera-device-plugin's settings: one frozen object built from the flags (or their
`TESSERA_*` twins); everything below the command line reads this, not argparse."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DevicePluginConfig:
    # discovery
    backend: str
    topology: str | None
    rdma: str
    sysfs_root: str
    no_netlink: bool
    node_name: str
    # kubelet
    device_plugin_dir: str
    kubelet_socket: str | None
    memory_unit_mib: int
    nvidia_gpu: bool
    no_rdma_resource: bool
    socket_poll_interval: float
    # health
    health_ignore_xids: frozenset[int]
    no_xid_health: bool
    health_query_interval: float
    health_recovery_seconds: float
    # inventory
    no_inventory: bool
    kubeconfig: str | None
    kube_context: str | None
    heartbeat_namespace: str
    heartbeat_interval: float
    lease_duration: int
    gfd_labels: bool
    resync_interval: float
    # logs and metrics
    log_format: str
    log_level: str
    metrics_port: int
    metrics_address: str
    print_inventory: bool
