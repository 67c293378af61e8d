"""tessera-isolation: puts the node's GPU isolation layer in place, so that no one has to.

tessera-isolation install   HAMi-core's library from the image onto the host
tessera-isolation mps       keep NVIDIA's MPS control daemon running
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tessera_cli import CliParser, Commands, ConfigError, config_from
from tessera_cli.flags import FlagGroup, add_flags
from tessera_cli.metrics import add_metrics_flags, serve_metrics
from tessera_edge.hami_core import LibraryError, install, load_source, node_arch, record_error
from tessera_edge.host_paths import HAMI_CORE_IMAGE_DIR, MPS_LOG_DIR, under
from tessera_edge.logs import add_log_flags, setup_logging
from tessera_edge.mps_supervisor import MPS_CONTROL, NVIDIA_SMI, MpsSettings, MpsSupervisor
from tessera_edge.node_cli import (
    hami_core_library_flag,
    host_root_flag,
    mps_pipe_dir_flag,
    node_name_flag,
    stop_on_signals,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("tessera.isolation")

PROG = "tessera-isolation"
MPS_METRICS_PORT = 9467
"""The MPS supervisor's metrics port in the shipped DaemonSet (its pod's own network; 9465
is the node agent's, 9466 the NRI hook's)."""

DESCRIPTION = """\
Put the node's GPU isolation layer in place (docs/isolation.md). tessera's node
DaemonSets run these; nothing needs to be done on a node by hand.

  install  copy HAMi-core's library and its version stamp from the image onto the host,
           atomically, before the NRI hook starts (an init container of its pod)
  mps      start NVIDIA's MPS control daemon (the host driver's), restart it when it
           dies, stop it when the pod goes (the tessera-mps DaemonSet)
"""

INSTALL_DESCRIPTION = f"""\
Copy HAMi-core's library (libvgpu.so) and its stamp (libvgpu.json) from --source onto the
host at --hami-core-library. The source must pass every check first: the stamp parses and
names this node's CPU ({node_arch()} here), and the library is a shared object for that CPU
whose sha256 is the stamp's. The library is written beside the old one under a temporary
name, fsynced and renamed over it (running processes keep the file they mapped; a new
container always gets a whole one), then the stamp. The same version already in place is
left untouched.

exit status: 0 when the library is in place, and also when it could not be installed: the
node must keep serving whole GPUs. The reason is then one line on stderr and in
libvgpu.install-error beside the library, from where the node agent reports the layer down
(no GPU shares are placed on the node). 2 for a bad flag.
"""

MPS_DESCRIPTION = """\
Keep NVIDIA's MPS control daemon running on this node: find the host driver's
nvidia-cuda-mps-control (the NVIDIA container toolkit puts it in the container), put the
GPUs in EXCLUSIVE_PROCESS compute mode, start the daemon with its pipe and log
directories, check it every --check-interval seconds and start it again when it died
(backoff doubling up to a minute). On SIGTERM: quit the daemon (as
`echo quit | nvidia-cuda-mps-control` does), wait --stop-timeout, then signal it, and set
the compute mode back to DEFAULT. While the daemon cannot run (no binary, a failed
start), the reason is one line in <pipe dir>/tessera-mps.error, from where the node agent
reports the layer down.

