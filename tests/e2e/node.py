"""A real node for the e2e suite: containerd (a given release, its own shim, runc), a
kubelet, tessera's node agent (device plugin) and NRI hook, and an offline busybox image.

The GPUs and NICs come from the fake backend; their device nodes are character devices
made with mknod under a private device root (the hook's --device-root), so runc creates
real device nodes in the containers and the OCI spec can be compared with the record.
Each RDMA VF's netdev is a real interface of the host (one end of a veth pair, under a
name of the suite's own), so the hook really moves it into a pod's network namespace.
Pods get that namespace from a bridge CNI network when the CNI plugins are installed.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.controlplane import (
    PYTHON_ENV,
    ROOT,
    ControlPlane,
    Proc,
    free_port,
    topology_for,
    wait_for,
)

IMAGE = "docker.io/library/busybox:tessera-e2e"
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
"""Fixed by the kubelet whatever its --root-dir: one kubelet per host at a time."""
NVIDIA_MAJOR = 195
UVERBS_MAJOR = 231
NETDEV_PREFIX = "tsr"
"""Netdev names in the node's topology get this prefix: the suite's interfaces are its own
(ib0v0 may be a real VF of an RDMA host) and a crashed run's are found by name."""
PEER_SUFFIX = "p"
"""The other end of each VF's veth pair stays in the host namespace under <name>p."""
CNI_BRIDGE = f"{NETDEV_PREFIX}e2e0"
CNI_SUBNET = "198.18.0.0/24"
"""Pod addresses from the benchmarking range (RFC 2544): never a network of the host. The
bridge has no address, so nothing is routed or forwarded to or from the pods."""


def node_host_or_skip(suite: str) -> Path:
    """The static busybox for the offline image, or skip the calling test module (at
    import) when this host cannot run a node: no containerd release, not root, or no
    busybox."""
    import pytest

    from tests.e2e import binaries

    if not binaries.containerd_releases():
        pytest.skip(
            f"{suite} needs containerd releases (${binaries.CONTAINERD_VAR}, or"
            f" containerd-* folders under ${binaries.FOLDER_VAR})",
            allow_module_level=True,
        )
    busybox = Path(os.environ.get("TESSERA_E2E_BUSYBOX") or shutil.which("busybox") or "")
    if os.geteuid() != 0 or not busybox.is_file():
        pytest.skip(
            f"{suite} needs root and a static busybox ($TESSERA_E2E_BUSYBOX)",
            allow_module_level=True,
        )
    return busybox


def busybox_image(path: Path, busybox: Path) -> Path:
    """An OCI image archive of a static busybox (`sleep` as entrypoint), for `ctr import`."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as tar:
        for d in ("bin", "dev", "proc", "sys", "etc", "tmp"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size = len(data)
        info.mode = 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in ("sh", "sleep", "cat", "ls", "env", "true"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    layer = layer_buf.getvalue()
    gz = gzip.compress(layer, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Entrypoint": ["/bin/sleep"], "Cmd": ["1000000"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha(layer)}"]},
        }
    ).encode()
    return oci_archive(
        path, IMAGE, config, (_desc("application/vnd.oci.image.layer.v1.tar+gzip", gz), gz)
    )


def oci_archive(
    path: Path, tag: str, config: bytes, layer: tuple[dict[str, Any], bytes | Path]
) -> Path:
    """An OCI image archive of one layer (its descriptor, and its bytes or file) tagged
    `tag`, for `ctr images import`."""
    layer_desc, layer_data = layer
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": _desc("application/vnd.oci.image.config.v1+json", config),
            "layers": [layer_desc],
        }
    ).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            _desc("application/vnd.oci.image.manifest.v1+json", manifest)
            | {
                "annotations": {
                    "io.containerd.image.name": tag,
                    "org.opencontainers.image.ref.name": tag.rsplit(":", 1)[-1],
                },
                "platform": {"architecture": "amd64", "os": "linux"},
            }
        ],
    }
    with tarfile.open(path, "w") as tar:
        for name, blob in [
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
            ("index.json", json.dumps(index).encode()),
            *((f"blobs/sha256/{_sha(b)}", b) for b in (config, manifest)),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
        layer_name = f"blobs/sha256/{layer_desc['digest'].split(':', 1)[1]}"
        if isinstance(layer_data, Path):
            tar.add(layer_data, arcname=layer_name)
        else:
            info = tarfile.TarInfo(layer_name)
            info.size = len(layer_data)
            tar.addfile(info, io.BytesIO(layer_data))
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _desc(media_type: str, data: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": f"sha256:{_sha(data)}", "size": len(data)}


def device_root(root: Path, gpus: int, uverbs: int) -> Path:
    """Character devices where the hook looks for the host's: NVIDIA GPUs and control
    devices, uverbs devices and rdma_cm, with the drivers' usual majors."""
    dev = root / "dev"
    (dev / "infiniband").mkdir(parents=True, exist_ok=True)
    nodes = {f"nvidia{i}": (NVIDIA_MAJOR, i) for i in range(gpus)}
    nodes |= {
        "nvidiactl": (NVIDIA_MAJOR, 255),
        "nvidia-uvm": (510, 0),
        "nvidia-uvm-tools": (510, 1),
    }
    nodes |= {f"infiniband/uverbs{i}": (UVERBS_MAJOR, 192 + i) for i in range(uverbs)}
    nodes["infiniband/rdma_cm"] = (10, 58)
    for name, (major, minor) in nodes.items():
        path = dev / name
        if not path.exists():
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
    return root


