"""The shipped tessera-scheduler Deployment, run by a real kubelet and containerd.

Its pod template (image, command, args, probes, Secrets, service account, security
context, resources) is used as deploy/scheduler/deployment.yaml writes it, with three
changes this host needs and says why: hostNetwork (no CNI here), the API server's address
in KUBERNETES_SERVICE_HOST/PORT (no kube-proxy behind the `kubernetes` Service), and a
nodeSelector for the one node with a kubelet (the control plane's other nodes are API
objects only). No kube-controller-manager runs, so the test creates the pod the
ReplicaSet would. The image is built offline from this checkout (tests/e2e/image.py).

Checked: the pod runs as the non-root user on a read-only root with mTLS on, is not Ready
while another replica leads (its plain-HTTP /readyz probe says so), becomes Ready when it
takes the Lease over, and then kube-scheduler, with a client certificate, has it place
and bind a fractional pod whose record verifies.
"""

from __future__ import annotations

import copy
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kube_edge.client import pod_path
from tessera import resources as rn
from tests.e2e import binaries, image
from tests.e2e import pods as P  # noqa: N812 - read as 'pods.' everywhere
from tests.e2e.controlplane import NAMESPACE, ROOT, ControlPlane, keyring, wait_for
from tests.e2e.node import Node, device_root, node_host_or_skip

pytestmark = pytest.mark.e2e
binaries.skip_module_unless(*binaries.CONTROL_PLANE, "kubelet", "runc")
BUSYBOX = node_host_or_skip("the Deployment test")

DEPLOYMENT = ROOT / "deploy/scheduler/deployment.yaml"
POD = "tessera-scheduler-deployed"
READY_TIMEOUT = 120.0
"""Seconds for the pod to start and pass its readiness probe (image unpack included)."""


def _container_ports(template: dict[str, Any]) -> dict[str, int]:
    (container,) = template["spec"]["containers"]
    return {p["name"]: int(p["containerPort"]) for p in container["ports"]}


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def deployed_node(control_plane: ControlPlane) -> Iterator[Node]:
    """A real node (the newest containerd given) with tessera's image imported, and the
    Secrets the Deployment mounts, made as deploy/README.md says."""
    cp = control_plane
    release = binaries.containerd_releases()[-1]
    name = "real-deploy"
    n = Node.h100(cp, name, release, BUSYBOX)
    devices = device_root(n.work / "host", gpus=8, uverbs=36)
    # pods the control-plane tests left Pending would land on this fresh node
    for obj in cp.admin.list(pod_path(P.NS)).get("items") or []:
        P.delete_now(cp.admin, obj["metadata"]["name"])
    template = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]
    for port in _container_ports(template).values():
        if not _free(port):
            pytest.skip(f"port {port} of the Deployment is taken on this host (hostNetwork)")
    try:
        n.start_containerd()
        n.import_image()
        (container,) = template["spec"]["containers"]
        archive = image.build(
            n.work / "tessera-image.tar",
            container["image"],
            {"tessera-scheduler": "scheduler_plugin.cli:main"},
        )
        n.ctr("images", "import", str(archive))
        archive.unlink()
        n.start_hook(devices)
        n.start_kubelet()
        n.start_agent()
        _secrets(cp)
        yield n
    finally:
        n.stop()
        cp.remove_node(name)


def _secrets(cp: ControlPlane) -> None:
    serving = cp.tessera_ca.issue("tessera-scheduler-pod", "tessera-scheduler", server=True)
    tls = {
        "tls.crt": serving.cert.read_text(),
        "tls.key": serving.key.read_text(),
        "client-ca.crt": cp.tessera_ca.path.read_text(),
    }
    # what kube-controller-manager publishes in every namespace (pods mount it)
    ca = {"ca.crt": cp.cluster_ca.path.read_text()}
    meta = {"name": "kube-root-ca.crt", "namespace": NAMESPACE}
    cp.apply([{"kind": "ConfigMap", "metadata": meta, "data": ca}])
    keys = {p.name: p.read_text() for p in (cp.integrity_dir / "private").iterdir()}
    for secret, data in (("tessera-scheduler-tls", tls), ("tessera-record-signing", keys)):
        meta = {"name": secret, "namespace": NAMESPACE}
        cp.apply([{"kind": "Secret", "metadata": meta, "type": "Opaque", "stringData": data}])


