"""`tessera-scheduler`: the kube-scheduler extender process."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import signal
import ssl
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from scheduler_plugin import limits
from tessera.policy_registry import POLICIES
from tessera.record_keys import KeyFileError
from tessera.resources import (
    DEFAULT_HEARTBEAT_NAMESPACE,
    DEFAULT_INTEGRITY_KEY_FILE,
    DEFAULT_POLICY,
    HEARTBEAT_LEASE_PREFIX,
)
from tessera_edge.keyfiles import KeyringSource, load_legacy_hmac_keys
from tessera_edge.logs import add_log_flags, setup_logging

log = logging.getLogger("scheduler_plugin")


class _Parser(argparse.ArgumentParser):
    """Every usage error is one line on stderr naming the flag, and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    if int(port) > 65535:
        raise argparse.ArgumentTypeError(f"port {port} is not in 0..65535")
    host = host.strip("[]") or "0.0.0.0"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise argparse.ArgumentTypeError(
                f"HOST must be an IP address or localhost, got {host!r}"
            ) from None
        host = "127.0.0.1"
    return host, int(port)


def _unreadable(text: str) -> str | None:
    """Why the file cannot be read, or None."""
    path = Path(text)
    if not path.exists():
        return f"{text} does not exist"
    if not path.is_file():
        return f"{text} is not a file"
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        return f"cannot read {text}: {exc.strerror}"
    return None


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _body_size(text: str) -> int:
    if not text.isdigit() or not 1024 <= int(text) <= limits.MAX_BODY_LIMIT:
        raise argparse.ArgumentTypeError(
            f"expected a number of bytes from 1024 to {limits.MAX_BODY_LIMIT}, got {text!r}"
        )
    return int(text)


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def build_parser() -> argparse.ArgumentParser:
    policies = sorted(POLICIES)
    default_policy = DEFAULT_POLICY
    p = _Parser(
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
        type=_listen,
        default=("0.0.0.0", 8888),
        metavar="HOST:PORT",
        help="address for the extender verbs and /debug/ (also /healthz, /readyz, /metrics)",
    )
    g.add_argument(
        "--health-listen",
        type=_listen,
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
        help="kubeconfig file; default: the in-cluster service account when running in a "
        "pod, else $KUBECONFIG or ~/.kube/config",
    )
    g.add_argument("--context", help="kubeconfig context (default: its current context)")
    g.add_argument(
        "--api-timeout",
        type=_positive,
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
        type=_positive,
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
        type=_positive,
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
        type=_positive,
        default=15.0,
        help="seconds a standby waits after the last renewal before taking over",
    )
    g.add_argument(
        "--leader-elect-renew-deadline",
        type=_positive,
        default=10.0,
        help="seconds the leader keeps leading without a successful renewal",
    )
    g.add_argument(
        "--leader-elect-retry-period",
        type=_positive,
        default=2.0,
        help="seconds between election attempts and renewals",
    )
    g = p.add_argument_group("logging")
    add_log_flags(g)
    return p


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ssl.SSLContext | None:
    """Flag combinations and TLS material (parser.error on any problem); the TLS context."""
    from scheduler_plugin.http import tls_context

    for flag in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
        value = getattr(args, flag)
        problem = value is not None and _unreadable(value)
        if problem:
            parser.error(f"argument --{flag.replace('_', '-')}: {problem}")
    if bool(args.tls_cert_file) != bool(args.tls_key_file):
        parser.error("--tls-cert-file and --tls-key-file go together")
    if args.tls_client_ca_file and not args.tls_cert_file:
        parser.error("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
    if args.listen[1] != 0 and args.listen[1] == args.health_listen[1]:
        parser.error("--listen and --health-listen need different ports")
    if (
        not args.tls_client_ca_file
        and not args.insecure_allow_unauthenticated
        and not is_loopback(args.listen[0])
    ):
        parser.error(
            f"--listen {args.listen[0]} is not a loopback address: set --tls-client-ca-file "
            "(with --tls-cert-file/--tls-key-file) so only kube-scheduler can bind pods, or "
            "--insecure-allow-unauthenticated"
        )
    if not args.tls_cert_file:
        return None
    try:
        tls_context(args.tls_cert_file, args.tls_key_file, None)
    except (OSError, ssl.SSLError, ValueError) as exc:
        parser.error(
            f"--tls-cert-file/--tls-key-file: not a PEM certificate and its key "
            f"({getattr(exc, 'reason', None) or exc})"
        )
    try:
        return tls_context(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        parser.error(
            f"--tls-client-ca-file: not a PEM CA certificate "
            f"({getattr(exc, 'reason', None) or exc})"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    tls = check_args(parser, args)
    setup_logging(args.log_format, args.log_level)
    try:
        legacy = (
            load_legacy_hmac_keys(args.legacy_hmac_key_file) if args.legacy_hmac_key_file else {}
        )
        keyring = KeyringSource(args.integrity_key_file, "sign", legacy_hmac=legacy)
    except KeyFileError as exc:
        log.error("%s", exc)
        return 2

    from kube_edge.client import KubeClient
    from scheduler_plugin.service import Options, Service

    try:
        client = KubeClient.connect(
            args.kubeconfig,
            args.context,
            timeout=args.api_timeout,
            pool_size=limits.API_CONNECTIONS,
            user_agent="tessera-scheduler",
        )
    except Exception as exc:
        log.error("cannot load the cluster configuration: %s", exc)
        return 2
    options = Options(
        host=args.listen[0],
        port=args.listen[1],
        policy=args.policy,
        leader_elect=args.leader_elect,
        leader_namespace=args.leader_elect_namespace,
        leader_name=args.leader_elect_lease_name,
        identity=args.leader_elect_identity,
        lease_duration=args.leader_elect_lease_duration,
        renew_deadline=args.leader_elect_renew_deadline,
        retry_period=args.leader_elect_retry_period,
        heartbeat_namespace=args.heartbeat_namespace,
        heartbeat_grace=args.heartbeat_grace,
        require_heartbeat=args.require_heartbeat,
        watch_nodes=args.watch_nodes,
        status_interval=args.status_interval,
        write_status=args.write_status,
        manage_nvidia_gpu=args.manage_nvidia_gpu,
        max_body=args.max_body_bytes,
        health_host=args.health_listen[0],
        health_port=args.health_listen[1],
        open_debug=args.insecure_allow_unauthenticated,
    )
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
        return 2
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
