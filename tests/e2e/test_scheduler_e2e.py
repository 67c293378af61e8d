"""End to end: a real etcd, kube-apiserver and kube-scheduler with tessera's extender.

Opt-in (`make e2e`); runs only when the binaries are given:

    TESSERA_E2E_ETCD=/path/to/etcd
    TESSERA_E2E_KUBE_APISERVER=/path/to/kube-apiserver
    TESSERA_E2E_KUBE_SCHEDULER=/path/to/kube-scheduler

No kubelet runs: Nodes are created through the API with the tessera counts in their
status (as the device plugin would make the kubelet advertise them), NodeDevices and
heartbeat Leases are created as the node agent would. Checked: pods asking for fractions
and whole GPUs get bound by kube-scheduler through the extender and carry records that
verify for their UID and node; a pod no node can take stays Pending with tessera's reason
in its PodScheduled condition and events.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler_plugin.kube import ApiError, Connection, KubeClient, lease_path, pod_path
from tessera import resources as rn
from tessera.record import Keyring, decode

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    "etcd": "TESSERA_E2E_ETCD",
    "apiserver": "TESSERA_E2E_KUBE_APISERVER",
    "scheduler": "TESSERA_E2E_KUBE_SCHEDULER",
}
KEY = b"tessera-e2e-integrity-key-0123456789"
TOKEN = "tessera-e2e-admin-token"
NODES = ["e2e-node-0", "e2e-node-1"]
GPUS = 4


def _binaries() -> dict[str, str]:
    found = {}
    for name, var in ENV.items():
        path = os.environ.get(var, "")
        if not path or not os.access(path, os.X_OK):
            pytest.skip(f"set {var} to an executable {name} binary to run the e2e suite")
        found[name] = path
    return found


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (ApiError, OSError) as exc:
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Cluster:
    def __init__(self, work: Path, bins: dict[str, str]) -> None:
        self.work = work
        self.bins = bins
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.api_port = _port()
        self.extender_port = _port()
        self.client = KubeClient(
            Connection(f"https://127.0.0.1:{self.api_port}", verify=False, token=f"Bearer {TOKEN}")
        )

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.work / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append((name, proc))

    def start(self) -> None:
        w = self.work
        etcd_port, peer_port = _port(), _port()
        self.spawn(
            "etcd",
            [
                self.bins["etcd"],
                f"--data-dir={w / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
            ],
        )
        subprocess.run(
            ["openssl", "genrsa", "-out", str(w / "sa.key"), "2048"],
            check=True,
            capture_output=True,
        )
        (w / "tokens.csv").write_text(f'{TOKEN},admin,admin,"system:masters"\n')
        self.spawn(
            "kube-apiserver",
            [
                self.bins["apiserver"],
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--cert-dir={w / 'apiserver-certs'}",
                f"--token-auth-file={w / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={w / 'sa.key'}",
                f"--service-account-signing-key-file={w / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--disable-admission-plugins=ServiceAccount",
            ],
        )
        _wait(lambda: self.client.get("/readyz") is not None, 90, "kube-apiserver")
        kubeconfig = self.kubeconfig()
        self._objects()
        key = w / "integrity-key"
        key.write_bytes(KEY)
        self.spawn(
            "tessera-scheduler",
            [
                sys.executable,
                "-m",
                "scheduler_plugin.cli",
                f"--kubeconfig={kubeconfig}",
                f"--listen=127.0.0.1:{self.extender_port}",
                "--health-listen=127.0.0.1:0",
                "--no-leader-elect",
                f"--integrity-key-file={key}",
                "--log-level=debug",
            ],
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": "default-scheduler"}],
            "extenders": [
                {
                    "urlPrefix": f"http://127.0.0.1:{self.extender_port}",
                    "filterVerb": "filter",
                    "prioritizeVerb": "prioritize",
                    "preemptVerb": "preempt",
                    "bindVerb": "bind",
                    "weight": 5,
                    "httpTimeout": "10s",
                    "nodeCacheCapable": True,
                    "ignorable": False,
                    "managedResources": [
                        {"name": r, "ignoredByScheduler": False} for r in rn.TESSERA_RESOURCES
                    ],
                }
            ],
        }
        (w / "scheduler.yaml").write_text(yaml.safe_dump(config))
        self.spawn(
            "kube-scheduler",
            [
                self.bins["scheduler"],
                f"--config={w / 'scheduler.yaml'}",
                f"--secure-port={_port()}",
                f"--cert-dir={w / 'scheduler-certs'}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
            ],
        )

    def kubeconfig(self) -> str:
        path = self.work / "kubeconfig"
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": f"https://127.0.0.1:{self.api_port}",
                        "insecure-skip-tls-verify": True,
                    },
                }
            ],
            "users": [{"name": "admin", "user": {"token": TOKEN}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
            "current-context": "e2e",
        }
        path.write_text(json.dumps(doc))
        return str(path)

    def _objects(self) -> None:
        c = self.client
        crd_file = Path(os.environ.get("TESSERA_E2E_CRD", ROOT / "deploy/crds/nodedevices.yaml"))
        crd = yaml.safe_load(crd_file.read_text()) if crd_file.is_file() else _minimal_crd()
        c.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        c.create(
            "/api/v1/namespaces",
            {"metadata": {"name": rn.DEFAULT_HEARTBEAT_NAMESPACE}},
        )
        _wait(
            lambda: c.list(f"/apis/{rn.INVENTORY_GROUP}/{rn.INVENTORY_VERSION}/nodedevices"),
            60,
            "the NodeDevices CRD",
        )
        counts = {
            rn.GPU_CORE: str(100 * GPUS),
            rn.GPU_MEMORY_RATIO: str(100 * GPUS),
            rn.GPU_MEMORY: str(80 * GPUS),
            rn.GPU: str(100 * GPUS),
            rn.RDMA: "0",
            "cpu": "32",
            "memory": "256Gi",
            "pods": "110",
        }
        for node in NODES:
            c.create(
                "/api/v1/nodes",
                {"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}},
            )
            c.merge_patch(
                f"/api/v1/nodes/{node}/status",
                {
                    "status": {
                        "capacity": counts,
                        "allocatable": counts,
                        "conditions": [{"type": "Ready", "status": "True"}],
                    }
                },
            )
            c.create(
                f"/apis/{rn.INVENTORY_GROUP}/{rn.INVENTORY_VERSION}/nodedevices",
                {
                    "apiVersion": rn.INVENTORY_API_VERSION,
                    "kind": rn.INVENTORY_KIND,
                    "metadata": {"name": node},
                    "spec": _inventory(node),
                },
            )
            self.heartbeat(node)

    def heartbeat(self, node: str) -> None:
        """The node agent's Lease (long enough for the whole suite)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": rn.HEARTBEAT_LEASE_PREFIX + node},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 600, "renewTime": now},
        }
        self.client.create(lease_path(rn.DEFAULT_HEARTBEAT_NAMESPACE), lease)

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)
        for name, proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            print(f"--- {name} exited {proc.returncode}")

    def alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                tail = (self.work / f"{name}.log").read_text(errors="replace")[-4000:]
                raise AssertionError(f"{name} exited ({proc.returncode}):\n{tail}")