def own_netdevs(topology: Path) -> list[str]:
    """Give every netdev of the topology file the suite's prefix; return the VFs' names."""
    text = re.sub(r"(?m)^(\s*netdev: )(\S+)$", rf"\g<1>{NETDEV_PREFIX}\g<2>", topology.read_text())
    topology.write_text(text)
    doc = yaml.safe_load(text)
    return [vf["netdev"] for nic in doc.get("rdma") or [] for vf in nic.get("vfs") or []]


def _ip(*args: str, netns: str = "", check: bool = True) -> subprocess.CompletedProcess[str]:
    enter = ["nsenter", f"--net={netns}"] if netns else []
    return subprocess.run(
        [*enter, "ip", *args], capture_output=True, text=True, check=check, timeout=30
    )


def links(netns: str = "") -> set[str]:
    """Interface names in the host's network namespace, or in the one at path `netns`."""
    return {link["ifname"] for link in json.loads(_ip("-j", "link", "show", netns=netns).stdout)}


def make_vf_netdevs(names: list[str]) -> None:
    """One veth pair per VF: <name> plays the VF, <name>p stays behind in the host."""
    remove_own_netdevs()
    for name in names:
        _ip("link", "add", name, "type", "veth", "peer", "name", name + PEER_SUFFIX)


def remove_own_netdevs() -> None:
    """Every interface of the suite's in the host namespace (deleting one end of a veth pair
    deletes both; those moved into a pod went with its namespace)."""
    for name in sorted(links()):
        if name.startswith(NETDEV_PREFIX):
            _ip("link", "del", name, check=False)


def cni_config(work: Path) -> dict[str, Any]:
    """A bridge network without an address on the host (no gateway, no masquerade, no
    forwarding) and host-local pod addresses kept in the work folder."""
    return {
        "cniVersion": "1.0.0",
        "name": "tessera-e2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": CNI_BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": CNI_SUBNET}]],
                    "dataDir": str(work / "cni-ipam"),
                },
            }
        ],
    }


def containerd_config(
    release: Path, work: Path, nri_socket: Path, runc: Path, cni: Path | None = None
) -> str:
    """containerd's config for this release: CRI with the offline sandbox image and runc,
    restrict_oom_score_adj (the host forbids lowering it), NRI as deploy/nri-hook ships
    it (socket moved into the work folder), and with `cni` (the plugins' folder) a pod
    network from <work>/cni-conf."""
    v2 = _major(release) >= 2
    shipped = (
        ROOT / "deploy/nri-hook" / ("containerd-2.x-nri.toml" if v2 else "containerd-1.7-nri.toml")
    ).read_text()
    nri = shipped.replace("/var/run/nri/nri.sock", str(nri_socket))
    nri = nri.replace("/opt/nri/plugins", str(work / "nri-plugins"))
    nri = nri.replace("/etc/nri/conf.d", str(work / "nri-conf"))
    nri = "\n".join(line for line in nri.splitlines() if not line.startswith("version"))
    common = f"""
root = "{work / "root"}"
state = "{work / "state"}"
[grpc]
  address = "{work / "containerd.sock"}"
[ttrpc]
  address = "{work / "containerd.sock.ttrpc"}"
"""
    if v2:
        return f"""version = 3
{common}
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{SANDBOX_IMAGE}"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
{_runc_runtime('plugins."io.containerd.cri.v1.runtime".containerd', runc)}
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
{_cni_section('plugins."io.containerd.cri.v1.runtime".cni', work, cni, v2)}
{nri}
"""
    return f"""version = 2
{common}
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  restrict_oom_score_adj = true
  disable_tcp_service = true
{_runc_runtime('plugins."io.containerd.grpc.v1.cri".containerd', runc, 'snapshotter = "native"')}
{_cni_section('plugins."io.containerd.grpc.v1.cri".cni', work, cni, v2)}
{nri}
"""


