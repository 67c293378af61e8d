"""`tessera-scheduler`: the kube-scheduler extender process."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from tessera.keys import KeyFileError, load_keyring
from tessera.logs import add_log_flags, setup_logging
from tessera.policies import POLICIES
from tessera.resources import (
    DEFAULT_HEARTBEAT_NAMESPACE,
    DEFAULT_INTEGRITY_KEY_FILE,
    DEFAULT_POLICY,
    HEARTBEAT_LEASE_PREFIX,
)

log = logging.getLogger("scheduler_plugin")


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def build_parser() -> argparse.ArgumentParser:
    policies = sorted(POLICIES)
    default_policy = DEFAULT_POLICY
    p = argparse.ArgumentParser(
        prog="tessera-scheduler",
        description=(
            "The tessera kube-scheduler extender: decides which GPUs and RDMA NICs every "
            "pod gets (filter, prioritize, preempt), writes the signed allocation record on "
            "the pod and binds it. Runs beside a stock kube-scheduler; see docs/scheduler.md."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("serving")
    g.add_argument(
        "--listen",
        type=_listen,
        default=("0.0.0.0", 8888),
        metavar="HOST:PORT",
        help="address for the extender verbs, /healthz, /readyz, /metrics and /debug/",
    )
    g.add_argument(
        "--tls-cert-file",
        help="serve HTTPS with this PEM certificate (chain); needs --tls-key-file",
    )
    g.add_argument("--tls-key-file", help="PEM private key of --tls-cert-file")
    g.add_argument(
        "--tls-client-ca-file",
        help="require client certificates signed by this PEM CA (kube-scheduler's "
        "tlsConfig.certFile/keyFile); without it any client may call",
    )
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=32 * 1024 * 1024,
        help="largest request body accepted; larger ones get 413",
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
        type=float,
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
        type=float,
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
        type=float,
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
        help="file or directory (mounted Secret) with the key(s) that sign allocation "
        "records; the node agents verify with the same Secret",
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
        help="this replica's identity in the Lease (default: hostname_pid)",
    )
    g.add_argument(
        "--leader-elect-lease-duration",
        type=float,
        default=15.0,
        help="seconds a standby waits after the last renewal before taking over",
    )
    g.add_argument(
        "--leader-elect-renew-deadline",
        type=float,
        default=10.0,
        help="seconds the leader keeps leading without a successful renewal",
    )
    g.add_argument(
        "--leader-elect-retry-period",
        type=float,
        default=2.0,
        help="seconds between election attempts and renewals",
    )
    g = p.add_argument_group("logging")
    add_log_flags(g)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    if bool(args.tls_cert_file) != bool(args.tls_key_file):
        log.error("--tls-cert-file and --tls-key-file go together")
        return 2
    try:
        keyring = load_keyring(args.integrity_key_file)
    except KeyFileError as exc:
        log.error("%s", exc)
        return 2

    from scheduler_plugin.http import tls_context
    from scheduler_plugin.kube import KubeClient, load_connection
    from scheduler_plugin.service import Options, Service

    tls = None
    if args.tls_cert_file:
        try:
            tls = tls_context(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
        except (OSError, ValueError) as exc:
            log.error("cannot load the TLS files: %s", exc)
            return 2
    try:
        conn, cfg = load_connection(args.kubeconfig, args.context)
    except Exception as exc:
        log.error("cannot load the cluster configuration: %s", exc)
        return 2
    client = KubeClient(conn, timeout=args.api_timeout, refresh=cfg, pool_size=32)
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
    )
    try:
        service = Service(options, client, keyring, tls=tls).start()
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", options.host, options.port, exc)
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
