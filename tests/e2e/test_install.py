"""Both install modes against a real kube-apiserver, as docs/operations.md walks them.

The shell blocks of the walkthrough's two sections run as written (bash, from a scratch
folder holding `deploy/`, with `kubectl` pointing at this API server; `/etc/kubernetes` is
a scratch folder). Second-scheduler mode then really schedules: the stock kube-scheduler
binary with the shipped KubeSchedulerConfiguration (profile `tessera`) and
tessera-scheduler with the shipped container's arguments, both under the identity the
Deployment's pod has (the `tessera-scheduler` service account), place the walkthrough's
fractional pod, whose record verifies with the walkthrough's public key. No kubelet runs
the Deployment here: the two processes stand in for its containers.

Also: both overlays and both chart renderings pass `kubectl apply --dry-run=server`; the
chart is installed for real with helm-sdkpy (then upgraded to the other mode and
uninstalled), and what it renders agrees with the overlay of the same mode on images,
commands, args, ports, probes, mounts, RBAC, Services, admission policies and the
KubeSchedulerConfiguration.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_edge.client import pod_path
from kube_edge.errors import ApiError
from tessera import resources as rn
from tessera_edge.keyfiles import load_keyring
from tests.deploy import install_modes as im
from tests.e2e import binaries
from tests.e2e import pods as P  # noqa: N812 - read as 'pods.' everywhere
from tests.e2e.controlplane import (
    ADMIN_TOKEN,
    ROOT,
    ControlPlane,
    free_port,
    topology_for,
    wait_for,
)

pytestmark = pytest.mark.e2e
binaries.skip_module_unless(*binaries.CONTROL_PLANE)

SERVICE_CIDR = "10.96.0.0/12"
"""kubeadm's default Service CIDR: the extender overlay's fixed ClusterIP lies in it."""
NODE = "gpu-node-1"
COMMAND_TIMEOUT = 300
"""Seconds for one walkthrough block (RSA key generation and a kubectl wait included)."""
HELM_TIMEOUT = 180
"""Seconds for one helm-sdkpy install, upgrade or uninstall against the local API server."""


class Walkthrough:
    """Runs documented commands as an operator would, against the test's API server."""

    def __init__(self, cp: ControlPlane, folder: Path) -> None:
        self.cp = cp
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "deploy").symlink_to(ROOT / "deploy")
        self.etc = folder / "etc-kubernetes"
        self.etc.mkdir()
        kubeconfig = cp.kubeconfig("operator", token=ADMIN_TOKEN)
        bindir = str(Path(sys.executable).parent)  # tessera-keys, kubectl-tessera
        self.env = dict(
            os.environ,
            KUBECONFIG=str(kubeconfig),
            PATH=f"{bindir}:{os.environ.get('PATH', '')}",
            NODE=NODE,
        )

    def run(self, block: str) -> str:
        script = block.replace("/etc/kubernetes", str(self.etc))
        return self._command(["bash", "-euo", "pipefail", "-c", script], block)

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self._command(["kubectl", *args], f"kubectl {' '.join(args)}", stdin)

    def _command(self, argv: list[str], what: str, stdin: str | None = None) -> str:
        """`argv`'s output, run in the walkthrough's folder and environment; it must succeed."""
        done = subprocess.run(
            argv,
            check=False,
            cwd=self.folder,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
        assert done.returncode == 0, f"{what}\n--- stdout\n{done.stdout}\n--- {done.stderr}"
        return done.stdout


@pytest.fixture(scope="module")
def api() -> Iterator[ControlPlane]:
    """etcd and kube-apiserver only: everything else comes from the install."""
    bins = binaries.require(*binaries.CONTROL_PLANE)
    work = Path(tempfile.mkdtemp(prefix="tessera-e2e-install-"))
    cp = ControlPlane(work, bins)
    try:
        cp.start_api(service_cidr=SERVICE_CIDR)
        # what kube-controller-manager makes: the default namespace's service account
        cp.apply([{"kind": "ServiceAccount", "metadata": {"name": "default"}}])
        yield cp
    finally:
        print(f"install e2e exit codes: {cp.stop()}")
        if not os.environ.get("TESSERA_E2E_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def walk(api: ControlPlane) -> Walkthrough:
    im.kubectl_or_skip()
    return Walkthrough(api, api.work / "operator")


def _container(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    spec = im.pod_templates(objs)["tessera-scheduler"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == name]
    return dict(c)


def _swap_port(args: list[str], flag: str, port: int) -> list[str]:
    return [
        f"{flag}={a.split('=', 1)[1].rsplit(':', 1)[0]}:{port}" if a.startswith(flag + "=") else a
        for a in args
    ]


def _run_second_scheduler(walk: Walkthrough, objs: list[dict[str, Any]]) -> None:
    """tessera-scheduler and kube-scheduler as the Deployment's two containers run them:
    the shipped arguments and configuration, the pod's service account identity."""
    cp = walk.cp
    token = cp.token("tessera-scheduler")
    kubeconfig = cp.kubeconfig("tessera-scheduler-pod", token=token)
    tessera = _container(objs, "tessera-scheduler")
    args = list(tessera["args"])
    (listen,) = [a for a in args if a.startswith("--listen=")]
    port = int(listen.rsplit(":", 1)[1])
    if not _port_free(port):  # keep the extender URL and the listen address in step
        port = free_port()
        args = _swap_port(args, "--listen", port)
    args = _swap_port(args, "--health-listen", free_port())
    keys = walk.folder / "keys" / "private"  # what the Secret tessera-record-signing holds
    args = [
        f"--integrity-key-file={keys}" if a.startswith("--integrity-key-file=") else a for a in args
    ]
    cp.spawn(
        "pod-tessera-scheduler",
        [sys.executable, "-m", "scheduler_plugin.cli", *args, f"--kubeconfig={kubeconfig}"],
        {"PYTHONPATH": str(ROOT)},
    )
    ks = _container(objs, "kube-scheduler")
    cm = im.by_kind(objs)[("ConfigMap", im.NAMESPACE, "tessera-kube-scheduler-config")]
    (text,) = cm["data"].values()
    config = yaml.safe_load(text)
    config["clientConnection"]["kubeconfig"] = str(kubeconfig)  # in a pod: in-cluster
    (ext,) = config["extenders"]
    ext["urlPrefix"] = re.sub(r":\d+$", f":{port}", ext["urlPrefix"])
    path = cp.work / "tessera-kube-scheduler-config.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [
        a
        for a in ks["command"][1:]
        if not a.startswith(("--config=", "--cert-dir=", "--secure-port="))
    ]
    cp.spawn(
        "pod-kube-scheduler",
        [
            str(cp.bins["kube-scheduler"]),
            f"--config={path}",
            f"--cert-dir={cp.work / 'pod-kube-scheduler-certs'}",
            f"--secure-port={free_port()}",
            "--bind-address=127.0.0.1",
            # in a pod these default to the in-cluster identity: the same account
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            *command,
        ],
    )


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_second_scheduler_walkthrough_places_a_fractional_pod(walk: Walkthrough) -> None:
    cp = walk.cp
    keys, apply, label, pod = im.doc_blocks("Second-scheduler mode, step by step")
    walk.run(keys)
    assert "kubectl apply --server-side -k deploy/overlays/second-scheduler" in apply
    walk.run(apply)
    objs = im.overlay("second-scheduler")
    for kind, ns, name in im.by_kind(objs):
        got = walk.kubectl("get", kind, name, *(["-n", ns] if ns else []), "-o", "name")
        assert got.strip(), (kind, ns, name)
    # a GPU node (Node object and its agent, as the DaemonSet would run it)
    cp.add_node(NODE, topology_for(NODE, "h100-sxm-8x", cp.work))
    wait_for(
        lambda: cp.admin.get(f"/apis/tessera.dev/v1alpha1/nodedevices/{NODE}").get("spec"),
        60,
        "the node's NodeDevices",
    )
    _run_second_scheduler(walk, objs)
    walk.run(label)
    try:
        out = walk.run(pod)
    except AssertionError:
        cp.check_alive()
        raise
    assert "share-demo" in out and NODE in out, out
    placed = cp.admin.get(pod_path("default", "share-demo"))
    record = P.record(placed, load_keyring(walk.folder / "keys" / "public"))
    assert record.containers and record.containers[0].gpus, record
    assert placed["spec"]["schedulerName"] == "tessera"

    # "Check either mode" and "Checking capacity": the page's commands, as written
    def core_allocated() -> bool:
        return (
            walk.kubectl(
                "get",
                "nodedevices",
                NODE,
                "-o",
                "jsonpath={.status.allocation.summary.coreAllocated}",
            )
            == "20"
        )

    wait_for(core_allocated, 30, "the scheduler's totals in the node's NodeDevices status")
    header, *rows = walk.kubectl("get", "nodedevices").splitlines()
    assert header.split()[:4] == ["NAME", "GPUS", "HEALTHY", "MODEL"], header
    assert header.split()[-5:] == ["CORE-ALLOC", "CORE-FREE", "MEM-ALLOC", "MEM-FREE", "AGE"]
    (row,) = [r.split() for r in rows if r.split()[0] == NODE]
    assert row[1:3] == ["8", "8"] and row[-5:-3] == ["20", "780"], row
    assert "summary:" in walk.kubectl("get", "nodedevices", NODE, "-o", "yaml")
    assert re.search(rf"^{NODE}\s+ready\b", walk.kubectl("tessera", "nodes"), re.M)
    leases = walk.kubectl("-n", im.NAMESPACE, "get", "lease", "-o", "name")
    assert "lease.coordination.k8s.io/tessera-kube-scheduler" in leases.split()
    assert "lease.coordination.k8s.io/tessera-scheduler" in leases.split()
    _gang_in_second_scheduler_mode(walk)
    assert not cp.denials(["pod-kube-scheduler", "pod-tessera-scheduler"])
    # a pod asking for tessera resources without naming tessera's scheduler is refused
    lost = P.pod("no-scheduler-name", {rn.GPU_CORE: "20"})

    def refused() -> str:
        try:
            cp.admin.create(pod_path("default"), lost)
        except ApiError as exc:
            return str(exc) if "schedulerName" in str(exc) else ""
        P.delete_now(cp.admin, "no-scheduler-name")  # the policy not active yet: again
        return ""

    wait_for(refused, 30, "the scheduler-name policy refusing a tessera pod")
    # a pod for the cluster's default scheduler is not tessera's (none runs here: Pending)
    walk.kubectl("run", "not-tessera", "--image=busybox", "--restart=Never")
    wait_for(lambda: cp.admin.get(pod_path("default", "not-tessera")), 10, "the pod")
    assert not P.bound(cp.admin, "not-tessera")


def _gang_in_second_scheduler_mode(walk: Walkthrough) -> None:
    """docs/gangs.md in this mode: the PodGroup CRD created where absent, a gang of two
    waits whole for its second member, then both bind."""
    cp = walk.cp
    walk.kubectl("create", "-f", "deploy/crds/podgroups.yaml")
    groups = f"/apis/{rn.POD_GROUP_GROUP}/{rn.POD_GROUP_VERSION}/namespaces/default/podgroups"

    def group_created() -> bool:
        cp.admin.create(
            groups,
            {
                "apiVersion": f"{rn.POD_GROUP_GROUP}/{rn.POD_GROUP_VERSION}",
                "kind": rn.POD_GROUP_KIND,
                "metadata": {"name": "pair"},
                "spec": {"minMember": 2},
            },
        )
        return True

    wait_for(group_created, 60, "the PodGroup CRD serving")

    def member(name: str) -> None:
        obj = P.pod(name, {rn.GPU: "200"}, labels={rn.POD_GROUP_LABEL: "pair"})
        obj["spec"]["schedulerName"] = "tessera"
        cp.admin.create(pod_path("default"), obj)

    member("pair-0")
    said = [""]

    def gang_reason() -> bool:
        said[0] = P.pending_reason(cp.admin, "pair-0")
        return "gang default/pair: 1 of 2 members pending" in said[0]

    try:
        wait_for(gang_reason, 90, "the gang's reason on its first member")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its PodScheduled message: {said[0]!r}") from None
    # kubectl tessera reads the same from the API server (a real label selector)
    gangs = walk.kubectl("tessera", "gangs")
    assert re.search(
        r"^default\s+pair\s+2\s+1\s+0\s+waiting\s+"
        r"\d+[smhd](?: \(timeout \d+s\))?\s+"  # WAITED, past the timeout or not
        r"pair-0\s+1 of 2 members pending$",
        gangs,
        re.M,
    ), gangs
    explained = walk.kubectl("tessera", "explain", "pair-0")
    assert (
        "Waits for its gang default/pair (waiting; 1 pending, 0 bound, minMember 2): " in explained
    )
    member("pair-1")
    wait_for(
        lambda: P.bound(cp.admin, "pair-0") and P.bound(cp.admin, "pair-1"), 60, "the pair bound"
    )
    assert re.search(
        r"^default\s+pair\s+2\s+0\s+2\s+bound\b", walk.kubectl("tessera", "gangs"), re.M
    )


@pytest.mark.parametrize("mode", im.MODES)
def test_overlays_pass_server_side_dry_run(walk: Walkthrough, mode: str) -> None:
    out = walk.kubectl(
        "apply", "--server-side", "--dry-run=server", "-k", f"deploy/overlays/{mode}"
    )
    assert "(server dry run)" in out, out


def _helm(walk: Walkthrough) -> Any:
    helm = im.helm_or_skip()
    return helm, helm.Configuration(namespace=im.NAMESPACE, kubeconfig=walk.env["KUBECONFIG"])


def _manifest(result: dict[str, Any]) -> list[dict[str, Any]]:
    text = result.get("manifest") or result.get("Manifest") or ""
    assert text, sorted(result)
    return [d for d in yaml.safe_load_all(text) if d]


def _comparable(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The essentials, less what only one side renders: the Namespace (kustomize) and the
    CRD (the chart installs it from crds/, outside its manifest)."""
    return {
        k: v
        for k, v in im.essentials(objs).items()
        if not k.startswith(("Namespace/", "CustomResourceDefinition/"))
    }


def _agree(chart: list[dict[str, Any]], overlay: list[dict[str, Any]]) -> None:
    a, b = _comparable(chart), _comparable(overlay)
    assert sorted(a) == sorted(b)
    diffs = [
        "\n".join(
            difflib.unified_diff(
                yaml.safe_dump(a[k]).splitlines(),
                yaml.safe_dump(b[k]).splitlines(),
                f"chart {k}",
                f"overlay {k}",
                lineterm="",
            )
        )
        for k in a
        if a[k] != b[k]
    ]
    assert not diffs, "\n".join(diffs)


def test_chart_installs_for_real_and_agrees_with_the_overlays(walk: Walkthrough) -> None:
    helm, config = _helm(walk)
    cp = walk.cp
    installed = asyncio.run(
        helm.Install(config).run(
            "tessera",
            str(im.CHART),
            wait=False,
            timeout=HELM_TIMEOUT,
            take_ownership=True,  # the walkthrough applied the same objects with kubectl
        )
    )
    manifest = _manifest(installed)
    _agree(manifest, im.overlay("second-scheduler"))
    (cp.work / "chart-second-scheduler.yaml").write_text(yaml.safe_dump_all(manifest))
    for kind, ns, name in im.by_kind(manifest):
        got = walk.kubectl("get", kind, name, *(["-n", ns] if ns else []), "-o", "name")
        assert got.strip(), (kind, ns, name)
    extender = {"mode": "extender", "scheduler": {"clusterIP": "10.96.0.50"}}
    upgraded = asyncio.run(
        helm.Upgrade(config).run(
            "tessera", str(im.CHART), values=extender, wait=False, timeout=HELM_TIMEOUT
        )
    )
    manifest = _manifest(upgraded)
    _agree(manifest, im.overlay("extender"))
    (cp.work / "chart-extender.yaml").write_text(yaml.safe_dump_all(manifest))
    service = cp.admin.get(f"/api/v1/namespaces/{im.NAMESPACE}/services/tessera-scheduler")
    assert service["spec"]["clusterIP"] == "10.96.0.50"
    for mode in im.MODES:
        out = walk.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "-f",
            str(cp.work / f"chart-{mode}.yaml"),
        )
        assert "(server dry run)" in out, out
    asyncio.run(helm.Uninstall(config).run("tessera", wait=True, timeout=HELM_TIMEOUT))
    gone = walk.kubectl("-n", im.NAMESPACE, "get", "deployment", "-o", "name")
    assert "tessera-scheduler" not in gone


def test_extender_walkthrough(walk: Walkthrough) -> None:
    """The extender section's commands (after the record keys made above), then the stock
    kube-scheduler starts with the configuration and client material they installed."""
    cp = walk.cp
    if shutil.which("openssl") is None:
        pytest.skip("the TLS steps need openssl")
    tls, apply, install = im.doc_blocks("Extender mode, step by step")
    walk.run(tls)
    walk.run(apply)
    service = cp.admin.get(f"/api/v1/namespaces/{im.NAMESPACE}/services/tessera-scheduler")
    config_path = walk.etc / "tessera" / "kube-scheduler-config.yaml"
    walk.run(install)
    config = yaml.safe_load(config_path.read_text())
    (ext,) = config["extenders"]
    assert ext["urlPrefix"] == f"https://{service['spec']['clusterIP']}:8443"
    for name in ("client.crt", "client.key", "ca.crt"):
        assert (walk.etc / "tessera" / name).is_file(), name
    # kubeadm's kubeconfig of kube-scheduler, where the configuration expects it
    pair = cp.cluster_ca.issue("kube-scheduler", "system:kube-scheduler")
    shutil.copy(cp.kubeconfig("kube-scheduler", pair=pair), walk.etc / "scheduler.conf")
    text = config_path.read_text().replace("/etc/kubernetes", str(walk.etc))
    config_path.write_text(text)
    proc = cp.spawn(
        "extender-kube-scheduler",
        [
            str(cp.bins["kube-scheduler"]),
            f"--config={config_path}",
            f"--secure-port={free_port()}",
            "--bind-address=127.0.0.1",
            f"--cert-dir={cp.work / 'extender-kube-scheduler-certs'}",
            f"--authentication-kubeconfig={walk.etc / 'scheduler.conf'}",
            f"--authorization-kubeconfig={walk.etc / 'scheduler.conf'}",
        ],
    )
    lease = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler"

    def leading() -> str:
        cp.check_alive()  # a configuration or TLS file it refuses stops it at start
        return str(cp.admin.get(lease)["spec"].get("holderIdentity") or "")

    # it started with the extender and its client material, and leads as kubeadm's would
    wait_for(leading, 60, "kube-scheduler with the extender configuration leading")
    proc.stop()
    assert not cp.denials(["extender-kube-scheduler"])
