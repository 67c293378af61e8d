"""Which container a process runs in, from its /proc/<pid>/cgroup text. Pure: no I/O.

The kubelet puts each pod in a cgroup named after its UID and the runtime each container in
one named after its ID, under either cgroup driver and either cgroup version:

    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, _ for ->.slice/
        cri-containerd-<64 hex>.scope                                (systemd driver)
    0::/kubepods/burstable/pod<uid>/<64 hex>                         (cgroupfs driver)
    5:memory:/kubepods/pod<uid>/<64 hex>                             (cgroup v1, Guaranteed)

The kubelet's own cgroup may sit under another (kind, or a kubelet in a systemd slice:
`/kubelet.slice/kubelet-kubepods.slice/...`), and a container may make cgroups below its
own; so the pod is the first path segment that names one, and the container the segment
right after it. cri-containerd-, crio-, docker- and plain IDs are known; CRI-O's conmon
(`crio-conmon-<id>.scope`) is not a container. Anything else is a process outside any pod.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

MAX_CGROUP_TEXT: Final = 64 * 1024
"""/proc/<pid>/cgroup has one line per hierarchy (about a dozen under cgroup v1)."""

_POD = re.compile(
    # the systemd driver prefixes a slice with its parents' names (kubepods-burstable-,
    # or kubelet-kubepods-burstable- for a kubelet under kubelet.slice, as kind runs it)
    r"^(?:[a-z0-9_]+(?:-[a-z0-9_]+)*-)?pod"
    r"([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
    r"|[0-9a-f]{32})"  # a static pod's UID is its config hash
    r"(?:\.slice)?$"
)
_CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    pod_uid: str
    """The pod's UID as the API server writes it (with dashes)."""
    container_id: str
    """The runtime's container ID (64 hex digits), as in the pod's containerStatuses."""


def container_of(cgroup_text: str) -> ContainerRef | None:
    """The container a process belongs to, or None for one outside any pod."""
    if len(cgroup_text) > MAX_CGROUP_TEXT:
        return None
    for line in cgroup_text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        ref = _from_path(path)
        if ref is not None:
            return ref
    return None


def _from_path(path: str) -> ContainerRef | None:
    parts = path.split("/")
    for i, part in enumerate(parts):
        pod = _POD.match(part)
        if pod is None:
            continue
        if i + 1 < len(parts):
            container = _CONTAINER.match(parts[i + 1])
            if container is not None:
                return ContainerRef(pod.group(1).replace("_", "-").lower(), container.group(1))
        return None  # the pod's own cgroup (a pause process) or not a container
    return None


def runtime_container_id(status_id: str) -> str:
    """The ID in a containerStatuses entry (`containerd://<id>`, `cri-o://<id>`) alone."""
    return status_id.rpartition("://")[2]
