"""Node agent benchmarks: Allocate round trip over the unix socket, re-registration after a
kubelet restart, and the agent's resident memory with the 8x H100 topology.

The agent runs as its own process (`python -m deviceplugin.cli`, fake backend), exactly as
deployed but without NVML; the kubelet is the test suite's simulator (tessera_testbed/kubelet.py)
in this process, and so is the API server (tessera_testbed/apiserver.py). With the inventory
publisher on, the agent runs as the DaemonSet runs it when this process may (root, unshare):
in-cluster auth from a service account folder mounted in a private mount namespace, HTTPS
to the API server; its kubeconfig figure (plain HTTP) is given too. Figures are wall-clock
on a shared machine, so expect noise.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: no GOAWAY info lines

import psutil

from bench.common import BenchContext, Result, mean, percentile
from tessera.record import Keyring
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.kubelet import KubeletSimulator, fake_agent_command
from tests.e2e.pki import Authority
from tests.keyfiles import write_public

ROOT = Path(__file__).resolve().parent.parent
TESSERA = (
    "tessera.dev/gpu-core",
    "tessera.dev/gpu-memory-ratio",
    "tessera.dev/gpu-memory",
    "tessera.dev/gpu",
    "tessera.dev/rdma",
)


def _agent_command(plugin_dir: Path, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    return fake_agent_command(
        plugin_dir, "h100-sxm-8x", "--node-name", "bench-node", "--log-level", "error", *extra
    )


def _start_agent(plugin_dir: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    argv, env = _agent_command(plugin_dir, extra)
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 1e6


def _allocate_and_restarts(ctx: BenchContext) -> list[Result]:
    calls = ctx.sized(quick=300, full=3000)
    restarts = ctx.sized(quick=3, full=10)
    with tempfile.TemporaryDirectory(prefix="dpb-", dir="/tmp") as tmp:
        plugin_dir = Path(tmp)
        kubelet = KubeletSimulator(plugin_dir)
        kubelet.start()
        proc = _start_agent(plugin_dir, ["--no-inventory"])
        try:
            kubelet.wait_registered(TESSERA, timeout_s=30)
            core = kubelet.endpoint("tessera.dev/gpu-core")
            snapshot = core.wait_for(lambda m: len(m.devices) == 800)
            ids = [d.ID for d in snapshot.devices]
            # a container asking for 1.5 GPUs' worth of compute: 150 IDs on two devices
            request_ids = ids[:150]
            for _ in range(50):  # warm up the channel and the server's threads
                kubelet.allocate("tessera.dev/gpu-core", request_ids)
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                kubelet.allocate("tessera.dev/gpu-core", request_ids)
                samples.append((time.perf_counter() - start) * 1000)
            preferred = []
            for _ in range(calls // 10):
                start = time.perf_counter()
                kubelet.get_preferred_allocation("tessera.dev/gpu-core", ids, [], 250)
                preferred.append((time.perf_counter() - start) * 1000)
            rss_serving = _rss_mb(proc.pid)
            recoveries = []
            for _ in range(restarts):
                restarted = kubelet.restart()
                done = kubelet.wait_registered(TESSERA, since=restarted, timeout_s=30)
                recoveries.append((max(done.values()) - restarted) * 1000)
                for resource in TESSERA:
                    kubelet.endpoint(resource).wait_for(lambda m: len(m.devices) > 0)
            rss_after = _rss_mb(proc.pid)
        finally:
            _stop(proc)
            kubelet.stop()
    return [
        Result(
            "Allocate round trip p99 (150 IDs, unix socket)",
            percentile(samples, 99),
            "ms",
            target=1.0,
            note=f"p50 {percentile(samples, 50):.3f} ms over {calls} calls",
        ),
        Result(
            "GetPreferredAllocation p99 (800 available, 250 wanted)",
            percentile(preferred, 99),
            "ms",
        ),
        Result(
            "re-registration after kubelet restart (max, 5 resources)",
            max(recoveries),
            "ms",
            target=1000.0,
            note=f"mean {mean(recoveries):.0f} ms over {restarts} restarts; the socket "
            "directory is polled every 100 ms",
        ),
        Result(
            "agent RSS, 8x H100, --no-inventory", max(rss_serving, rss_after), "MB", target=60.0
        ),
    ]


SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# in a private mount namespace: an empty /run (nothing of the host's is changed or hidden
# outside it) holding the service account folder a pod gets, then the agent
_IN_POD = (
    'mount -t tmpfs tmpfs /run && mkdir -p "$2" && mount --bind "$1" "$2" && shift 2 && exec "$@"'
)


def _can_run_in_a_pod() -> bool:
    """Root with unshare and mount, allowed to mount in a new mount namespace (a container
    may not be): the agent then runs with in-cluster auth, as deployed."""
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("unshare", "mount")):
        return False
    probe = ["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "x", "/run"]
    return subprocess.run(probe, capture_output=True, check=False, timeout=30).returncode == 0


def _serving_tls(folder: Path) -> tuple[ssl.SSLContext, Path]:
    """A throwaway CA and an API server certificate for 127.0.0.1: the context, the CA."""
    ca = Authority(folder, "cluster")
    pair = ca.issue("apiserver", "kubernetes", server=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pair.cert, pair.key)
    return tls, ca.path


def can_run_in_a_pod() -> bool:
    return _can_run_in_a_pod()


def rss_with_inventory(in_pod: bool, extra: tuple[str, ...] = ()) -> float:
    """The agent's RSS after it published its inventory and sent a few heartbeats: with the
    service account and HTTPS a pod gets (`in_pod`), else with a kubeconfig; `extra`
    flags as well."""
    return _rss_with_inventory(in_pod, extra)


def _rss_with_inventory(in_pod: bool, extra: tuple[str, ...] = ()) -> float:
    """See `rss_with_inventory`."""
    with tempfile.TemporaryDirectory(prefix="dpb-", dir="/tmp") as tmp:
        folder = Path(tmp)
        tls, ca = _serving_tls(folder / "pki") if in_pod else (None, None)
        with FakeApiServer(tls=tls) as api:
            api.create("nodes", {"metadata": {"name": "bench-node"}})
            plugin_dir = folder / "dp"
            kubelet = KubeletSimulator(plugin_dir)
            kubelet.start()
            # the verification keys the DaemonSet mounts: the agent then loads what it needs
            # to follow records in GetPreferredAllocation, as it does on a node
            keys = write_public(Keyring.generate("bench"), folder / "record-keys")
            flags = ["--heartbeat-interval", "1", f"--integrity-key-file={keys}", *extra]
            if in_pod:
                assert ca is not None
                account = folder / "serviceaccount"
                account.mkdir()
                (account / "token").write_text("bench-token")
                (account / "namespace").write_text("tessera-system")
                shutil.copy(ca, account / "ca.crt")
                argv, env = _agent_command(plugin_dir, flags)
                # no KUBECONFIG and no ~/.kube/config, as in a pod (kube_edge/config.py)
                env.pop("KUBECONFIG", None)
                env.update(
                    KUBERNETES_SERVICE_HOST="127.0.0.1",
                    KUBERNETES_SERVICE_PORT=str(api.port),
                    HOME=str(folder),
                )
                argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _IN_POD,
                        "sh", str(account), SERVICE_ACCOUNT, *argv]  # fmt: skip
                proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
            else:
                kubeconfig = api.kubeconfig(str(folder / "kubeconfig"))
                proc = _start_agent(plugin_dir, ["--kubeconfig", kubeconfig, *flags])
            try:
                kubelet.wait_registered(TESSERA, timeout_s=30)
                deadline = time.monotonic() + 30
                while api.find("nodedevices", "bench-node") is None:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the agent did not publish its inventory")
                    time.sleep(0.1)
                time.sleep(2.5)  # a few heartbeats
                rss = _rss_mb(proc.pid)
            finally:
                _stop(proc)
                kubelet.stop()
    return rss


def _rss_results() -> list[Result]:
    name = "agent RSS, 8x H100, with inventory (kubernetes client)"
    common = (
        "the client's REST layer and config loader only (kube_edge/lean.py); record "
        "verification keys given, as the DaemonSet mounts them (the cryptography package's "
        "Ed25519 code is resident). Libraries read back from disk (bench.common."
        "uncache_libraries); with every library file just written, as right after an "
        "install, the kernel maps whole cached folios and the same agent reads about 4 MB "
        "more, all of it shared library pages"
    )
    if not _can_run_in_a_pod():
        note = (
            "kubeconfig auth, plain HTTP (in-cluster auth needs root and a mount namespace); "
            + common
        )
        return [Result(name, _rss_with_inventory(False), "MB", target=60.0, note=note)]
    note = (
        "in-cluster auth, as the DaemonSet runs it: the pod's service account (token, CA) "
        "in a private mount namespace, HTTPS to the API server; " + common
    )
    return [
        Result(name, _rss_with_inventory(True), "MB", target=60.0, note=note),
        Result(
            "agent RSS, 8x H100, with inventory, kubeconfig auth",
            _rss_with_inventory(False),
            "MB",
            note="a kubeconfig with a token, plain HTTP; otherwise as above",
        ),
    ]


def run(ctx: BenchContext) -> list[Result]:
    return [*_allocate_and_restarts(ctx), *_rss_results()]
