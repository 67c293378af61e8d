"""`tessera-node-check`: does this node have what a tessera GPU node needs?

Each check answers ok, warn or fail with a one-line reason and, when not ok, what to do.
The command exits 0 when nothing failed and 1 otherwise, so it can gate a node (or run as
an init container of the node agent). Paths are read under `--root` (the host's `/` when
run from a pod with the host mounted, or a scratch tree in tests); NVML is loaded from
the library path of the process itself.
"""

from __future__ import annotations

import json
import stat
import sys
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from deviceplugin.server import DEFAULT_PLUGIN_DIR
from tessera.errors import TesseraError
from tessera_cli import CliParser, ConfigError, config_from
from tessera_cli.flags import FlagGroup, add_flags
from tessera_cli.paths import check_directory
from tessera_edge.hami_core import read_install_error
from tessera_edge.host_paths import (
    DEFAULT_HAMI_CORE_LIBRARY,
    MPS_PIPE_DIR,
    NRI_SOCKET,
    mps_error_file,
    mps_pid_file,
)
from tessera_edge.topology_file import load_topology

OK: Final = "ok"
WARN: Final = "warn"
FAIL: Final = "fail"

CDI_DIRS: Final = ("/etc/cdi", "/var/run/cdi")
TOOLKIT_BINARIES: Final = ("/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-ctk")
NVIDIA_PLUGIN_SOCKET: Final = "nvidia-gpu.sock"
"""The socket NVIDIA's device plugin serves `nvidia.com/gpu` on, in the kubelet's
device-plugin directory."""
CONTAINERD_CONFIG: Final = "/etc/containerd/config.toml"
CRI_PLUGINS: Final = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")
"""Where containerd 1.7 (config version 2) and 2.x (version 3) keep the CRI's
`containerd.default_runtime_name`."""
MAX_CONFIG_FILES: Final = 64
MAX_CONFIG_BYTES: Final = 1 << 20
MAX_VERSION_CHARS: Final = 200
"""Of /proc/driver/nvidia/version's first line, kept for the report."""


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    reason: str
    fix: str = ""