exit status: 0 after SIGTERM/SIGINT; 2 for a bad flag.
"""

_INSTALL = FlagGroup("install")
_MPS = FlagGroup("the MPS daemon")


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallConfig:
    source: str = _INSTALL.directory(
        "the image's folder holding libvgpu.so and libvgpu.json. Default: %(default)s.",
        HAMI_CORE_IMAGE_DIR,
    )
    hami_core_library: str = hami_core_library_flag(_INSTALL)
    host_root: str = host_root_flag(_INSTALL)
    log_format: str = "text"
    log_level: str = "info"


@dataclass(frozen=True, slots=True, kw_only=True)
class MpsConfig:
    mps_pipe_dir: str = mps_pipe_dir_flag(_MPS)
    mps_log_dir: str = _MPS.directory(
        "the daemon's log directory (CUDA_MPS_LOG_DIRECTORY: control.log, server.log). "
        "Default: %(default)s.",
        MPS_LOG_DIR,
        absolute=True,
    )
    mps_control: str = _MPS.path(
        "the control daemon's binary: a name looked up on PATH, or a path. Default: %(default)s.",
        MPS_CONTROL,
    )
    nvidia_smi: str = _MPS.path(
        "nvidia-smi, which sets the compute mode. Default: %(default)s.", NVIDIA_SMI
    )
    multi_user: bool = _MPS.switch(
        "start the daemon in multi-user mode (-M; Volta and later GPUs): the clients of "
        "every Linux user share one server, as root's, instead of one user's clients at a "
        "time. Give the NRI hook --mps-client-user=any with it."
    )
    keep_compute_mode: bool = _MPS.switch(
        "leave the GPUs' compute mode as it is (default: EXCLUSIVE_PROCESS while the daemon "
        "runs, so no process uses a GPU except through MPS)"
    )
    check_interval: float = _MPS.duration(
        "how often the daemon is checked. Default: %(default)s.", default=5.0
    )
    stop_timeout: float = _MPS.duration(
        "after quit, how long the daemon may take to stop before it is signalled. "
        "Default: %(default)s.",
        default=20.0,
    )
    node_name: str = node_name_flag(_MPS, "the metrics' node label")
    log_format: str = "text"
    log_level: str = "info"
    metrics_port: int = 0
    metrics_address: str = ""


def build_parser() -> CliParser:
    commands = Commands(PROG, DESCRIPTION)
    install_parser = commands.add(
        "install", "copy HAMi-core's library from the image onto the host", INSTALL_DESCRIPTION
    )
    add_flags(install_parser, InstallConfig)
    add_log_flags(install_parser.add_argument_group("logs"))
    mps_parser = commands.add("mps", "keep NVIDIA's MPS control daemon running", MPS_DESCRIPTION)
    add_flags(mps_parser, MpsConfig)
    output = mps_parser.add_argument_group("logs and metrics")
    add_log_flags(output)
    add_metrics_flags(output, MPS_METRICS_PORT)
    return commands.parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "install":
        config = config_from(InstallConfig, args)
        setup_logging(config.log_format, config.log_level)
        return run_install(config)
    mps = config_from(MpsConfig, args)
    setup_logging(mps.log_format, mps.log_level)
    try:
        return run_mps(mps)
    except ConfigError as exc:
        return parser.fail(exc)


def run_install(config: InstallConfig) -> int:
    """See INSTALL_DESCRIPTION. Always 0 once the flags are good (why: there)."""
    started = time.perf_counter()
    library = config.hami_core_library
    here = under(config.host_root, library)
    try:
        source = load_source(config.source, node_arch())
        done = install(source, here)
    except (LibraryError, OSError) as exc:
        message = f"HAMi-core not installed at {library}: {_one_line(exc)}"
        kept = record_error(here, message)
        note = "" if kept else " (nor could this reason be kept beside it for the node agent)"
        print(f"{PROG} install: error: {message}{note}", file=sys.stderr)
        return 0
    stamp = done.stamp
    took = time.perf_counter() - started
    if done.changed:
        was = f", replacing {done.replaced}" if done.replaced else ""
        log.info(
            "installed HAMi-core %s (commit %s, %s) at %s%s in %.3f s",
            stamp.version,
            stamp.commit[:12],
            stamp.arch,
            library,
            was,
            took,
        )
    else:
        log.info("HAMi-core %s is already installed at %s: left as it was", stamp.version, library)
    return 0


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return " ".join(str(exc).split())


def run_mps(config: MpsConfig) -> int:
    supervisor = MpsSupervisor(
        MpsSettings(
            pipe_dir=config.mps_pipe_dir,
            log_dir=config.mps_log_dir,
            control=config.mps_control,
            nvidia_smi=config.nvidia_smi,
            multi_user=config.multi_user,
            set_compute_mode=not config.keep_compute_mode,
            check_interval_s=config.check_interval,
            stop_timeout_s=config.stop_timeout,
        )
    )
    if config.metrics_port:
        serve_metrics(
            mps_registry(supervisor, config.node_name), config.metrics_port, config.metrics_address
        )
    supervisor.run(stop_on_signals(log, "stopping the MPS control daemon"))
    return 0


def mps_registry(supervisor: MpsSupervisor, node: str) -> CollectorRegistry:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    class MpsCollector(Collector):
        def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
            up = GaugeMetricFamily(
                "tessera_mps_daemon_up",
                "1 while the node's MPS control daemon runs, else 0",
                labels=["node"],
            )
            up.add_metric([node], 1 if supervisor.up else 0)
            restarts = CounterMetricFamily(
                "tessera_mps_daemon_restarts",
                "MPS control daemons started again after one that ran had died",
                labels=["node"],
            )
            restarts.add_metric([node], supervisor.restarts)
            yield from (up, restarts)

    registry = CollectorRegistry(auto_describe=True)
    registry.register(MpsCollector())
    return registry


if __name__ == "__main__":
    sys.exit(main())
