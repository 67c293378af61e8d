"""What the node-chaos case needs besides the node: pods whose containers report what they
got, the reports read back, the judgement of each against its pod's record, and the VF
netdevs as physical VFs behave when their namespace is deleted.

Every container of a chaos pod first writes one report file into a hostPath folder (one
file per start: restarts and init containers each leave their own) with the device nodes
it sees under /dev and /dev/infiniband, the network interfaces of its namespace and its
environment; then an app container sleeps and an init container exits. The test reads
the files after the storm and holds each against the record of the pod whose UID wrote it.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera import resources as rn
from tessera.allocation import ContainerAllocation, PodAllocation
from tests.e2e import pods as P  # noqa: N812 - read as 'pods.' everywhere
from tests.e2e.node import NETDEV_PREFIX, PEER_SUFFIX, links

PODS = int(os.environ.get("TESSERA_E2E_NODE_CHAOS_PODS", "200"))
"""Pods created (and deleted) during the storm, per containerd release."""
KILLS = int(os.environ.get("TESSERA_E2E_NODE_CHAOS_KILLS", "20"))
"""SIGKILLs of each of the four programs (NRI hook, node agent, containerd, kubelet)."""
LIVE = int(os.environ.get("TESSERA_E2E_NODE_CHAOS_LIVE", "10"))
"""Chaos pods that exist at once (the node has 8 GPUs: some wait Pending)."""
KILL_EVERY = float(os.environ.get("TESSERA_E2E_NODE_CHAOS_KILL_EVERY", "4.5"))
"""Mean seconds between two kills (of any program)."""
LIFETIME = (
    float(os.environ.get("TESSERA_E2E_NODE_CHAOS_MIN_LIFE", "5")),
    float(os.environ.get("TESSERA_E2E_NODE_CHAOS_MAX_LIFE", "30")),
)
"""Seconds a chaos pod exists before it is deleted, drawn uniformly, whatever its state."""
SEED = int(os.environ.get("TESSERA_E2E_SEED", "20260101"))
SETTLE = float(os.environ.get("TESSERA_E2E_NODE_CHAOS_SETTLE", "420"))
"""Seconds for the pods left after the storm to run or fail (generous: 2 shared cores)."""

PROGRAMS = ("nri-hook", "agent", "containerd", "kubelet")
LABEL = "tessera-e2e-chaos"
SEEN = "/seen"
"""Where the report folder is mounted in each container."""
END = "## end"


def report_command(container: str, then: str) -> list[str]:
    """Write this start's report to a file of its own (created exclusively), then `then`."""
    script = (
        f"n=0; while ! (set -C; : > {SEEN}/$POD_UID.{container}.$n) 2>/dev/null; "
        "do n=$((n+1)); done; "
        f"{{ echo '## dev'; ls /dev; echo '## ib'; ls /dev/infiniband 2>/dev/null; "
        f"echo '## net'; ls /sys/class/net; echo '## env'; env; echo '{END}'; }} "
        f"> {SEEN}/$POD_UID.{container}.$n; {then}"
    )
    return ["sh", "-c", script]


def chaos_pod(base: dict[str, Any], seen: Path) -> dict[str, Any]:
    """`base` (a pod for the node) with every container reporting into `seen`."""
    spec = base["spec"]
    base["metadata"]["labels"][LABEL] = "1"
    spec["volumes"] = [{"name": "seen", "hostPath": {"path": str(seen), "type": "Directory"}}]
    downward = [
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    ]
    for kind, then in (("initContainers", "true"), ("containers", "exec sleep 1000000")):
        for c in spec.get(kind) or []:
            c["command"] = report_command(c["name"], then)
            c["env"] = [*c.get("env", []), *downward]
            c["volumeMounts"] = [{"name": "seen", "mountPath": SEEN}]
    return base


KINDS: dict[str, dict[str, Any]] = {
    "share": {"limits": {rn.GPU: "25"}},
    "whole-nic": {
        "limits": {rn.GPU: "200", rn.RDMA: "100"},
        "annotations": {rn.RDMA_AFFINITY_ANNOTATION: "numa"},
    },
    "vf": {"limits": {rn.GPU_CORE: "30", rn.GPU_MEMORY: "10", rn.RDMA: "50"}, "pod_network": True},
    "multi": {
        "containers": [
            P.container("a", {rn.GPU: "50"}),
            P.container("b", {rn.GPU_CORE: "100"}),
            P.container("plain", {}),
        ]
    },
    "init": {
        "containers": [P.container("main", {rn.GPU: "100"})],
        "init": [P.container("setup", {rn.GPU: "50"})],
    },
}
"""Every kind the node must survive: shares, whole GPUs with a whole NIC, a VF share in a
pod network namespace, several containers (one without devices), an init container."""