def _inventory(node: str) -> dict[str, Any]:
    return {
        "nodeName": node,
        "memoryUnitMiB": 1024,
        "gpus": [
            {
                "uuid": f"GPU-{node}-{i}",
                "index": i,
                "minor": i,
                "model": "NVIDIA H100 80GB HBM3",
                "memoryMiB": 81920,
                "pciBusId": f"0000:{0x10 + i:02x}:00.0",
                "numaNode": 0,
            }
            for i in range(GPUS)
        ],
        "rdma": [],
        "summary": {"gpus": GPUS},
    }


def _minimal_crd() -> dict[str, Any]:
    """Used only when deploy/crds/nodedevices.yaml (the device plugin's) is absent."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{rn.INVENTORY_PLURAL}.{rn.INVENTORY_GROUP}"},
        "spec": {
            "group": rn.INVENTORY_GROUP,
            "scope": "Cluster",
            "names": {
                "plural": rn.INVENTORY_PLURAL,
                "singular": "nodedevices",
                "kind": rn.INVENTORY_KIND,
            },
            "versions": [
                {
                    "name": rn.INVENTORY_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    bins = _binaries()
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make the service account key")
    work = Path(tempfile.mkdtemp(prefix="tessera-e2e-"))
    c = Cluster(work, bins)
    try:
        c.start()
        _wait(
            lambda: _ready(c.extender_port),
            90,
            "tessera-scheduler ready",
        )
        yield c
    finally:
        c.stop()
        if os.environ.get("TESSERA_E2E_KEEP"):
            print(f"e2e work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _ready(port: int) -> bool:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    conn.request("GET", "/readyz")
    return conn.getresponse().status == 200


def _pod(
    name: str, resources: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": resources, "requests": resources},
                }
            ]
        },
    }


def test_fractions_and_whole_gpus_are_scheduled_with_valid_records(cluster: Cluster) -> None:
    c = cluster.client
    wanted = {
        "frac-a": {rn.GPU_CORE: "30", rn.GPU_MEMORY_RATIO: "30"},
        "frac-b": {rn.GPU: "50"},
        "frac-c": {rn.GPU_CORE: "20", rn.GPU_MEMORY: "8"},
        "whole-2": {rn.GPU: "200"},
        "whole-4": {rn.GPU_CORE: "400", rn.GPU_MEMORY_RATIO: "400"},
    }
    for name, res in wanted.items():
        c.create(pod_path("default"), _pod(name, res))
    keyring = Keyring.single(KEY)
    seen: dict[str, set[str]] = {}
    for name, res in wanted.items():

        def bound(name: str = name) -> dict[str, Any] | None:
            cluster.alive()
            obj = c.get(pod_path("default", name))
            return obj if obj["spec"].get("nodeName") else None

        obj = _wait(bound, 120, f"pod {name} bound")
        node = obj["spec"]["nodeName"]
        text = obj["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION]
        alloc = decode(text, keyring, pod_uid=obj["metadata"]["uid"], node=node)
        (container,) = alloc.containers
        gpus = {g.uuid for g in container.gpus}
        whole = int(res.get(rn.GPU, res.get(rn.GPU_CORE, "0"))) // 100
        assert len(gpus) == max(1, whole)
        for uuid in gpus:
            assert uuid.startswith(f"GPU-{node}-")
        seen[name] = gpus
    # whole GPUs are nobody else's
    for name in ("whole-2", "whole-4"):
        for other, gpus in seen.items():
            if other != name:
                assert not (seen[name] & gpus), (name, other)


def test_an_unschedulable_pod_stays_pending_with_our_reason(cluster: Cluster) -> None:
    c = cluster.client
    c.create(
        pod_path("default"),
        _pod("wrong-model", {rn.GPU: "100"}, {rn.GPU_MODEL_ANNOTATION: "A100"}),
    )

    def reason() -> str | None:
        cluster.alive()
        obj = c.get(pod_path("default", "wrong-model"))
        assert not obj["spec"].get("nodeName")
        for cond in obj.get("status", {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                message = cond.get("message") or ""
                if "tessera: no GPU of model A100" in message:
                    return message
        return None

    _wait(reason, 120, "the PodScheduled condition with tessera's reason")
    events = c.list("/api/v1/namespaces/default/events").get("items") or []
    messages = [
        e.get("message") or e.get("note") or ""
        for e in events
        if (e.get("involvedObject") or e.get("regarding") or {}).get("name") == "wrong-model"
    ]
    assert any("no GPU of model A100" in m for m in messages), messages
