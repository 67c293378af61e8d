"""Every name tessera shares with Kubernetes, defined once.

Resource names, annotation keys, labels and the inventory custom resource are imported
from here by every component; docs/resources.md documents them for users.
"""

from __future__ import annotations

from typing import Final

DOMAIN: Final = "tessera.dev"

# --- Extended resources (request == limit, integers) -------------------------------------
GPU_CORE: Final = f"{DOMAIN}/gpu-core"
"""Compute share in percent of one GPU; a multiple of 100 above 100 means whole GPUs."""
GPU_MEMORY_RATIO: Final = f"{DOMAIN}/gpu-memory-ratio"
"""Memory share in percent of one GPU's memory."""
GPU_MEMORY: Final = f"{DOMAIN}/gpu-memory"
"""GPU memory in units of the node's memory unit (default 1 GiB)."""
GPU: Final = f"{DOMAIN}/gpu"
"""Compute and memory together, in percent of one GPU (200 = two whole GPUs)."""
RDMA: Final = f"{DOMAIN}/rdma"
"""Share of an RDMA NIC (physical function) in percent (200 = two whole NICs)."""
NVIDIA_GPU: Final = "nvidia.com/gpu"
"""Whole GPUs, optional, for clusters that do not run NVIDIA's own device plugin."""

TESSERA_GPU_RESOURCES: Final = (GPU_CORE, GPU_MEMORY_RATIO, GPU_MEMORY, GPU)
"""tessera's GPU resources, in the order the node agent advertises them."""
TESSERA_RESOURCES: Final = (*TESSERA_GPU_RESOURCES, RDMA)
GPU_RESOURCES: Final = frozenset({*TESSERA_GPU_RESOURCES, NVIDIA_GPU})
"""Every resource granted on GPUs (all but RDMA)."""
ALL_RESOURCES: Final = (*TESSERA_RESOURCES, NVIDIA_GPU)

UNITS_PER_DEVICE: Final = 100
"""Units advertised per healthy device for the percent resources."""
DEFAULT_MEMORY_UNIT_MIB: Final = 1024

# --- Pod annotations ------------------------------------------------------------------------
ALLOCATION_ANNOTATION: Final = f"{DOMAIN}/allocation"
"""The scheduler's allocation record (JSON, see tessera.record). Only the scheduler writes it."""
GPU_MODEL_ANNOTATION: Final = f"{DOMAIN}/gpu-model"
GPU_UUID_ANNOTATION: Final = f"{DOMAIN}/gpu-uuid"
GPU_UUID_EXCLUDE_ANNOTATION: Final = f"{DOMAIN}/gpu-uuid-exclude"
TOPOLOGY_ANNOTATION: Final = f"{DOMAIN}/topology"
RDMA_AFFINITY_ANNOTATION: Final = f"{DOMAIN}/rdma-affinity"
PLACEMENT_ANNOTATION: Final = f"{DOMAIN}/placement"

NRI_REQUIRED_PLUGINS_ANNOTATION: Final = "required-plugins.noderesource.dev"
"""NRI's own key (containerd 2.2+ with the default validator enabled): a YAML list of NRI
plugin names that must be connected when a container is created, else the creation fails.
Scopes, most specific first: `<key>/container.<name>`, `<key>/pod`, `<key>`."""
NRI_REQUIRED_PLUGINS_POD_ANNOTATION: Final = f"{NRI_REQUIRED_PLUGINS_ANNOTATION}/pod"
"""The pod-scope form the scheduler writes with the record: the NRI hook's name, so no
container of a pod with a record is created while the hook is away (docs/nri_hook.md)."""
DEFAULT_NRI_PLUGIN_NAME: Final = "tessera"
"""The name the NRI hook registers under with containerd (its --plugin-name), which the
scheduler names in that annotation (its --nri-plugin-name)."""

HINT_ANNOTATIONS: Final = (
    GPU_MODEL_ANNOTATION,
    GPU_UUID_ANNOTATION,
    GPU_UUID_EXCLUDE_ANNOTATION,
    TOPOLOGY_ANNOTATION,
    RDMA_AFFINITY_ANNOTATION,
    PLACEMENT_ANNOTATION,
)