def _deployment_pod(cp: ControlPlane, node: str) -> dict[str, Any]:
    template = copy.deepcopy(yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"])
    spec = template["spec"]
    spec["hostNetwork"] = True
    spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    (container,) = spec["containers"]
    container["imagePullPolicy"] = "Never"
    container["env"] = [
        *container.get("env", []),
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(cp.api_port)},
    ]
    meta = dict(template["metadata"], name=POD, namespace=NAMESPACE)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _ready(obj: dict[str, Any]) -> bool:
    conds = obj.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def test_the_shipped_deployment_becomes_ready_and_serves_kube_scheduler_over_mtls(
    deployed_node: Node,
) -> None:
    cp = deployed_node.cp
    path = pod_path(NAMESPACE, POD)
    created = time.monotonic()
    cp.admin.create(pod_path(NAMESPACE), _deployment_pod(cp, deployed_node.name))
    replicas = cp.tessera_replicas()
    try:

        def running() -> dict[str, Any] | None:
            cp.check_alive()
            obj = cp.admin.get(path)
            return obj if obj.get("status", {}).get("phase") == "Running" else None

        try:
            obj = wait_for(running, READY_TIMEOUT, f"{POD} Running", every=1)
        except AssertionError as exc:
            status = cp.admin.get(path).get("status")
            raise AssertionError(f"{exc}; the pod's status: {status}") from None
        (status,) = obj["status"]["containerStatuses"]
        assert status["restartCount"] == 0, status
        print(f"the Deployment's pod Running {time.monotonic() - created:.1f}s after creation")
        # a standby: alive, synced, not the leader, so not Ready (the Service skips it)
        time.sleep(5)
        assert not _ready(cp.admin.get(path)), "a replica that does not lead must not be Ready"
        ports = _container_ports(obj)
        with socket.create_connection(("127.0.0.1", ports["health"]), timeout=5) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = s.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 503"), answer

        # the process replicas shut down (releasing the Lease): the pod takes over
        for proc in replicas:
            proc.stop()
        assert cp.proxy is not None

        def leading() -> str | None:
            holder = cp.proxy.holder() if cp.proxy else ""
            return holder if holder.startswith(POD) else None

        stopped = time.monotonic()
        holder = wait_for(leading, 60, f"{POD} holding the Lease", every=0.5)
        cp.replica_ports[holder] = ports["https"]
        wait_for(lambda: _ready(cp.admin.get(path)), READY_TIMEOUT, f"{POD} Ready", every=0.5)
        print(f"the pod Ready {time.monotonic() - stopped:.1f}s after the other replicas stopped")

        # kube-scheduler -> (client certificate) -> the pod: filter, prioritize, bind
        share = P.pod("via-deployment", {rn.GPU_CORE: "20", rn.GPU_MEMORY: "10"})
        cp.admin.create(pod_path(P.NS), share)
        placed = wait_for(lambda: P.bound(cp.admin, "via-deployment"), 60, "the share bound")
        record = P.record(placed, keyring(cp.integrity_dir))
        assert record.containers and record.containers[0].gpus, record
        assert cp.proxy.connections > 0
    finally:
        P.delete_now(cp.admin, "via-deployment")
        cp.admin.request("DELETE", path)  # graceful: the pod releases the Lease
        for key in [k for k in cp.replica_ports if k.startswith(POD)]:
            del cp.replica_ports[key]
        for proc in replicas:
            if not proc.running():
                proc.start()
        wait_for(
            lambda: (
                any(cp.proxy.holder().startswith(p.name + "-") for p in replicas)
                if cp.proxy
                else None
            ),
            60,
            "a process replica leading again",
        )
