"""tessera-scheduler's settings: each field declares its flag (tessera_cli.flags)."""

from __future__ import annotations

import argparse
import dataclasses

from scheduler_plugin.decisions.extender import FILTER_ANSWERS
from scheduler_plugin.service import Options
from scheduler_plugin.serving import limits
from tessera.gang.book import DEFAULT_RETRY_AFTER
from tessera.policy_registry import POLICIES
from tessera.resources import (
    DEFAULT_INTEGRITY_KEY_FILE,
    DEFAULT_NRI_PLUGIN_NAME,
    DEFAULT_POLICY,
    HEARTBEAT_LEASE_PREFIX,
    NRI_REQUIRED_PLUGINS_POD_ANNOTATION,
)
from tessera_cli.flags import FlagGroup
from tessera_cli.values import listen_address, namespace, nri_plugin_name

_SERVICE = Options()
"""The running service's own defaults: the flags below start from them."""

_SERVING = FlagGroup(
    "serving and security",
    "The extender port serves the verbs and /debug. kube-scheduler authenticates with a "
    "client certificate (--tls-client-ca-file); without one the verbs are refused on any "
    "non-loopback address unless --insecure-allow-unauthenticated. /debug needs a client "
    "certificate or a Kubernetes bearer token allowed to get the path (TokenReview + "
    "SubjectAccessReview). Probes and Prometheus use --health-listen.",
)
_CLUSTER = FlagGroup("cluster")
_DECISIONS = FlagGroup("decisions")
_HA = FlagGroup("high availability")