def _runc_runtime(table: str, runc: Path, extra: str = "") -> str:
    """The CRI plugin's `containerd` table (named `table` in this release's config) with
    runc as its only and default runtime."""
    return f"""[{table}]
  {extra}
  default_runtime_name = "runc"
  [{table}.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [{table}.runtimes.runc.options]
      BinaryName = "{runc}"
      SystemdCgroup = false"""


def _cni_section(table: str, work: Path, cni: Path | None, v2: bool) -> str:
    if cni is None:
        return ""
    folders = f'bin_dirs = ["{cni}"]' if v2 else f'bin_dir = "{cni}"'
    return f"""[{table}]
  {folders}
  conf_dir = "{work / "cni-conf"}"
"""


def containerd_version(release: Path) -> tuple[int, int]:
    """(major, minor) of the release, as its `containerd --version` says."""
    out = subprocess.run(
        [str(release / "containerd"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    version = next(w for w in out.split() if w.startswith("v") and w[1:2].isdigit())
    major, minor = version[1:].split(".")[:2]
    return int(major), int(minor)


def _major(release: Path) -> int:
    return containerd_version(release)[0]


def enforces_required_plugins(release: Path) -> bool:
    """Whether containerd refuses to create a container while an NRI plugin its pod
    requires is not connected: NRI's default validator (2.2 and later), which the shipped
    2.x configuration, and so `containerd_config`, enables."""
    return containerd_version(release) >= (2, 2)


@dataclass(eq=False)
class Node:
    """One real node joined to `cp`: containerd `release`, kubelet, agent and hook."""

    cp: ControlPlane
    name: str
    release: Path
    kubelet: Path
    runc: Path
    busybox: Path
    topology: Path
    cni: Path | None = None
    """The CNI plugins' folder; None: pods can only use the host's network."""

    @classmethod
    def h100(cls, cp: ControlPlane, name: str, release: Path, busybox: Path, **kw: Any) -> Node:
        """A node of eight H100 SXM GPUs with this host's kubelet and runc."""
        from tests.e2e import binaries

        bins = binaries.require("kubelet", "runc")
        topology = topology_for(name, "h100-sxm-8x", cp.work)
        return cls(cp, name, release, bins["kubelet"], bins["runc"], busybox, topology, **kw)

    def __post_init__(self) -> None:
        self.vf_netdevs = own_netdevs(self.topology)
        self.work = self.cp.work / f"node-{self.name}"
        self.work.mkdir()
        self.sock = self.work / "containerd.sock"
        self.nri_sock = self.work / "nri.sock"
        self.procs: dict[str, Proc] = {}
        self.metrics_ports = {"agent": free_port(), "nri-hook": free_port()}
        """Each program's /metrics port on 127.0.0.1 (9465 and 9466 as shipped, where one
        node is one host); the same across restarts, as a DaemonSet pod's."""

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.release / "ctr"), "-a", str(self.sock), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(self.work, name, cmd, env).start()
        self.procs[name] = proc
        self.cp.procs[f"{self.name}-{name}"] = proc
        return proc

    def start_network(self) -> None:
        """The VFs' netdevs in the host namespace and, with the CNI plugins, the pod network."""
        make_vf_netdevs(self.vf_netdevs)
        if self.cni is not None:
            conf = self.work / "cni-conf"
            conf.mkdir(exist_ok=True)
            (conf / "10-tessera-e2e.conflist").write_text(json.dumps(cni_config(self.work)))

    def start_containerd(self) -> None:
        for d in ("nri-plugins", "nri-conf"):
            (self.work / d).mkdir(exist_ok=True)
        config = self.work / "containerd.toml"
        config.write_text(
            containerd_config(self.release, self.work, self.nri_sock, self.runc, self.cni)
        )
        path = f"{self.release}:{self.runc.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        self._spawn(
            "containerd",
            [str(self.release / "containerd"), f"--config={config}", "--log-level=info"],
            {"PATH": path},
        )
        wait_for(lambda: self.ctr("version", check=False).returncode == 0, 60, "containerd up")

    def import_image(self) -> None:
        archive = busybox_image(self.work / "busybox.tar", self.busybox)
        self.ctr("images", "import", "--all-platforms", str(archive))
        self.ctr("images", "tag", "--force", IMAGE, SANDBOX_IMAGE)

    def start_kubelet(self) -> None:
        pair = self.cp.cluster_ca.issue(
            f"kubelet-{self.name}", f"system:node:{self.name}", orgs=("system:nodes",)
        )
        kubeconfig = self.cp.kubeconfig(f"kubelet-{self.name}", pair=pair)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cp.cluster_ca.path)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzPort": 0,
            "address": "127.0.0.1",
            "staticPodPath": "",
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {},
            "evictionPressureTransitionPeriod": "0s",
            "serializeImagePulls": False,
            "syncFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s",
            "localStorageCapacityIsolation": False,
            "resolvConf": "",
        }
        path = self.work / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn(
            "kubelet",
            [
                str(self.kubelet),
                f"--config={path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.work / 'kubelet'}",
                f"--hostname-override={self.name}",
                f"--cert-dir={self.work / 'kubelet-pki'}",
                "--v=2",
            ],
        )
        wait_for(lambda: self.cp.admin.get(f"/api/v1/nodes/{self.name}"), 120, "kubelet's Node")
        wait_for(self._untainted, 60, f"{self.name} without not-ready taints")

    def _untainted(self) -> bool:
        self.cp.untaint(self.name)
        node = self.cp.admin.get(f"/api/v1/nodes/{self.name}")
        return not (node.get("spec") or {}).get("taints")

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's pod-resources API under its --root-dir."""
        return self.work / "kubelet" / "pod-resources" / "kubelet.sock"

    def start_agent(self) -> None:
        kubeconfig = self.cp.kubeconfig(
            f"agent-{self.name}", token=self.cp.token("tessera-device-plugin", self.name)
        )
        self._spawn(
            "agent",
            [
                sys.executable,
                "-m",
                "deviceplugin.cli",
                "--backend=fake",
                f"--topology={self.topology}",
                f"--node-name={self.name}",
                f"--kubeconfig={kubeconfig}",
                f"--integrity-key-file={self.cp.integrity_dir / 'public'}",
                f"--pod-resources-socket={self.pod_resources_socket}",
                "--heartbeat-interval=2",
                "--lease-duration=8",
                "--health-query-interval=0",
                "--no-netlink",
                *self._metrics_flags("agent"),
            ],
            PYTHON_ENV,
        )

    def _metrics_flags(self, program: str) -> list[str]:
        return [f"--metrics-port={self.metrics_ports[program]}", "--metrics-address=127.0.0.1"]

    @property
    def hami_core_library(self) -> Path:
        """A stand-in for HAMi-core's library: the hook mounts and preloads it as it would
        the real one (the containers' static busybox ignores the preload)."""
        return self.work / "vgpu" / "libvgpu.so"

    def start_hook(self, devices: Path) -> None:
        # the shipped layer: runc must take the hook's mounts (the library, read-only, and a
        # tmpfs for its region) from the real containerd; the library must be on the host
        # and, where the hook looks, under its device root
        lib = self.hami_core_library
        for path in (lib, devices / str(lib).lstrip("/")):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
        self._spawn(
            "nri-hook",
            [
                sys.executable,
                "-m",
                "nri_hook.cli",
                f"--socket={self.nri_sock}",
                f"--node-name={self.name}",
                f"--integrity-key-file={self.cp.integrity_dir / 'public'}",
                f"--device-root={devices}",
                "--isolation=hami-core",
                f"--hami-core-library={lib}",
                "--log-level=info",
                *self._metrics_flags("nri-hook"),
            ],
            PYTHON_ENV,
        )

    def _kill_own_shims(self) -> None:
        """Shims re-parent to init and outlive containerd; ours name our socket."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                args
                and args[0].endswith(b"containerd-shim-runc-v2")
                and str(self.sock).encode() in args
            ):
                with contextlib.suppress(OSError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def stop(self) -> None:
        for name in ("kubelet", "agent"):
            if name in self.procs:
                self.procs[name].stop()
        # containers outlive the kubelet and containerd: kill their tasks while it answers
        if self.procs.get("containerd") and self.procs["containerd"].running():
            for task in self.ctr("tasks", "list", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            time.sleep(1)
            for task in self.ctr("tasks", "list", "-q", check=False).stdout.split():
                self.ctr("tasks", "delete", "-f", task, check=False)
        for name in ("nri-hook", "containerd"):
            if name in self.procs:
                self.procs[name].stop()
        self._kill_own_shims()
        (PLUGIN_DIR / "kubelet.sock").unlink(missing_ok=True)
        # the kubelet's volume mounts (service account tokens) outlive it
        mounts = [
            line.split()[1]
            for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(self.work) + "/")
        ]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        remove_own_netdevs()
