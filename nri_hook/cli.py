"""tessera-nri-hook: the command line of tessera's containerd NRI plugin."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import math
import os
import re
import signal
import socket
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, NoReturn

from nri_hook.adjust import DEFAULT_MPS_PIPE_DIR, ISOLATION_LAYERS, ISOLATION_NONE, Settings
from nri_hook.devices import HostDevices
from nri_hook.enforce import Enforcer, EnforcerConfig, Metrics
from nri_hook.netdev import IFNAMSIZ, NetdevMover
from nri_hook.plugin import (
    DEFAULT_REGISTRATION_TIMEOUT,
    DEFAULT_SOCKET_PATH,
    PLUGIN_IDX_ENV,
    PLUGIN_NAME_ENV,
    PLUGIN_SOCKET_ENV,
    NriPlugin,
    check_identity,
)
from tessera.record_keys import KeyFileError
from tessera.resources import ALLOCATION_ANNOTATION, DEFAULT_INTEGRITY_KEY_FILE
from tessera_edge.keyfiles import KeyringSource
from tessera_edge.logs import add_log_flags, setup_logging

log = logging.getLogger("nri_hook")

DEFAULT_PLUGIN_NAME = "tessera"
DEFAULT_PLUGIN_INDEX = "50"
MAX_REGISTRATION_TIMEOUT: Final = 3600.0
"""Seconds; containerd's own registration timeout is 5 s, so anything near an hour is a typo."""
UNIX_PATH_MAX: Final = 107
"""Longest unix socket path Linux accepts (sun_path is 108 bytes with the terminating NUL)."""
_NODE_NAME_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_IFNAME_RE: Final = re.compile(r"^[A-Za-z0-9_.-]*$")


class UsageError(ValueError):
    """A flag, path or environment variable that cannot work; the message names it."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line on stderr, exit 2: the usage text would bury the one line that matters."""
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= MAX_REGISTRATION_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"{text} must be more than 0 and at most {MAX_REGISTRATION_TIMEOUT:g} seconds"
        )
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535; 0 is off)")
    return value


DESCRIPTION = f"""\
tessera's containerd NRI plugin. For every container containerd creates, it reads the
pod's {ALLOCATION_ANNOTATION} annotation (the scheduler's allocation record), verifies its
integrity, node and pod UID, and adds the allocated GPU and RDMA device nodes, the
environment of the GPU isolation layer and its mounts. When a pod sandbox starts it moves
the pod's RDMA VF network devices into the pod's network namespace, and brings them back
when the sandbox stops. Pods without the annotation are left untouched.

It runs as an external plugin dialing the runtime's NRI socket (reconnecting whenever the
runtime restarts), or, when containerd launches it from its plugin directory, on the
connection passed in {PLUGIN_SOCKET_ENV}."""