# --- Gangs (docs/gangs.md) ---------------------------------------------------------------------
POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
"""On a pod: the name of its gang's PodGroup, in the pod's namespace (scheduler-plugins'
coscheduling convention, which Kubeflow, JobSet and Kueue set up)."""
POD_GROUP_GROUP: Final = "scheduling.x-k8s.io"
POD_GROUP_VERSION: Final = "v1alpha1"
POD_GROUP_KIND: Final = "PodGroup"
POD_GROUP_PLURAL: Final = "podgroups"
GANG_REQUIRED_TOPOLOGY_ANNOTATION: Final = f"{DOMAIN}/gang-required-topology"
"""On a gang's pods: a node label key; every member on nodes sharing that label's value, or
none placed."""
GANG_PREFERRED_TOPOLOGY_ANNOTATION: Final = f"{DOMAIN}/gang-preferred-topology"
"""On a gang's pods: a node label key; the members on as few of its values as possible."""
GANG_RESERVED_ANNOTATION: Final = f"{DOMAIN}/gang-reserved-node"
"""Written by the scheduler on a member whose gang is reserved: the node kept for it. The
write itself is the point: kube-scheduler retries an unschedulable pod when it changes."""
GANG_NUDGED_ANNOTATION: Final = f"{DOMAIN}/gang-nudged-at"
"""Written with `GANG_RESERVED_ANNOTATION`: when (RFC 3339, microseconds). It makes every
nudge a change, also when the node kept is the one the last nudge named (a gang reserved
again on the same node after its reservation timed out): a patch that changes nothing
sends kube-scheduler no event, and the member would wait for its periodic flush."""
DEFAULT_GANG_TIMEOUT_SECONDS: Final = 60
"""How long a gang's reservation waits for its members to bind when the PodGroup sets no
scheduleTimeoutSeconds."""

# --- Node labels written by the node agent ---------------------------------------------------
GPU_MODEL_LABEL: Final = f"{DOMAIN}/gpu-model"
GPU_COUNT_LABEL: Final = f"{DOMAIN}/gpu-count"
GPU_MEMORY_LABEL: Final = f"{DOMAIN}/gpu-memory-mib"
ISOLATION_LABEL: Final = f"{DOMAIN}/isolation"
"""The node's GPU isolation layer (hami-core, mps or none; tessera.isolation), so a pod can
choose one with a nodeSelector. Whether the layer is up is in the NodeDevices object."""

# --- The node inventory custom resource ----------------------------------------------------
INVENTORY_GROUP: Final = DOMAIN
INVENTORY_VERSION: Final = "v1alpha1"
INVENTORY_KIND: Final = "NodeDevices"
INVENTORY_PLURAL: Final = "nodedevices"
INVENTORY_API_VERSION: Final = f"{INVENTORY_GROUP}/{INVENTORY_VERSION}"
INVENTORY_PATH: Final = f"/apis/{INVENTORY_API_VERSION}/{INVENTORY_PLURAL}"
"""The NodeDevices collection in the API (cluster-scoped)."""

# --- Node agent heartbeat --------------------------------------------------------------------
HEARTBEAT_LEASE_PREFIX: Final = "tessera-node-"
"""Lease name = prefix + node name, in the heartbeat namespace."""
DEFAULT_HEARTBEAT_NAMESPACE: Final = "tessera-system"
USAGE_ANNOTATION: Final = f"{DOMAIN}/gpu-usage"
"""On the heartbeat Lease: what each container really uses of its GPUs (tessera.usage), as
the node agent last read it; written with each renewal, so it costs no write of its own."""

# --- Allocation record integrity ---------------------------------------------------------------
DEFAULT_INTEGRITY_KEY_FILE: Final = "/etc/tessera/record-keys"
"""Where the record keys' Secret is mounted: private keys for tessera-scheduler, public keys
on the nodes (a directory, one PEM file per key ID; docs/record.md)."""

# --- Placement policies (node choice and GPU choice inside a node) ----------------------------
POLICY_BINPACK: Final = "binpack"
POLICY_SPREAD: Final = "spread"
POLICY_FRAGMENTATION: Final = "fragmentation"
PLACEMENT_POLICIES: Final = (POLICY_BINPACK, POLICY_SPREAD, POLICY_FRAGMENTATION)
DEFAULT_POLICY: Final = POLICY_FRAGMENTATION
