"""The `--metrics-port` / `--metrics-address` flags and serving /metrics on them, the same
for every node-side program."""

from __future__ import annotations

import argparse

from prometheus_client import CollectorRegistry, start_http_server

from tessera_cli.parser import ConfigError
from tessera_cli.values import port


def add_metrics_flags(group: argparse._ArgumentGroup, shipped_port: int) -> None:
    group.add_argument(
        "--metrics-port",
        type=port,
        default=0,
        metavar="PORT",
        help=f"serve Prometheus metrics on this port (default: 0, off; the shipped "
        f"DaemonSet uses {shipped_port})",
    )
    group.add_argument(
        "--metrics-address",
        default="",
        metavar="ADDR",
        help="address for the metrics port (default: all addresses)",
    )


def serve_metrics(registry: CollectorRegistry, metrics_port: int, address: str) -> None:
    """Serve /metrics on a daemon thread; a port that cannot be had is a usage error."""
    try:
        start_http_server(metrics_port, addr=address or "0.0.0.0", registry=registry)
    except OSError as exc:
        where = f"{address or '0.0.0.0'}:{metrics_port}"
        raise ConfigError(
            "--metrics-port",
            f"{metrics_port} / --metrics-address {address or '(all)'}: "
            f"cannot listen on {where}: {exc.strerror or exc}",
        ) from None