EPILOG = """\
exit status: 0 after SIGTERM/SIGINT or when a launching runtime closes the connection;
2 for an invalid flag, path or NRI_PLUGIN_* variable, or an unreadable integrity key
(one line on stderr naming it).
See docs/nri_hook.md for what is injected and how to deploy it."""


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="tessera-nri-hook",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    conn = p.add_argument_group("connection to the runtime")
    conn.add_argument(
        "--socket",
        default=DEFAULT_SOCKET_PATH,
        metavar="PATH",
        help="NRI socket of containerd to dial (default: %(default)s). Not used when "
        f"containerd launched the plugin ({PLUGIN_SOCKET_ENV} set).",
    )
    conn.add_argument(
        "--plugin-name",
        default=DEFAULT_PLUGIN_NAME,
        metavar="NAME",
        help="name to register under; letters, digits, _ . + - (default: %(default)s). "
        f"{PLUGIN_NAME_ENV} from a launching runtime takes precedence.",
    )
    conn.add_argument(
        "--plugin-index",
        default=DEFAULT_PLUGIN_INDEX,
        metavar="NN",
        help="two-digit index; containerd calls plugins in ascending index order "
        f"(default: %(default)s). {PLUGIN_IDX_ENV} from a launching runtime takes precedence.",
    )
    conn.add_argument(
        "--registration-timeout",
        type=_seconds,
        default=DEFAULT_REGISTRATION_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for the runtime to accept the registration (default: %(default)s)",
    )
    rec = p.add_argument_group("allocation records")
    rec.add_argument(
        "--node-name",
        default=None,
        metavar="NAME",
        help="this node's Kubernetes name; a record for another node is refused "
        "(default: $NODE_NAME, else the lower-cased host name, as kubelet does)",
    )
    rec.add_argument(
        "--integrity-key-file",
        default=DEFAULT_INTEGRITY_KEY_FILE,
        metavar="PATH",
        help="PEM public key file, or directory of them (the Secret tessera-record-verify), "
        "that verify the scheduler's Ed25519 record signatures; private keys are refused. "
        "Re-read when the files change (checked every 10 s), so rotation needs no restart "
        "(default: %(default)s)",
    )
    rec.add_argument(
        "--no-integrity",
        action="store_true",
        help="accept records without checking their integrity proof. Anyone who can "
        "create a pod can then claim any device: for test clusters only",
    )
    rec.add_argument(
        "--on-invalid-record",
        choices=("fail", "warn"),
        default="fail",
        help="what to do with a malformed or forged record, or one naming a device this "
        "node lacks: fail the container creation (and a sandbox start that must move VFs) "
        "with an error saying what is wrong, or log a warning and leave the container "
        "untouched (default: %(default)s)",
    )
    dev = p.add_argument_group("devices")
    dev.add_argument(
        "--device-root",
        default="/",
        metavar="DIR",
        help="where the host's /dev, /sys and /proc/driver/nvidia are visible; device type, "
        "major, minor and mode are read from <DIR>/dev/... (default: %(default)s; /host "
        "in the DaemonSet)",
    )
    dev.add_argument(
        "--isolation",
        choices=ISOLATION_LAYERS,
        default=ISOLATION_NONE,
        help="GPU sharing layer to configure: 'mps' sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, "
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and mounts the MPS pipe directory; 'hami-core' "
        "sets CUDA_DEVICE_MEMORY_LIMIT_<i> and CUDA_DEVICE_SM_LIMIT; 'none' only gives the "
        "devices (default: %(default)s)",
    )
    dev.add_argument(
        "--mps-pipe-dir",
        default=DEFAULT_MPS_PIPE_DIR,
        metavar="DIR",
        help="host directory of the MPS control daemon's pipes, mounted at the same path "
        "(with --isolation=mps; default: %(default)s)",
    )
    dev.add_argument(
        "--hami-core-library",
        default="",
        metavar="PATH",
        help="host path of HAMi-core's libvgpu.so to mount read-only and set as LD_PRELOAD "
        "(with --isolation=hami-core; default: none, the node or image provides it)",
    )
    net = p.add_argument_group("RDMA VF network devices")
    net.add_argument(
        "--no-vf-netdevs",
        action="store_true",
        help="do not move allocated VF netdevs into pod network namespaces",
    )
    net.add_argument(
        "--vf-rename-prefix",
        default="",
        metavar="PREFIX",
        help="inside the pod, name the VFs PREFIX0, PREFIX1, ... in record order "
        "(default: keep the host name)",
    )
    obs = p.add_argument_group("logs and metrics")
    add_log_flags(obs)
    obs.add_argument(
        "--log-file",
        default="",
        metavar="PATH",
        help="append logs to this file (default: stderr; a plugin launched by containerd "
        "has its stderr sent to /dev/null, so give it a file)",
    )
    obs.add_argument(
        "--metrics-port",
        type=_port,
        default=0,
        metavar="PORT",
        help="serve Prometheus metrics on this port (default: 0, off)",
    )
    obs.add_argument(
        "--metrics-address",
        default="",
        metavar="ADDR",
        help="address for the metrics port (default: all addresses)",
    )
    return p


def default_node_name() -> str:
    return os.environ.get("NODE_NAME", "") or socket.gethostname().lower()


def launched_identity(name: str, index: str) -> tuple[str, str]:
    """Name and index from a launching runtime's environment (v0.3.0 passes NN-name)."""
    env_name = os.environ.get(PLUGIN_NAME_ENV, "")
    env_index = os.environ.get(PLUGIN_IDX_ENV, "")
    if env_name:
        match = re.match(r"^(\d\d)-(.+)$", env_name)
        name = match.group(2) if match else env_name
    return name, env_index or index


