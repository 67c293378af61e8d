"""The command line the node-side programs (the node agent and the NRI hook) share.

Both run as DaemonSets and are operated the same way, so their --help reads the same: the
program's description and epilog as written, its config's flags section by section, and
the log and metrics flags together in one section, `LOGS_AND_METRICS`, which the config's
own output flags (`--log-file`, `--print-inventory`, ...) join.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING

from tessera_cli import CliParser
from tessera_cli.flags import FlagGroup, add_flags
from tessera_cli.metrics import add_metrics_flags
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