_OPTIONS = FlagGroup(None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    root: str = _OPTIONS.flag(
        "where the node's / is visible (default: %(default)s)", default="/", metavar="DIR"
    )
    backend: str = _OPTIONS.flag(None, choices=("nvml", "fake"), default="nvml")
    topology: str = _OPTIONS.flag(
        "with --backend fake: the topology file or built-in name", default="", metavar="FILE|NAME"
    )
    device_plugin_dir: str = _OPTIONS.flag(None, default=DEFAULT_PLUGIN_DIR, metavar="DIR")
    nri_socket: str = _OPTIONS.flag(None, default=NRI_SOCKET, metavar="PATH")
    rdma: str = _OPTIONS.flag(
        "auto: check RDMA when the node has RDMA devices (default)",
        choices=("auto", "required", "off"),
        default="auto",
    )
    """auto: check RDMA when the node has RDMA NICs; required: fail without; off."""
    whole_gpus_only: bool = _OPTIONS.switch(
        "no fractional resources are advertised: no isolation layer needed"
    )
    isolation: str = _OPTIONS.flag(
        "the NRI hook's sharing layer; auto looks for either (default)",
        choices=("auto", "hami-core", "mps", "none"),
        default="auto",
    )
    mps_pipe_dir: str = _OPTIONS.flag(None, default=MPS_PIPE_DIR, metavar="DIR")
    hami_core_library: str = _OPTIONS.flag(None, default=DEFAULT_HAMI_CORE_LIBRARY, metavar="PATH")
    containerd_config: str = _OPTIONS.flag(
        "containerd's configuration, read for its default runtime (default: %(default)s)",
        default=CONTAINERD_CONFIG,
        metavar="PATH",
    )
    output: str = _OPTIONS.flag(None, short="-o", choices=("table", "json"), default="table")


class Node:
    """The node's files, under a root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def exists(self, absolute: str) -> bool:
        return self.path(absolute).exists()

    def glob(self, absolute_dir: str, pattern: str) -> list[Path]:
        base = self.path(absolute_dir)
        try:
            return sorted(base.glob(pattern))
        except OSError:
            return []


# --- the checks --------------------------------------------------------------------------


def check_driver(node: Node, opts: Options) -> list[Check]:
    if opts.backend == "fake":
        return [Check("nvidia-driver", OK, "not needed with --backend fake")]
    result = []
    version = node.path("/proc/driver/nvidia/version")
    try:
        first = version.read_text(errors="replace").splitlines()[:1]
    except OSError:
        result.append(
            Check(
                "nvidia-driver",
                FAIL,
                "the NVIDIA kernel driver is not loaded (no /proc/driver/nvidia/version)",
                "install the NVIDIA driver for this kernel and load it (modprobe nvidia)",
            )
        )
    else:
        line = " ".join((first[0] if first else "").split())[:MAX_VERSION_CHARS]
        result.append(Check("nvidia-driver", OK, line or "loaded"))
    for dev, fix in (
        ("/dev/nvidiactl", "load the nvidia module; device nodes appear with it"),
        ("/dev/nvidia-uvm", "load nvidia-uvm (modprobe nvidia-uvm; nvidia-modprobe -u -c=0)"),
    ):
        p = node.path(dev)
        if not p.exists():
            result.append(Check(dev, FAIL, f"{dev} is missing", fix))
        elif not _is_char_device(p):
            result.append(Check(dev, WARN, f"{dev} exists but is not a character device", fix))
        else:
            result.append(Check(dev, OK, "present"))
    return result


def _is_char_device(p: Path) -> bool:
    try:
        return stat.S_ISCHR(p.stat().st_mode)
    except OSError:
        return False


def check_nvml(opts: Options, nvml: Callable[[], Any] | None = None) -> Check:
    """NVML loads and sees GPUs (real pynvml), or the topology file parses (fake backend)."""
    if opts.backend == "fake":
        if not opts.topology:
            return Check(
                "nvml",
                FAIL,
                "--backend fake needs --topology",
                "pass the topology file or a built-in name",
            )
        try:
            inventory = load_topology(opts.topology)
        except TesseraError as exc:
            return Check(
                "nvml",
                FAIL,
                f"topology does not parse: {exc}",
                "fix the field named in the message",
            )
        if not inventory.gpus:
            return Check("nvml", FAIL, "the topology lists no GPUs", "add the node's GPUs")
        models = sorted({g.model for g in inventory.gpus})
        return Check("nvml", OK, f"topology: {len(inventory.gpus)} GPU(s), {', '.join(models)}")
    try:
        module = nvml() if nvml is not None else _import_pynvml()
        module.nvmlInit()
        try:
            count = int(module.nvmlDeviceGetCount())
            version = module.nvmlSystemGetDriverVersion()
        finally:
            module.nvmlShutdown()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError...
        return Check(
            "nvml",
            FAIL,
            f"NVML cannot be used: {type(exc).__name__}: {_line(exc)}",
            "make libnvidia-ml.so.1 visible to this process (the NVIDIA container "
            "toolkit mounts it, or mount the host's driver libraries)",
        )
    if isinstance(version, bytes):
        version = version.decode("utf-8", "replace")
    if count == 0:
        return Check(
            "nvml",
            FAIL,
            "NVML loads but reports no GPUs",
            "check `nvidia-smi` on the node; a GPU may have fallen off the bus",
        )
    return Check("nvml", OK, f"{count} GPU(s), driver {_line(version)}")


def _import_pynvml() -> Any:
    import importlib

    return importlib.import_module("pynvml")


def _line(value: object) -> str:
    return " ".join(str(value).split())[:MAX_VERSION_CHARS]


def check_plugin_dir(node: Node, opts: Options) -> Check:
    d = node.path(opts.device_plugin_dir)
    name = "device-plugin-dir"
    if not d.is_dir():
        return Check(
            name,
            FAIL,
            f"{opts.device_plugin_dir} does not exist",
            "is the kubelet running? mount the kubelet's device-plugins directory",
        )
    try:
        with tempfile.NamedTemporaryFile(dir=d, prefix=".tessera-check-"):
            pass
    except OSError as exc:
        return Check(
            name,
            FAIL,
            f"{opts.device_plugin_dir} is not writable: {exc.strerror}",
            "run the node agent as root with the directory mounted read-write",
        )
    kubelet = d / "kubelet.sock"
    if not _is_socket(kubelet):
        return Check(
            name,
            WARN,
            f"writable, but {opts.device_plugin_dir}/kubelet.sock is not there",
            "is the kubelet running with device plugins enabled?",
        )
    return Check(name, OK, "writable, kubelet.sock present")


def _is_socket(p: Path) -> bool:
    try:
        return stat.S_ISSOCK(p.stat().st_mode)
    except OSError:
        return False


def check_nri(node: Node, opts: Options) -> Check:
    p = node.path(opts.nri_socket)
    if _is_socket(p):
        return Check("nri", OK, f"{opts.nri_socket} present")
    what = "is not a socket" if p.exists() else "is missing"
    return Check(
        "nri",
        FAIL,
        f"containerd's NRI socket {opts.nri_socket} {what}",
        'enable NRI in containerd (1.7: [plugins."io.containerd.nri.v1.nri"] disable = '
        "false; on by default in 2.x) and restart containerd",
    )


def check_rdma(node: Node, opts: Options) -> Check:
    if opts.rdma == "off":
        return Check("rdma", OK, "not checked (--rdma off)")
    nics = [p.name for p in node.glob("/sys/class/infiniband", "*")]
    if opts.backend == "fake" and opts.topology and not nics:
        try:
            listed = len(load_topology(opts.topology).nics)
        except TesseraError:
            listed = 0
        if listed:
            return Check("rdma", OK, f"topology lists {listed} RDMA NIC(s)")
    if not nics:
        if opts.rdma == "required":
            return Check(
                "rdma",
                FAIL,
                "no RDMA devices in /sys/class/infiniband",
                "load the NIC's RDMA driver (e.g. mlx5_ib) and ib_core",
            )
        return Check("rdma", OK, "no RDMA NICs on this node (tessera.dev/rdma not advertised)")
    verbs = [p.name for p in node.glob("/dev/infiniband", "uverbs*")]
    if not verbs:
        return Check(
            "rdma",
            FAIL,
            f"{len(nics)} RDMA device(s) but no /dev/infiniband/uverbs*",
            "load ib_uverbs (modprobe ib_uverbs)",
        )
    return Check(
        "rdma",
        OK,
        f"{len(nics)} RDMA device(s) ({', '.join(nics[:4])}"
        f"{', ...' if len(nics) > 4 else ''}), {len(verbs)} uverbs device(s)",
    )


def check_isolation(node: Node, opts: Options) -> Check:
    name = "isolation"
    if opts.whole_gpus_only:
        return Check(name, OK, "not needed: only whole GPUs are advertised")
    hami = node.path(opts.hami_core_library).is_file()
    mps = node.exists(mps_pid_file(opts.mps_pipe_dir))  # the daemon runs, not just its dir
    found = [what for what, present in (("hami-core", hami), ("mps", mps)) if present]
    if opts.isolation == "hami-core" and not hami:
        failed = read_install_error(str(node.path(opts.hami_core_library)))
        return Check(
            name,
            FAIL,
            f"HAMi-core library {opts.hami_core_library} is missing"
            + (f" (the last install failed: {failed})" if failed else ""),
            "tessera's installer puts it there when the NRI hook's pod starts (chart value "
            "isolation.hamiCore.install); to bring your own, install it there or pass "
            "--hami-core-library",
        )
    if opts.isolation == "mps" and not mps:
        return Check(
            name,
            FAIL,
            f"the MPS control daemon is not running: no {mps_pid_file(opts.mps_pipe_dir)}",
            "tessera's tessera-mps DaemonSet starts it (nriHook.isolation=mps; its log, and "
            f"{mps_error_file(opts.mps_pipe_dir)} while it cannot, say why), or pass "
            "--mps-pipe-dir",
        )
    if opts.isolation in ("hami-core", "mps"):
        return Check(name, OK, f"{opts.isolation} present")
    if found:
        return Check(
            name, OK, f"found {' and '.join(found)}; give the same to the NRI hook's --isolation"
        )
    return Check(
        name,
        WARN,
        "NO GPU ISOLATION: fractional GPUs are advertised but neither HAMi-core "
        f"({opts.hami_core_library}) nor a running MPS control daemon ({opts.mps_pipe_dir}) is "
        "present, so pods sharing a GPU are not limited in memory or compute",
        "install tessera with an isolation layer (hami-core, the default, installs its "
        "library; mps runs the daemon) and give the NRI hook the same --isolation "
        "(docs/isolation.md)",
    )


def check_nvidia_plugin(node: Node, opts: Options) -> Check:
    """NVIDIA's device plugin on the same node would hand out the GPUs tessera hands out."""
    name = "nvidia-device-plugin"
    sock = f"{opts.device_plugin_dir.rstrip('/')}/{NVIDIA_PLUGIN_SOCKET}"
    if node.exists(sock):
        return Check(
            name,
            FAIL,
            f"NVIDIA's device plugin is registered on this node ({sock}): it and tessera "
            "would both hand out the node's GPUs",
            "keep NVIDIA's DaemonSet off nodes labelled tessera.dev/node-agent=true and "
            "drain the node before labelling it (docs/coexistence.md)",
        )
    return Check(name, OK, "not registered on this node")


def check_default_runtime(node: Node, opts: Options) -> Check:
    """The NVIDIA runtime as containerd's default gives every GPU to any container whose
    image sets NVIDIA_VISIBLE_DEVICES=all, outside tessera's allocations."""
    name = "default-runtime"
    try:
        found = _default_runtime(node, opts.containerd_config)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        return Check(
            name,
            WARN,
            f"cannot read containerd's configuration: {_line(exc)}",
            "check it by hand: default_runtime_name must not name the NVIDIA runtime",
        )
    if found is None:
        return Check(name, OK, f"not set in {opts.containerd_config} (containerd's default: runc)")
    runtime, where = found
    if "nvidia" in runtime.lower():
        return Check(
            name,
            FAIL,
            f"containerd's default runtime is {runtime!r} ({where}): every container whose "
            "image sets NVIDIA_VISIBLE_DEVICES=all gets all GPUs, outside tessera",
            "set default_runtime_name back to runc (nvidia-ctk runtime configure without "
            "--set-as-default) and give GPU pods the nvidia RuntimeClass",
        )
    return Check(name, OK, f"{runtime} ({where})")


def _default_runtime(node: Node, config: str) -> tuple[str, str] | None:
    """containerd's default runtime and the file that sets it (its `imports` are read in
    order after it, a later file winning), or None when no file sets one."""
    if not node.exists(config):
        return None
    files = [config]
    found: tuple[str, str] | None = None
    i = 0
    while i < len(files):
        path = files[i]
        i += 1
        with node.path(path).open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
        doc = tomllib.loads(raw.decode("utf-8"))
        plugins = doc.get("plugins")
        for plugin in CRI_PLUGINS:
            table = plugins.get(plugin) if isinstance(plugins, dict) else None
            cri = table.get("containerd") if isinstance(table, dict) else None
            value = cri.get("default_runtime_name") if isinstance(cri, dict) else None
            if isinstance(value, str) and value:
                found = (value, path)
        if path == config:
            files.extend(_imports(node, config, doc.get("imports")))
            if len(files) > MAX_CONFIG_FILES:
                raise ValueError(f"{config} imports more than {MAX_CONFIG_FILES} files")
    return found


def _imports(node: Node, config: str, imports: object) -> list[str]:
    """The files an `imports` list names (globs; relative to the config's directory)."""
    if not isinstance(imports, list):
        return []
    base = config.rsplit("/", 1)[0] or "/"
    files: list[str] = []
    for entry in imports:
        if not isinstance(entry, str) or not entry:
            continue
        pattern = entry if entry.startswith("/") else f"{base}/{entry}"
        directory, _, glob = pattern.rpartition("/")
        files.extend(
            f"{directory}/{p.name}" for p in node.glob(directory or "/", glob) if p.is_file()
        )
    return files


def check_toolkit(node: Node) -> Check:
    """Information only: tessera's NRI hook adds device nodes itself."""
    specs = [p.name for d in CDI_DIRS for p in node.glob(d, "*") if "nvidia" in p.name.lower()]
    tools = [b.rsplit("/", 1)[1] for b in TOOLKIT_BINARIES if node.exists(b)]
    parts = []
    if tools:
        parts.append(f"toolkit: {', '.join(tools)}")
    if specs:
        parts.append(f"CDI specs: {', '.join(specs[:3])}")
    if not parts:
        return Check(
            "container-toolkit",
            OK,
            "NVIDIA container toolkit and CDI specs not found: the NRI hook adds the "
            "devices, so GPU containers need the driver libraries in their image or mounted",
        )
    return Check("container-toolkit", OK, "; ".join(parts))


def run_checks(opts: Options, nvml: Callable[[], Any] | None = None) -> list[Check]:
    node = Node(Path(opts.root))
    return [
        *check_driver(node, opts),
        check_nvml(opts, nvml),
        check_plugin_dir(node, opts),
        check_nri(node, opts),
        check_rdma(node, opts),
        check_isolation(node, opts),
        check_nvidia_plugin(node, opts),
        check_default_runtime(node, opts),
        check_toolkit(node),
    ]


# --- the command -------------------------------------------------------------------------


def parser() -> CliParser:
    p = CliParser(prog="tessera-node-check", description=__doc__.split("\n\n")[0])
    add_flags(p, Options)
    return p


def render(checks: Sequence[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status.upper():<4}  {c.name:<{width}}  {c.reason}")
        if c.fix and c.status != OK:
            lines.append(f"{'':<4}  {'':<{width}}  -> {c.fix}")
    failed = sum(c.status == FAIL for c in checks)
    warned = sum(c.status == WARN for c in checks)
    lines.append(f"{failed} failed, {warned} warning(s)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, nvml: Callable[[], Any] | None = None) -> int:
    p = parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    opts = config_from(Options, args)
    try:
        check_directory("--root", Path(opts.root))
    except ConfigError as exc:
        return p.fail(exc)
    checks = run_checks(opts, nvml)
    if opts.output == "json":
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        print(render(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