def check_args(args: argparse.Namespace, name: str, index: str) -> Settings:
    """Everything that can be checked before starting. Raises UsageError naming the flag
    (or environment variable) and what is wrong."""
    env_name, env_index = os.environ.get(PLUGIN_NAME_ENV), os.environ.get(PLUGIN_IDX_ENV)
    try:
        check_identity(name, "00")
    except ValueError as exc:
        raise UsageError(f"{PLUGIN_NAME_ENV if env_name else '--plugin-name'}: {exc}") from None
    try:
        check_identity("x", index)
    except ValueError as exc:
        raise UsageError(f"{PLUGIN_IDX_ENV if env_index else '--plugin-index'}: {exc}") from None
    if args.node_name is not None and not _NODE_NAME_RE.match(args.node_name):
        raise UsageError(
            f"--node-name {args.node_name!r}: not a Kubernetes node name "
            "(lower-case letters, digits, '-' and '.')"
        )
    fd_text = os.environ.get(PLUGIN_SOCKET_ENV, "")
    if fd_text:
        _check_inherited_socket(fd_text)
    else:
        _check_socket_path(args.socket)
    root = Path(args.device_root)
    if not root.is_dir():
        raise UsageError(f"--device-root {args.device_root}: not a directory")
    for flag, value in (
        ("--mps-pipe-dir", args.mps_pipe_dir),
        ("--hami-core-library", args.hami_core_library),
    ):
        if value and not value.startswith("/"):
            raise UsageError(f"{flag} {value}: must be an absolute host path (it is mounted)")
    prefix = args.vf_rename_prefix
    if len(prefix) + 2 >= IFNAMSIZ:
        raise UsageError(
            f"--vf-rename-prefix {prefix!r}: too long for an interface name "
            f"(at most {IFNAMSIZ - 3} characters)"
        )
    if not _IFNAME_RE.match(prefix):
        raise UsageError(
            f"--vf-rename-prefix {prefix!r}: use only letters, digits, '_', '.' and '-'"
        )
    try:
        return Settings(
            isolation=args.isolation,
            mps_pipe_dir=args.mps_pipe_dir,
            hami_core_library=args.hami_core_library,
        )
    except ValueError as exc:
        raise UsageError(f"--isolation: {exc}") from None


def _check_socket_path(path: str) -> None:
    """The runtime may not be up yet (the plugin retries until it is), but its socket's
    directory must exist and the path must be usable as a unix socket."""
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise UsageError(f"--socket {path}: longer than {UNIX_PATH_MAX} bytes")
    parent = Path(path).parent
    if not parent.is_dir():
        raise UsageError(f"--socket {path}: directory {parent} does not exist")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"--socket {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"--socket {path}: exists and is not a socket")


def _check_inherited_socket(fd_text: str) -> None:
    try:
        fd = int(fd_text)
        mode = os.fstat(fd).st_mode
    except (ValueError, OSError):
        raise UsageError(f"{PLUGIN_SOCKET_ENV}={fd_text!r}: not an open file descriptor") from None
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"{PLUGIN_SOCKET_ENV}={fd_text}: descriptor {fd} is not a socket")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    name, index = launched_identity(args.plugin_name, args.plugin_index)
    try:
        settings = check_args(args, name, index)
    except UsageError as exc:
        parser.error(str(exc))
    try:
        setup_logging(args.log_format, args.log_level, args.log_file)
    except OSError as exc:
        parser.error(f"--log-file {args.log_file}: cannot open: {exc.strerror or exc}")

    def fail(message: str) -> NoReturn:
        if args.log_file:  # the log file says why the plugin did not start, too
            log.error("%s", message)
        parser.error(message)

    node = args.node_name or default_node_name()
    if args.no_integrity:
        keys = KeyringSource.fixed(None)
    else:
        try:
            keys = KeyringSource(args.integrity_key_file)
        except KeyFileError as exc:
            fail(
                f"--integrity-key-file {args.integrity_key_file}: {exc} "
                "(use --no-integrity only on test clusters)"
            )
    metrics: Metrics | None = None
    if args.metrics_port:
        metrics = Metrics()
        try:
            metrics.serve(args.metrics_port, args.metrics_address)
        except OSError as exc:
            where = f"{args.metrics_address or '0.0.0.0'}:{args.metrics_port}"
            fail(
                f"--metrics-port {args.metrics_port} / --metrics-address "
                f"{args.metrics_address or '(all)'}: cannot listen on {where}: "
                f"{getattr(exc, 'strerror', None) or exc}"
            )
    if args.no_integrity:
        log.warning("record integrity is NOT checked (--no-integrity): test clusters only")
    enforcer = Enforcer(
        EnforcerConfig(
            node_name=node,
            settings=settings,
            on_invalid=args.on_invalid_record,
            require_integrity=not args.no_integrity,
            move_vf_netdevs=not args.no_vf_netdevs,
            vf_rename_prefix=args.vf_rename_prefix,
        ),
        keys,
        HostDevices(args.device_root),
        NetdevMover(args.device_root),
        metrics,
    )
    plugin = NriPlugin(
        enforcer,
        name=name,
        index=index,
        socket_path=args.socket,
        registration_timeout=args.registration_timeout,
    )
    log.info(
        "tessera NRI plugin %s-%s starting: node %s, isolation %s, device root %s, "
        "invalid records: %s",
        index,
        name,
        node,
        settings.isolation,
        args.device_root,
        args.on_invalid_record,
    )
    # Everything allocated so far (imports, protobuf descriptors) lives as long as the
    # process: keep it out of the collector's way so full collections stay short.
    gc.collect()
    gc.freeze()
    asyncio.run(_run(plugin))
    return 0


async def _run(plugin: NriPlugin) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await plugin.run(stop)
    log.info("stopped")


if __name__ == "__main__":
    sys.exit(main())
