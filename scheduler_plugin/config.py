"""tessera-scheduler's settings: one frozen object built from the flags (or their
`TESSERA_*` twins); everything below the command line reads this, not argparse."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from scheduler_plugin.service import Options
from tessera_cli import config_from


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    service: Options
    """What the running extender needs (addresses, policy, leader election, heartbeats)."""
    kubeconfig: str | None
    context: str | None
    api_timeout: float
    tls_cert_file: str | None
    tls_key_file: str | None
    tls_client_ca_file: str | None
    integrity_key_file: str
    legacy_hmac_key_file: str | None
    log_format: str
    log_level: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SchedulerConfig:
        """The rest of the fields come from the flags of the same name."""
        return config_from(
            cls,
            args,
            service=Options(
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
            ),
        )
