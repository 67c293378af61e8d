"""kubectl tessera's settings: one frozen object built from the command line (or the
flags' `TESSERA_*` twins); the views read this, not argparse."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.resources import DEFAULT_HEARTBEAT_NAMESPACE, DEFAULT_NRI_PLUGIN_NAME, DEFAULT_POLICY


@dataclass(frozen=True, slots=True)
class KubectlConfig:
    command: str
    """nodes, pods, gangs or explain."""
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    output: str = "table"
    request_timeout: float = 30.0
    heartbeat_namespace: str = DEFAULT_HEARTBEAT_NAMESPACE
    node: str | None = None
    """nodes: only this node (None: every node)."""
    all_namespaces: bool = False
    """pods, gangs: every namespace."""
    pod: str = ""
    """explain: the pod's name."""
    policy: str = DEFAULT_POLICY
    """explain: the scheduler's --policy."""
    manage_nvidia_gpu: bool = False
    """explain, gangs: the scheduler runs with --manage-nvidia-gpu."""
    nri_plugin_name: str = DEFAULT_NRI_PLUGIN_NAME
    """explain: the scheduler's --nri-plugin-name."""
    require_nri_plugin: bool = True
    """explain: false when the scheduler runs with --no-require-nri-plugin."""
