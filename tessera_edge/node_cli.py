"""The command line the node-side programs (the node agent and the NRI hook) share.

Both run as DaemonSets and are operated the same way, so their --help reads the same: the
program's description and epilog as written, its config's flags section by section, and
the log and metrics flags together in one section, `LOGS_AND_METRICS`, which the config's
own output flags (`--log-file`, `--print-inventory`, ...) join.

The flags several node programs take with one meaning (`--node-name`, the isolation layer's
`--isolation`, `--hami-core-library`, `--mps-pipe-dir` and `--host-root`) are declared here once, as
config fields a program puts in a group of its own, so their default and --help are one.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
from types import FrameType
from typing import TYPE_CHECKING

from tessera.isolation import LAYERS
from tessera_cli import CliParser
from tessera_cli.flags import FlagGroup, add_flags
from tessera_cli.metrics import add_metrics_flags
from tessera_cli.values import node_name
from tessera_edge.host_paths import DEFAULT_HAMI_CORE_LIBRARY, MPS_PIPE_DIR
from tessera_edge.logs import add_log_flags

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_TITLE = "logs and metrics"
LOGS_AND_METRICS = FlagGroup(_TITLE)


def node_parser(
    prog: str,
    description: str,
    epilog: str,
    config: type[DataclassInstance],
    shipped_metrics_port: int,
) -> CliParser:
    """The parser of a node-side program whose `config` has flags in `LOGS_AND_METRICS`;
    `shipped_metrics_port` is the port the shipped DaemonSet uses, named in --help."""
    parser = CliParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    output = add_flags(parser, config)[_TITLE]
    add_log_flags(output)
    add_metrics_flags(output, shipped_metrics_port)
    return parser


def stop_on_signals(log: logging.Logger, doing: str = "stopping") -> threading.Event:
    """An event a node program's main loop waits on: set, and logged (`signal 15:
    stopping`), on SIGTERM (the kubelet stopping the pod) or SIGINT."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: %s", signum, doing)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def default_node_name() -> str:
    """$NODE_NAME (the DaemonSets set it from the pod's node), else the host name
    lower-cased, as the kubelet names its node."""
    return os.environ.get("NODE_NAME", "") or socket.gethostname().lower()


def node_name_flag(group: FlagGroup, used_for: str) -> str:
    """`--node-name`: this node's name, `used_for` what (a clause of --help)."""
    field: str = group.flag(
        f"this node's name: {used_for}. Default: $NODE_NAME, else the lower-cased host name, "
        "as the kubelet names its node (%(default)s).",
        type=node_name,
        default_factory=default_node_name,
        metavar="NAME",
    )
    return field


def isolation_flag(group: FlagGroup, use: str) -> str | None:
    """`--isolation`: the layers and what each limits, then `use`: what this program does
    with the layer, and without one (its default)."""
    layer: str | None = group.choice(
        "the node's GPU isolation layer, which limits each GPU share: hami-core (HAMi-core's "
        "library at --hami-core-library, with CUDA_DEVICE_MEMORY_LIMIT_<i> and "
        "CUDA_DEVICE_SM_LIMIT_<i> per GPU), mps (NVIDIA's MPS control daemon, its pipes in "
        "--mps-pipe-dir, with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and "
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) or none (shares are not limited). " + use,
        LAYERS,
    )
    return layer


def hami_core_library_flag(group: FlagGroup) -> str:
    """`--hami-core-library`, where tessera installs HAMi-core on the host (the NRI hook,
    which may be given a library of the operator's, declares its own)."""
    field: str = group.path(
        "host path of HAMi-core's libvgpu.so, as the NRI hook's --hami-core-library; "
        "tessera's installer keeps its version stamp libvgpu.json beside it. "
        "Default: %(default)s.",
        DEFAULT_HAMI_CORE_LIBRARY,
        absolute=True,
    )
    return field


def mps_pipe_dir_flag(group: FlagGroup) -> str:
    """`--mps-pipe-dir`, where the MPS control daemon keeps its pipes."""
    return group.directory(
        "host directory of the MPS control daemon's pipes and pid file "
        "(CUDA_MPS_PIPE_DIRECTORY); with --isolation=mps the NRI hook mounts it at the same "
        "path into each container given part of a GPU. Default: %(default)s.",
        MPS_PIPE_DIR,
        absolute=True,
    )


def host_root_flag(group: FlagGroup) -> str:
    """`--host-root`, where a node program in a pod sees the host's files."""
    return group.directory(
        "where the host's files are visible: the isolation layer's host paths (the "
        "library, the MPS pipe directory) are reached under it. Default: %(default)s; /host "
        "in the DaemonSet.",
        "/",
        absolute=True,
    )
