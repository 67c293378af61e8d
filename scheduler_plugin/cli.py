"""`tessera-scheduler`: the kube-scheduler extender process."""

from __future__ import annotations

import ipaddress
import logging
import signal
import ssl
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler_plugin.config import SchedulerConfig
from scheduler_plugin.serving import limits
from tessera.record_keys import KeyFileError
from tessera_cli import CliParser, ConfigError, DefaultsHelpFormatter, config_from
from tessera_cli.exit_codes import EXIT_USAGE
from tessera_cli.flags import add_flags
from tessera_cli.paths import check_readable_file
from tessera_edge.keyfiles import KeyringSource, load_legacy_hmac_keys
from tessera_edge.logs import add_log_flags, setup_logging
from tessera_edge.threads import name_os_threads

log = logging.getLogger("scheduler_plugin")


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def build_parser() -> CliParser:
    p = CliParser(
        prog="tessera-scheduler",
        description=(
            "The tessera kube-scheduler extender: decides which GPUs and RDMA NICs every "
            "pod gets (filter, prioritize, preempt), writes the signed allocation record on "
            "the pod and binds it. Runs beside a stock kube-scheduler; see docs/scheduler.md."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    add_flags(p, SchedulerConfig)
    add_log_flags(p.add_argument_group("logging"))
    return p


def check_config(config: SchedulerConfig) -> ssl.SSLContext | None:
    """Flag combinations and TLS material (a `ConfigError` on any problem); the TLS context."""
    from scheduler_plugin.serving.server import tls_context

    cert, key, ca = config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file
    for flag, value in (
        ("--tls-cert-file", cert),
        ("--tls-key-file", key),
        ("--tls-client-ca-file", ca),
    ):
        if value is not None:
            check_readable_file(flag, Path(value))
    if bool(cert) != bool(key):
        missing = "--tls-key-file" if cert else "--tls-cert-file"
        raise ConfigError(missing, "--tls-cert-file and --tls-key-file go together")
    if ca and not cert:
        raise ConfigError("--tls-client-ca-file", "needs --tls-cert-file and --tls-key-file")
    options = config.service
    if options.port != 0 and options.port == options.health_port:
        raise ConfigError("--health-listen", "--listen and --health-listen need different ports")
    if not ca and not options.open_debug and not is_loopback(options.host):
        raise ConfigError(
            f"--listen {options.host}",
            "not a loopback address: set --tls-client-ca-file (with "
            "--tls-cert-file/--tls-key-file) so only kube-scheduler can bind pods, or "
            "--insecure-allow-unauthenticated",
        )
    if not cert or not key:
        return None
    try:
        tls_context(cert, key, None)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            "--tls-cert-file",
            f"with --tls-key-file: not a PEM certificate and its key "
            f"({getattr(exc, 'reason', None) or exc})",
        ) from None
    try:
        return tls_context(cert, key, ca, http2=config.http2)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            "--tls-client-ca-file",
            f"not a PEM CA certificate ({getattr(exc, 'reason', None) or exc})",
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    config = config_from(SchedulerConfig, parser.parse_args(argv))
    try:
        return run(config)
    except ConfigError as exc:
        return parser.fail(exc)


def _keyring(config: SchedulerConfig) -> KeyringSource:
    legacy = config.legacy_hmac_key_file
    try:
        old = load_legacy_hmac_keys(legacy) if legacy else {}
    except KeyFileError as exc:
        raise ConfigError("--legacy-hmac-key-file", str(exc)) from None
    try:
        return KeyringSource(config.integrity_key_file, "sign", legacy_hmac=old)
    except KeyFileError as exc:
        raise ConfigError("--integrity-key-file", str(exc)) from None


def run(config: SchedulerConfig) -> int:
    """Serve until SIGTERM/SIGINT; a `ConfigError` for settings that cannot work."""
    tls = check_config(config)
    setup_logging(config.log_format, config.log_level)
    name_os_threads()
    keyring = _keyring(config)

    from kube_edge.client import KubeClient
    from scheduler_plugin.service import Service

    try:
        client = KubeClient.connect(
            config.kubeconfig,
            config.context,
            timeout=config.api_timeout,
            pool_size=limits.API_CONNECTIONS,
            user_agent="tessera-scheduler",
        )
    except Exception as exc:
        raise ConfigError("--kubeconfig", f"cannot load the cluster configuration: {exc}") from None
    options = config.service
    try:
        service = Service(options, client, keyring, tls=tls).start()
    except OSError as exc:
        log.error(
            "cannot listen (--listen %s:%d, --health-listen %s:%d): %s",
            options.host,
            options.port,
            options.health_host,
            options.health_port,
            exc,
        )
        return EXIT_USAGE  # an address this host cannot serve: a setting to fix
    done = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: shutting down", signum)
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    done.wait()
    service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
