"""A real control plane for the e2e suite: etcd, kube-apiserver (RBAC, admission policies),
kube-scheduler with tessera's extender configuration, tessera-scheduler replicas and node
agents on the fake backend.

Identities are the deployed ones: kube-scheduler is `system:kube-scheduler` (client
certificate), tessera-scheduler and the node agents use bound tokens of their own
ServiceAccounts (an agent's token is bound to its Node, as a pod's projected token is).
The admin token is the test's own: it creates Nodes and pods and reads results, never
runs a tessera component.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kube_edge import config as kube_config
from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from tessera import resources as rn
from tessera.record import Keyring
from tessera_edge.keyfiles import generate_key_files, load_keyring
from tests.e2e import pki

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "tessera-e2e-observer-" + f"{random.getrandbits(64):016x}"
NAMESPACE = rn.DEFAULT_HEARTBEAT_NAMESPACE
PYTHON_ENV = {"PYTHONPATH": str(ROOT)}

COLLECTIONS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
    ),
    "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
}
MANIFESTS = [
    "deploy/deviceplugin/namespace.yaml",
    "deploy/crds/nodedevices.yaml",
    "deploy/deviceplugin/rbac.yaml",
    "deploy/deviceplugin/admission-policy.yaml",
    "deploy/scheduler/serviceaccount.yaml",
    "deploy/scheduler/rbac.yaml",
    "deploy/scheduler/admission-policy.yaml",
]
"""What `kubectl apply -k deploy/` creates, less the workloads (this suite runs them as
processes)."""

FORBIDDEN_MARKERS = ("forbidden", "is not allowed", "Unauthorized", " 403 ")
"""Log text that means the API server refused an identity: RBAC or admission denial."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.25) -> T:
    """`check()`'s first truthy value; API and socket errors count as 'not yet'."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
            last = value
        except (ApiError, OSError) as exc:
            last = exc
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


class Proc:
    """One program of the cluster, logging to <work>/<name>.log (appended across restarts)."""

    def __init__(
        self,
        work: Path,
        name: str,
        cmd: list[str],
        env: dict[str, str] | None = None,
        identity_flag: str = "",
    ) -> None:
        self.name = name
        self.cmd = cmd
        self.identity_flag = identity_flag
        """When set, each start passes `<flag>=<name>-<start>`: a restarted replica is a new
        candidate, as a new pod (new host name and pid) would be."""
        self.env = dict(os.environ, **env) if env else None
        self.log = work / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.started_identity = ""

    def start(self) -> Proc:
        with self.log.open("ab") as log:
            log.write(f"=== start {self.starts} at {time.time():.3f}\n".encode())
            log.flush()
            cmd = list(self.cmd)
            if self.identity_flag:
                cmd.append(f"{self.identity_flag}={self.identity}")
            self.popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.started_identity = self.identity
        self.starts += 1
        return self

    @property
    def identity(self) -> str:
        return f"{self.name}-{self.starts}"

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (no Lease release, no flush)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()

    def stop(self, timeout: float = 15) -> int | None:
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


class LeaderProxy:
    """What the tessera-scheduler Service does for kube-scheduler: one address in front of
    the replicas, sending each connection to the replica that holds the election Lease
    (TLS passes through untouched)."""

    def __init__(self, admin: KubeClient, lease: str, ports: dict[str, int]) -> None:
        self.admin = admin
        self.lease = lease
        self.ports = ports
        self.port = free_port()
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", self.port))
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def holder(self) -> str:
        try:
            obj = self.admin.get(
                f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{self.lease}"
            )
        except ApiError:
            return ""
        return str((obj.get("spec") or {}).get("holderIdentity") or "")

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        holder = self.holder()
        ports = self.ports.items()
        port = next((p for n, p in ports if holder == n or holder.startswith(n + "-")), None)
        if port is None:
            client.close()
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            client.close()
            return
        self.connections += 1
        upstream.settimeout(None)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


class ControlPlane:
    def __init__(self, work: Path, bins: dict[str, Path]) -> None:
        self.work = work
        self.bins = bins
        self.procs: dict[str, Proc] = {}
        self.cluster_ca = pki.Authority(work / "pki", "cluster")
        self.tessera_ca = pki.Authority(work / "pki", "tessera")
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.admin = self.client(token=ADMIN_TOKEN)
        self.integrity_dir = work / "integrity"
        self.replica_ports: dict[str, int] = {}
        self.health_ports: dict[str, int] = {}
        """Each replica's plain-HTTP /metrics port."""
        self.proxy: LeaderProxy | None = None

    # --- plumbing --------------------------------------------------------------------------

    def client(self, token: str | None = None, pair: pki.Pair | None = None) -> KubeClient:
        cluster = kube_config.for_host(
            self.server,
            ca_file=str(self.cluster_ca.path),
            token=token,
            cert_file=str(pair.cert) if pair else None,
            key_file=str(pair.key) if pair else None,
        )
        return KubeClient(cluster, timeout=30, user_agent="tessera-e2e")

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(self.work, name, cmd, env).start()
        self.procs[name] = proc
        return proc

    def kubeconfig(self, name: str, token: str | None = None, pair: pki.Pair | None = None) -> Path:
        user: dict[str, str] = {}
        if token:
            user["token"] = token
        if pair:
            user["client-certificate"] = str(pair.cert)
            user["client-key"] = str(pair.key)
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.cluster_ca.path),
                    },
                }
            ],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": name}}],
            "current-context": "e2e",
        }
        path = self.work / f"{name}.kubeconfig"
        path.write_text(json.dumps(doc))
        path.chmod(0o600)
        return path

    def check_alive(self) -> None:
        for proc in self.procs.values():
            if proc.popen is not None and proc.popen.returncode is None and not proc.running():
                raise AssertionError(
                    f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}"
                )

    # --- the API server ----------------------------------------------------------------------

    def start_api(self, service_cidr: str = "10.0.0.0/24") -> None:
        w = self.work
        etcd_port, peer_port = free_port(), free_port()
        self.spawn(
            "etcd",
            [
                str(self.bins["etcd"]),
                f"--data-dir={w / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                "--quota-backend-bytes=2147483648",
            ],
        )
        serving = self.cluster_ca.issue("apiserver", "kube-apiserver", server=True)
        sa_key = pki.service_account_key(w / "pki" / "sa.key")
        tokens = w / "pki" / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},e2e-observer,e2e-observer,"system:masters"\n')
        self.spawn(
            "kube-apiserver",
            [
                str(self.bins["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--cert-dir={w / 'apiserver-certs'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.cluster_ca.path}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={service_cidr}",
                "--allow-privileged=true",
                "--profiling=false",
            ],
        )
        wait_for(self._api_ready, 180, "kube-apiserver ready", 1)

    def _api_ready(self) -> bool:
        """/readyz answers plain text, not JSON: read its status only."""
        import urllib3

        http = urllib3.PoolManager(ca_certs=str(self.cluster_ca.path), retries=False)
        try:
            answer = http.request(
                "GET",
                f"{self.server}/readyz",
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                timeout=5,
            )
        except urllib3.exceptions.HTTPError:
            return False  # not listening yet
        return answer.status == 200

    def apply(self, docs: Iterable[dict[str, Any]]) -> None:
        for doc in docs:
            if not doc:
                continue
            ns = (doc.get("metadata") or {}).get("namespace") or "default"
            path = COLLECTIONS[doc["kind"]].format(ns=ns)
            try:
                self.admin.create(path, doc)
            except ApiError as exc:
                if exc.status != 409:
                    raise

    def apply_files(self, files: Iterable[str]) -> None:
        for name in files:
            self.apply(yaml.safe_load_all((ROOT / name).read_text()))

    def install(self) -> None:
        """The deploy/ manifests, the default ServiceAccount and the integrity key."""
        self.apply_files(MANIFESTS)
        self.apply([{"kind": "ServiceAccount", "metadata": {"name": "default"}}])
        # what kube-controller-manager publishes in every namespace (pods mount it)
        ca = {"ca.crt": self.cluster_ca.path.read_text()}
        self.apply([{"kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"}, "data": ca}])
        crd = COLLECTIONS["CustomResourceDefinition"] + (
            f"/{rn.INVENTORY_PLURAL}.{rn.INVENTORY_GROUP}"
        )

        def established() -> bool:
            conds = self.admin.get(crd).get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        wait_for(established, 60, "the NodeDevices CRD established")
        self.integrity_dir.mkdir(exist_ok=True)
        make_integrity_key(self.integrity_dir)

    def token(self, account: str, node: str | None = None, namespace: str = NAMESPACE) -> str:
        """A bound token of `account` (bound to the Node `node` when given)."""
        spec: dict[str, Any] = {"expirationSeconds": 86400}
        if node:
            uid = self.admin.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
            spec["boundObjectRef"] = {"kind": "Node", "apiVersion": "v1", "name": node, "uid": uid}
        made = self.admin.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", {"spec": spec}
        )
        return str(made["status"]["token"])

    # --- tessera-scheduler and kube-scheduler ------------------------------------------------

    def start_schedulers(self, replicas: int = 2, extra_managed: tuple[str, ...] = ()) -> None:
        serving = self.tessera_ca.issue("tessera-scheduler", "tessera-scheduler", server=True)
        kubeconfig = self.kubeconfig("tessera-scheduler", token=self.token("tessera-scheduler"))
        for i in range(replicas):
            name = f"tessera-scheduler-{i}"
            port = free_port()
            self.replica_ports[name] = port
            self.health_ports[name] = free_port()
            self.procs[name] = Proc(
                self.work,
                name,
                [
                    sys.executable,
                    "-m",
                    "scheduler_plugin.cli",
                    f"--kubeconfig={kubeconfig}",
                    f"--listen=127.0.0.1:{port}",
                    f"--health-listen=127.0.0.1:{self.health_ports[name]}",
                    f"--tls-cert-file={serving.cert}",
                    f"--tls-key-file={serving.key}",
                    f"--tls-client-ca-file={self.tessera_ca.path}",
                    f"--integrity-key-file={self.integrity_dir / 'private'}",
                    "--manage-nvidia-gpu",
                    "--leader-elect",
                    "--leader-elect-lease-duration=4",
                    "--leader-elect-renew-deadline=3",
                    "--leader-elect-retry-period=0.5",
                    "--heartbeat-grace=2",
                    "--status-interval=1",
                    "--log-level=info",
                ],
                PYTHON_ENV,
                identity_flag="--leader-elect-identity",
            ).start()
        self.proxy = LeaderProxy(self.admin, "tessera-scheduler", self.replica_ports)
        wait_for(self.proxy.holder, 60, "a tessera-scheduler leader")
        self._start_kube_scheduler(extra_managed)

    def _start_kube_scheduler(self, extra_managed: tuple[str, ...]) -> None:
        assert self.proxy is not None
        url = f"https://127.0.0.1:{self.proxy.port}"
        self.start_kube_scheduler(self.kube_scheduler_config(url, extra_managed))

    def kube_scheduler_config(
        self, extender_url: str | None, extra_managed: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """The shipped KubeSchedulerConfiguration with this cluster's kubeconfig and TLS
        material; its extender calls `extender_url` (None: no extender, kube-scheduler
        alone)."""
        pair = self.cluster_ca.issue("kube-scheduler", "system:kube-scheduler")
        kubeconfig = self.kubeconfig("kube-scheduler", pair=pair)
        config: dict[str, Any] = yaml.safe_load(
            (ROOT / "deploy/scheduler/kube-scheduler-config.yaml").read_text()
        )
        config["clientConnection"]["kubeconfig"] = str(kubeconfig)
        config["leaderElection"] = {"leaderElect": False}
        if extender_url is None:
            del config["extenders"]
            return config
        client = self.tessera_ca.issue("kube-scheduler-client", "kube-scheduler")
        (extender,) = config["extenders"]
        extender["urlPrefix"] = extender_url
        extender["tlsConfig"] = {
            "certFile": str(client.cert),
            "keyFile": str(client.key),
            "caFile": str(self.tessera_ca.path),
        }
        for name in extra_managed:
            extender["managedResources"].append({"name": name, "ignoredByScheduler": False})
        return config

    def start_kube_scheduler(self, config: dict[str, Any]) -> Proc:
        """kube-scheduler with `config` (from kube_scheduler_config), as the process
        `kube-scheduler` (a running one is stopped first)."""
        old = self.procs.get("kube-scheduler")
        if old is not None:
            old.stop()
        kubeconfig = config["clientConnection"]["kubeconfig"]
        path = self.work / "kube-scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return self.spawn(
            "kube-scheduler",
            [
                str(self.bins["kube-scheduler"]),
                f"--config={path}",
                f"--secure-port={free_port()}",
                "--bind-address=127.0.0.1",
                f"--cert-dir={self.work / 'kube-scheduler-certs'}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "-v=2",
            ],
        )

    def tessera_replicas(self) -> list[Proc]:
        return [p for n, p in sorted(self.procs.items()) if n.startswith("tessera-scheduler-")]

    def leader(self) -> Proc | None:
        assert self.proxy is not None
        holder = self.proxy.holder()
        for proc in self.tessera_replicas():
            if proc.started_identity == holder:
                return proc
        return None

    # --- nodes and their agents ----------------------------------------------------------------

    def add_node(
        self,
        node: str,
        topology: Path,
        lease_duration: int = 8,
        labels: dict[str, str] | None = None,
    ) -> Proc:
        """A Node as a kubelet would register it (its counts from the agent's own
        --print-inventory; `labels` beside its hostname label), then the node agent for it
        with its node-bound identity."""
        agent_base = [
            sys.executable,
            "-m",
            "deviceplugin.cli",
            "--backend=fake",
            f"--topology={topology}",
            f"--node-name={node}",
            "--nvidia-gpu",
        ]
        printed = subprocess.run(
            [*agent_base, "--print-inventory", "--no-inventory"],
            capture_output=True,
            check=True,
            env=dict(os.environ, **PYTHON_ENV),
        )
        units = {k: str(v) for k, v in json.loads(printed.stdout)["units"].items()}
        if "nvidia.com/gpu" not in units:
            units["nvidia.com/gpu"] = str(int(units[rn.GPU]) // 100)
        counts = {**units, "cpu": "64", "memory": "512Gi", "pods": "400"}
        self.admin.create(
            "/api/v1/nodes",
            {
                "metadata": {
                    "name": node,
                    "labels": {"kubernetes.io/hostname": node, **(labels or {})},
                }
            },
        )
        self.admin.merge_patch(
            f"/api/v1/nodes/{node}/status",
            {
                "status": {
                    "capacity": counts,
                    "allocatable": counts,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "lastHeartbeatTime": _now(),
                            "lastTransitionTime": _now(),
                        }
                    ],
                }
            },
        )
        self.untaint(node)
        plugin_dir = self.work / "device-plugins" / node
        plugin_dir.mkdir(parents=True)
        kubeconfig = self.kubeconfig(
            f"agent-{node}", token=self.token("tessera-device-plugin", node)
        )
        return self.spawn(
            f"agent-{node}",
            [
                *agent_base,
                f"--kubeconfig={kubeconfig}",
                f"--device-plugin-dir={plugin_dir}",
                "--heartbeat-interval=2",
                f"--lease-duration={lease_duration}",
                "--health-query-interval=0",
                "--no-netlink",
            ],
            PYTHON_ENV,
        )

    def untaint(self, node: str) -> None:
        """No controller manager runs: drop the not-ready taint the API server's admission
        puts on new Nodes."""
        obj = self.admin.get(f"/api/v1/nodes/{node}")
        taints = [
            t
            for t in (obj.get("spec") or {}).get("taints") or []
            if not t["key"].startswith("node.kubernetes.io/")
        ]
        self.admin.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"taints": taints or None}})

    def remove_node(self, node: str) -> None:
        """The node leaves the cluster for good (its programs already stopped): its Node is
        deleted, and what the garbage collector would delete with it (no controller manager
        runs here): its NodeDevices and heartbeat Lease, which its agent made owned by the
        Node. Otherwise tessera-scheduler keeps counting it as a node whose agent is
        silent."""
        paths = (
            f"/api/v1/nodes/{node}",
            f"/apis/{rn.INVENTORY_API_VERSION}/{rn.INVENTORY_PLURAL}/{node}",
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/"
            f"{rn.HEARTBEAT_LEASE_PREFIX}{node}",
        )
        for path in paths:
            try:
                self.admin.request("DELETE", path)
            except ApiError as exc:
                if exc.status != 404:
                    raise

    # --- shutdown and logs -------------------------------------------------------------------

    def stop(self) -> dict[str, int | None]:
        if self.proxy is not None:
            self.proxy.close()
        codes = {}
        order = [n for n in self.procs if n not in ("etcd", "kube-apiserver")]
        order += ["kube-apiserver", "etcd"]
        for name in order:
            if name in self.procs:
                codes[name] = self.procs[name].stop()
        return codes

    def denials(self, names: Iterable[str] | None = None) -> list[str]:
        """Log lines of tessera's programs and kube-scheduler saying an identity was refused."""
        found = []
        for proc in self.procs.values():
            if names is not None and proc.name not in names:
                continue
            if proc.name in ("etcd", "kube-apiserver"):
                continue
            for line in proc.log.read_text(errors="replace").splitlines():
                if any(m in line for m in FORBIDDEN_MARKERS):
                    found.append(f"{proc.name}: {line[:400]}")
        return found


def make_integrity_key(folder: Path) -> None:
    """The record key pair, as tessera-keys makes it: folder/private (the scheduler's
    Secret) and folder/public (the nodes' Secret)."""
    generate_key_files(folder, "e2e")


def keyring(folder: Path) -> Keyring:
    """What the node side verifies records with: the public keys only."""
    return load_keyring(folder / "public")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def topology_for(node: str, base: str, folder: Path) -> Path:
    """A built-in topology with GPU UUIDs of this node's own (UUIDs are unique in a cluster)."""
    text = (ROOT / "tessera_edge" / "topologies" / f"{base}.yaml").read_text()
    tag = hashlib.sha256(node.encode()).hexdigest()[:8]
    path = folder / f"{node}.yaml"
    path.write_text(re.sub(r"GPU-[0-9a-f]{8}", f"GPU-{tag}", text))
    return path