@dataclass
class Report:
    """What one container start saw."""

    file: str
    pod_uid: str
    container: str
    devices: set[str]
    netdevs: set[str]
    env: list[tuple[str, str]]


def read_reports(seen: Path) -> tuple[list[Report], int]:
    """Every complete report, and how many files were cut short (a container killed in
    the few milliseconds it writes)."""
    reports, partial = [], 0
    for path in sorted(seen.iterdir()):
        uid, container, _ = path.name.split(".", 2)
        text = path.read_text(errors="replace")
        if not text.rstrip().endswith(END):
            partial += 1
            continue
        sections: dict[str, list[str]] = {}
        current = ""
        for line in text.splitlines():
            if line.startswith("## "):
                current = line[3:]
                sections[current] = []
            elif line.strip():
                sections[current].append(line.strip())
        devices = {f"/dev/{n}" for n in sections.get("dev", []) if n.startswith("nvidia")}
        devices |= {f"/dev/infiniband/{n}" for n in sections.get("ib", [])}
        netdevs = {n for n in sections.get("net", []) if n.startswith(NETDEV_PREFIX)}
        env = [e.partition("=")[::2] for e in sections.get("env", []) if "=" in e]
        reports.append(Report(path.name, uid, container, devices, netdevs, env))
    return reports, partial


def vf_netdevs(alloc: PodAllocation) -> set[str]:
    return {vf.netdev for c in alloc.containers for r in c.rdma for vf in r.vfs if vf.netdev}


@dataclass
class Judge:
    """Holds every report against its pod's record; collects what is wrong, naming the
    pod, the container and what it got."""

    granted: Callable[[ContainerAllocation | None], set[str]]
    check_env: Callable[[list[tuple[str, str]], ContainerAllocation | None], None]
    records: Mapping[str, PodAllocation | None]
    """Pod UID -> its record (None: the pod had none)."""
    pod_network: Mapping[str, bool]
    """Pod UID -> whether it had a network namespace of its own."""
    problems: list[str] = field(default_factory=list)

    def judge(self, r: Report) -> None:
        if r.pod_uid not in self.records:
            self.problems.append(f"{r.file}: a container of a pod the test never saw")
            return
        alloc = self.records[r.pod_uid]
        entry = (
            next((c for c in alloc.containers if c.name == r.container), None) if alloc else None
        )
        pod = f"{alloc.namespace}/{alloc.name}" if alloc else r.pod_uid
        where = f"pod {pod} container {r.container} ({r.file})"
        want = self.granted(entry)
        if r.devices != want:
            self.problems.append(
                f"{where}: got devices {sorted(r.devices)}, its record grants {sorted(want)}"
            )
        try:
            self.check_env(r.env, entry)
        except AssertionError:
            gpu_env = [(k, v) for k, v in r.env if "GPU" in v or k.startswith(("NVIDIA", "CUDA"))]
            self.problems.append(f"{where}: got environment {gpu_env}, its record grants {entry}")
        if self.pod_network.get(r.pod_uid) and alloc is not None:
            vfs = vf_netdevs(alloc)
            given = entry is not None and bool(entry.rdma)
            if (given and r.netdevs != vfs) or not r.netdevs <= vfs:
                self.problems.append(
                    f"{where}: got VF netdevs {sorted(r.netdevs)}, its record grants {sorted(vfs)}"
                )


@dataclass
class VfRefund:
    """The kernel hands a physical VF back to the host namespace when its pod's namespace
    is deleted with the VF still inside (the hook was down when the pod went). The suite's
    VFs are veth ends, which the kernel deletes instead, with their peer: this puts such
    a pair back, as the kernel would the VF. Counted, and reported."""

    names: Iterable[str]
    refunds: int = 0

    def check(self) -> None:
        host = links()
        for name in self.names:
            if name + PEER_SUFFIX not in host:  # the pair went with a deleted namespace
                if name in host:
                    subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)
                subprocess.run(
                    ["ip", "link", "add", name, "type", "veth", "peer", "name", name + PEER_SUFFIX],
                    check=True,
                    capture_output=True,
                    timeout=30,
                )
                self.refunds += 1


@dataclass
class KillPlan:
    """Who is killed next and when: each program KILLS times at least, at random moments
    (exponential gaps of mean KILL_EVERY), the least killed first among ties."""

    rng: random.Random
    kills: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROGRAMS, 0))

    def gap(self) -> float:
        return self.rng.expovariate(1 / KILL_EVERY)

    def next_victim(self) -> str:
        behind = [p for p in PROGRAMS if self.kills[p] < KILLS] or list(PROGRAMS)
        fewest = min(self.kills[p] for p in behind)
        weights = [3 if self.kills[p] == fewest else 1 for p in behind]
        return self.rng.choices(behind, weights)[0]

    @property
    def done(self) -> bool:
        return all(n >= KILLS for n in self.kills.values())