def _body_size(text: str) -> int:
    if not text.isdigit() or not 1024 <= int(text) <= limits.MAX_BODY_LIMIT:
        raise argparse.ArgumentTypeError(
            f"expected a number of bytes from 1024 to {limits.MAX_BODY_LIMIT}, got {text[:80]!r}"
        )
    return int(text)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    listen: tuple[str, int] = _SERVING.flag(
        "address for the extender verbs and /debug/ (also /healthz, /readyz, /metrics)",
        type=listen_address,
        default=(_SERVICE.host, _SERVICE.port),
        metavar="HOST:PORT",
    )
    health_listen: tuple[str, int] = _SERVING.flag(
        "plain-HTTP address for /healthz, /readyz and /metrics only (kubelet probes, "
        "Prometheus); port 0 picks a free port",
        type=listen_address,
        default=(_SERVICE.health_host, 8081),
        metavar="HOST:PORT",
    )
    tls_cert_file: str | None = _SERVING.flag(
        "serve HTTPS with this PEM certificate (chain); needs --tls-key-file"
    )
    tls_key_file: str | None = _SERVING.flag("PEM private key of --tls-cert-file")
    tls_client_ca_file: str | None = _SERVING.flag(
        "PEM CA bundle: the extender verbs need a client certificate it signed "
        "(kube-scheduler's tlsConfig certFile/keyFile); needs --tls-cert-file"
    )
    insecure_allow_unauthenticated: bool = _SERVING.switch(
        "serve the verbs and /debug to anyone who reaches the port, without client "
        "certificates or tokens (never in production: anyone could bind pods)"
    )
    http2: bool = _SERVING.switch(
        "also offer HTTP/2 on the TLS port (ALPN h2 first): kube-scheduler then keeps one "
        "connection for all its calls instead of a TLS handshake for each call that "
        "overlaps another; measured slower at 5,000 nodes on a 2-core control plane "
        "(docs/benchmarks.md), so off by default"
    )
    max_body_bytes: int = _SERVING.flag(
        "largest request body, refused with 413 before it is read; the default holds 5,000 "
        f"node names (nodeCacheCapable true); use {limits.NODE_OBJECTS_BODY_BYTES} with "
        "nodeCacheCapable false",
        type=_body_size,
        default=_SERVICE.max_body,
    )

    kubeconfig: str | None = _CLUSTER.flag(
        "kubeconfig file; default: $KUBECONFIG or ~/.kube/config when it exists, else the "
        "in-cluster service account when running in a pod"
    )
    context: str | None = _CLUSTER.flag("kubeconfig context (default: its current context)")
    api_timeout: float = _CLUSTER.duration(
        "seconds one API request may take (keep below the extender httpTimeout)",
        default=10.0,
    )
    heartbeat_namespace: str = _CLUSTER.flag(
        f"namespace of the node agents' heartbeat Leases ({HEARTBEAT_LEASE_PREFIX}<node>)",
        default=_SERVICE.heartbeat_namespace,
        type=namespace,
    )
    heartbeat_grace: float = _CLUSTER.duration(
        "seconds past a heartbeat Lease's duration before its node takes no new pods",
        default=_SERVICE.heartbeat_grace,
    )
    require_heartbeat: bool = _CLUSTER.off_switch(
        "do not require node agent heartbeats (testing only)",
        option="--no-heartbeat-check",
    )
    watch_nodes: bool = _CLUSTER.off_switch(
        "do not watch Node objects (an inventory then counts even without its Node)",
        option="--no-watch-nodes",
    )
    status_interval: float = _CLUSTER.duration(
        "seconds between batched writes of allocation summaries to NodeDevices status (each "
        "write costs the API server a whole NodeDevices object: a node taking pods "
        "continuously is written once per interval)",
        default=_SERVICE.status_interval,
    )
    write_status: bool = _CLUSTER.off_switch(
        "do not write allocation summaries into NodeDevices status",
        option="--no-status-writes",
    )

    policy: str = _DECISIONS.flag(
        "placement policy for nodes and devices (a pod may override it with the "
        "tessera.dev/placement annotation)",
        choices=sorted(POLICIES),
        default=DEFAULT_POLICY,
    )
    filter_answer: str = _DECISIONS.flag(
        "what filter answers when a pod fits: best, the policy's best node only (kube-scheduler "
        "then binds it without scoring: one extender call per pod, the policy's exact choice); "
        "all, every node that fits, weighed by prioritize and kube-scheduler's score plugins. "
        "Pods that state soft preferences (preferred affinity, ScheduleAnyway spread) always "
        "get all",
        choices=FILTER_ANSWERS,
        default=_SERVICE.filter_answer,
    )
    gangs: bool = _DECISIONS.off_switch(
        "turn gang placement off: PodGroups are not watched, and pods labelled "
        "scheduling.x-k8s.io/pod-group are placed one by one as they fit, like any pod, "
        "instead of all of a gang together or none (docs/gangs.md)",
        option="--no-gangs",
    )
    gang_timeout: float = _DECISIONS.duration(
        "seconds a placed gang's devices stay reserved for its members to bind, when its "
        "PodGroup sets no spec.scheduleTimeoutSeconds; the devices of members not bound by "
        f"then are released, and the gang is planned again {DEFAULT_RETRY_AFTER:g} seconds "
        "later (docs/gangs.md)",
        default=_SERVICE.gang_timeout,
    )
    integrity_key_file: str = _DECISIONS.flag(
        "PEM private key file, or directory of PEM keys (the Secret tessera-record-signing), "
        "that sign allocation records with Ed25519; nodes verify with the public keys. "
        "Re-read when the files change, so rotation needs no restart (default: %(default)s)",
        default=DEFAULT_INTEGRITY_KEY_FILE,
    )
    legacy_hmac_key_file: str | None = _DECISIONS.path(
        "upgrade from a release with HMAC records: the old integrity key file or directory. "
        "Its keys only verify old records while the state is rebuilt; each running pod's "
        "valid old record is then re-signed with Ed25519 once"
    )
    manage_nvidia_gpu: bool = _DECISIONS.switch(
        "also place nvidia.com/gpu requests (only where NVIDIA's device plugin is absent)"
    )
    nri_plugin_name: str = _DECISIONS.flag(
        "the NRI hook's name on the nodes (its --plugin-name). Each pod bound with a record "
        f"gets the annotation {NRI_REQUIRED_PLUGINS_POD_ANNOTATION} naming it, beside any "
        "plugins the pod names there itself, so that containerd 2.2 or later with NRI's "
        "default validator enabled refuses to create the pod's containers while the hook is "
        "not connected, see docs/nri_hook.md (default: %(default)s)",
        type=nri_plugin_name,
        default=DEFAULT_NRI_PLUGIN_NAME,
        metavar="NAME",
    )
    require_nri_plugin: bool = _DECISIONS.off_switch(
        f"do not write {NRI_REQUIRED_PLUGINS_POD_ANNOTATION} (containerd then relies on the "
        "node agent's gate alone to keep a pod's containers from starting without the hook)",
        option="--no-require-nri-plugin",
    )

    leader_elect: bool = _HA.flag(
        "elect one leader among replicas on a Lease; only the leader is ready and answers",
        action=argparse.BooleanOptionalAction,
        default=_SERVICE.leader_elect,
    )
    leader_elect_namespace: str = _HA.flag(
        "namespace of the leader election Lease",
        default=_SERVICE.leader_namespace,
        type=namespace,
    )
    leader_elect_lease_name: str = _HA.flag(
        "name of the leader election Lease", default=_SERVICE.leader_name
    )
    leader_elect_identity: str = _HA.flag(
        "this replica's identity in the Lease (default: $POD_NAME_hostname when POD_NAME is "
        "set, as the shipped Deployment does, else hostname_pid)",
        default="",
    )
    leader_elect_lease_duration: float = _HA.duration(
        "seconds a standby waits after the last renewal before taking over",
        default=_SERVICE.lease_duration,
    )
    leader_elect_renew_deadline: float = _HA.duration(
        "seconds the leader keeps leading without a successful renewal",
        default=_SERVICE.renew_deadline,
    )
    leader_elect_retry_period: float = _HA.duration(
        "seconds between election attempts and renewals", default=_SERVICE.retry_period
    )
    # the flags every program shares (tessera_edge.logs)
    log_format: str
    log_level: str

    @property
    def service(self) -> Options:
        """What the running extender needs (addresses, policy, leader election,
        heartbeats), from the flags."""
        return Options(
            host=self.listen[0],
            port=self.listen[1],
            policy=self.policy,
            leader_elect=self.leader_elect,
            leader_namespace=self.leader_elect_namespace,
            leader_name=self.leader_elect_lease_name,
            identity=self.leader_elect_identity,
            lease_duration=self.leader_elect_lease_duration,
            renew_deadline=self.leader_elect_renew_deadline,
            retry_period=self.leader_elect_retry_period,
            heartbeat_namespace=self.heartbeat_namespace,
            heartbeat_grace=self.heartbeat_grace,
            require_heartbeat=self.require_heartbeat,
            watch_nodes=self.watch_nodes,
            status_interval=self.status_interval,
            write_status=self.write_status,
            manage_nvidia_gpu=self.manage_nvidia_gpu,
            nri_plugin=self.nri_plugin_name if self.require_nri_plugin else None,
            filter_answer=self.filter_answer,
            gangs=self.gangs,
            gang_timeout=self.gang_timeout,
            max_body=self.max_body_bytes,
            health_host=self.health_listen[0],
            health_port=self.health_listen[1],
            open_debug=self.insecure_allow_unauthenticated,
        )
