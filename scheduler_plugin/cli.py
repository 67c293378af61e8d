"""`tessera-scheduler`: the kube-scheduler extender process."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import ssl
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler_plugin import limits
from scheduler_plugin.config import SchedulerConfig
from tessera.policy_registry import POLICIES
from tessera.record_keys import KeyFileError
from tessera.resources import (
    DEFAULT_HEARTBEAT_NAMESPACE,
    DEFAULT_INTEGRITY_KEY_FILE,
    DEFAULT_POLICY,
    HEARTBEAT_LEASE_PREFIX,
)
from tessera_cli import CliParser, ConfigError
from tessera_cli.exit_codes import EXIT_USAGE
from tessera_cli.paths import check_readable_file
from tessera_cli.values import listen_address, seconds
from tessera_edge.keyfiles import KeyringSource, load_legacy_hmac_keys
from tessera_edge.logs import add_log_flags, setup_logging

log = logging.getLogger("scheduler_plugin")


def _body_size(text: str) -> int:
    if not text.isdigit() or not 1024 <= int(text) <= limits.MAX_BODY_LIMIT:
        raise argparse.ArgumentTypeError(
            f"expected a number of bytes from 1024 to {limits.MAX_BODY_LIMIT}, got {text[:80]!r}"
        )
    return int(text)


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def build_parser() -> CliParser:
    policies = sorted(POLICIES)
    default_policy = DEFAULT_POLICY
    p = CliParser(
        prog="tessera-scheduler",
        description=(
            "The tessera kube-scheduler extender: decides which GPUs and RDMA NICs every "
            "pod gets (filter, prioritize, preempt), writes the signed allocation record on "
            "the pod and binds it. Runs beside a stock kube-scheduler; see docs/scheduler.md."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group(
        "serving and security",
        "The extender port serves the verbs and /debug. kube-scheduler authenticates with a "
        "client certificate (--tls-client-ca-file); without one the verbs are refused on "
        "any non-loopback address unless --insecure-allow-unauthenticated. /debug needs a "
        "client certificate or a Kubernetes bearer token allowed to get the path "
        "(TokenReview + SubjectAccessReview). Probes and Prometheus use --health-listen.",
    )
    g.add_argument(
        "--listen",
        type=listen_address,
        default=("0.0.0.0", 8888),
        metavar="HOST:PORT",
        help="address for the extender verbs and /debug/ (also /healthz, /readyz, /metrics)",
    )
    g.add_argument(
        "--health-listen",
        type=listen_address,
        default=("0.0.0.0", 8081),
        metavar="HOST:PORT",
        help="plain-HTTP address for /healthz, /readyz and /metrics only (kubelet probes, "
        "Prometheus); port 0 picks a free port",
    )
    g.add_argument(
        "--tls-cert-file",
        help="serve HTTPS with this PEM certificate (chain); needs --tls-key-file",
    )
    g.add_argument("--tls-key-file", help="PEM private key of --tls-cert-file")
    g.add_argument(
        "--tls-client-ca-file",
        help="PEM CA bundle: the extender verbs need a client certificate it signed "
        "(kube-scheduler's tlsConfig certFile/keyFile); needs --tls-cert-file",
    )
    g.add_argument(
        "--insecure-allow-unauthenticated",
        action="store_true",
        help="serve the verbs and /debug to anyone who reaches the port, without client "
        "certificates or tokens (never in production: anyone could bind pods)",
    )
    g.add_argument(
        "--max-body-bytes",
        type=_body_size,
        default=limits.MAX_BODY_BYTES,
        help="largest request body, refused with 413 before it is read; the default holds "
        "5,000 node names (nodeCacheCapable true); use "
        f"{limits.NODE_OBJECTS_BODY_BYTES} with nodeCacheCapable false",
    )
    g = p.add_argument_group("cluster")
    g.add_argument(
        "--kubeconfig",
        help="kubeconfig file; default: $KUBECONFIG or ~/.kube/config when it exists, else "
        "the in-cluster service account when running in a pod",
    )
    g.add_argument("--context", help="kubeconfig context (default: its current context)")
    g.add_argument(
        "--api-timeout",
        type=seconds(),
        default=10.0,
        help="seconds one API request may take (keep below the extender httpTimeout)",
    )
    g.add_argument(
        "--heartbeat-namespace",
        default=DEFAULT_HEARTBEAT_NAMESPACE,
        help=f"namespace of the node agents' heartbeat Leases ({HEARTBEAT_LEASE_PREFIX}<node>)",
    )
    g.add_argument(
        "--heartbeat-grace",
        type=seconds(),
        default=5.0,
        help="seconds past a heartbeat Lease's duration before its node takes no new pods",
    )
    g.add_argument(
        "--no-heartbeat-check",
        dest="require_heartbeat",
        action="store_false",
        help="do not require node agent heartbeats (testing only)",
    )
    g.add_argument(
        "--no-watch-nodes",
        dest="watch_nodes",
        action="store_false",
        help="do not watch Node objects (an inventory then counts even without its Node)",
    )
    g.add_argument(
        "--status-interval",
        type=seconds(),
        default=2.0,
        help="seconds between batched writes of allocation summaries to NodeDevices status",
    )
    g.add_argument(
        "--no-status-writes",
        dest="write_status",
        action="store_false",
        help="do not write allocation summaries into NodeDevices status",
    )
    g = p.add_argument_group("decisions")
    g.add_argument(
        "--policy",
        choices=policies,
        default=default_policy,
        help="placement policy for nodes and devices (a pod may override it with the "
        "tessera.dev/placement annotation)",
    )
    g.add_argument(
        "--integrity-key-file",
        default=DEFAULT_INTEGRITY_KEY_FILE,
        help="PEM private key file, or directory of PEM keys (the Secret "
        "tessera-record-signing), that sign allocation records with Ed25519; nodes verify "
        "with the public keys. Re-read when the files change, so rotation needs no restart "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--legacy-hmac-key-file",
        default=None,
        metavar="PATH",
        help="upgrade from a release with HMAC records: the old integrity key file or "
        "directory. Its keys only verify old records while the state is rebuilt; each "
        "running pod's valid old record is then re-signed with Ed25519 once",
    )
    g.add_argument(
        "--manage-nvidia-gpu",
        action="store_true",
        help="also place nvidia.com/gpu requests (only where NVIDIA's device plugin is absent)",
    )
    g = p.add_argument_group("high availability")
    g.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="elect one leader among replicas on a Lease; only the leader is ready and answers",
    )
    g.add_argument(
        "--leader-elect-namespace",
        default=DEFAULT_HEARTBEAT_NAMESPACE,
        help="namespace of the leader election Lease",
    )
    g.add_argument(
        "--leader-elect-lease-name",
        default="tessera-scheduler",
        help="name of the leader election Lease",
    )
    g.add_argument(
        "--leader-elect-identity",
        default="",
        help="this replica's identity in the Lease (default: $POD_NAME_hostname when POD_NAME"
        " is set, as the shipped Deployment does, else hostname_pid)",
    )
    g.add_argument(
        "--leader-elect-lease-duration",
        type=seconds(),
        default=15.0,
        help="seconds a standby waits after the last renewal before taking over",
    )
    g.add_argument(
        "--leader-elect-renew-deadline",
        type=seconds(),
        default=10.0,
        help="seconds the leader keeps leading without a successful renewal",
    )
    g.add_argument(
        "--leader-elect-retry-period",
        type=seconds(),
        default=2.0,
        help="seconds between election attempts and renewals",
    )
    g = p.add_argument_group("logging")
    add_log_flags(g)
    return p


def check_config(config: SchedulerConfig) -> ssl.SSLContext | None:
    """Flag combinations and TLS material (a `ConfigError` on any problem); the TLS context."""
    from scheduler_plugin.http import tls_context

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
        return tls_context(cert, key, ca)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            "--tls-client-ca-file",
            f"not a PEM CA certificate ({getattr(exc, 'reason', None) or exc})",
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    config = SchedulerConfig.from_args(parser.parse_args(argv))
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
