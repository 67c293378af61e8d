"""What the running node agent has imported, publishing its inventory with kubeconfig auth and
record verification keys (as `make bench` measures its memory): none of the modules it does
not use in steady state. Each name below was once loaded and cost resident memory."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tessera.record import Keyring
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.kubelet import KubeletSimulator, fake_agent_command
from tests.keyfiles import write_public

# runs the agent as `python -m deviceplugin.cli` does, and writes sys.modules to a file once
# the test asks (by creating the trigger file)
_WRAPPER = """
import os, runpy, sys, threading, time
trigger, report = sys.argv[1], sys.argv[2]
def watch():
    while not os.path.exists(trigger):
        time.sleep(0.05)
    with open(report + ".tmp", "w") as out:
        out.write("\\n".join(sorted(sys.modules)))
    os.rename(report + ".tmp", report)
threading.Thread(target=watch, daemon=True).start()
sys.argv = ["deviceplugin.cli", *sys.argv[3:]]
runpy.run_module("deviceplugin.cli", run_name="__main__", alter_sys=True)
"""

NOT_LOADED = frozenset(
    {
        # the kubeconfig loader's OIDC refresh (kube_edge/lean.py)
        "requests",
        "oauthlib.common",
        "requests_oauthlib.oauth2_session",
        # urllib3's http2 package __init__ (kube_edge/lean.py)
        "importlib.metadata",
        # importlib.resources for the built-in topologies (tessera_edge/topology_file.py)
        "importlib.resources",
        "zipfile",
        # imported by dependencies, unused by the agent (deviceplugin/__init__.py)
        "asyncio.base_events",
        "grpc.aio._channel",
        "cryptography.hazmat.primitives.serialization.ssh",
        "html.entities",
    }
)


def _loaded_modules(tmp: Path, sock_dir: Path) -> set[str]:
    with FakeApiServer() as api:
        api.create("nodes", {"metadata": {"name": "n1"}})
        kubeconfig = api.kubeconfig(str(tmp / "kubeconfig"))
        keys = write_public(Keyring.generate("test"), tmp / "record-keys")
        argv, env = fake_agent_command(
            sock_dir,
            "h100-sxm-8x",
            "--node-name",
            "n1",
            "--kubeconfig",
            kubeconfig,
            "--heartbeat-interval",
            "1",
            f"--integrity-key-file={keys}",
        )
        trigger, report = tmp / "trigger", tmp / "modules"
        argv = [argv[0], "-c", _WRAPPER, str(trigger), str(report), *argv[3:]]
        with KubeletSimulator(sock_dir) as kubelet:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
            try:
                kubelet.wait_registered(["tessera.dev/gpu-core"], timeout_s=30)
                deadline = time.monotonic() + 30
                while api.find("nodedevices", "n1") is None or not report.exists():
                    assert time.monotonic() < deadline, "no inventory, or no module list"
                    if api.find("nodedevices", "n1") is not None:
                        trigger.touch()
                    time.sleep(0.1)
            finally:
                proc.terminate()
                proc.wait(20)
    return set(report.read_text().split())


def test_the_agent_loads_only_what_it_uses(tmp_path: Path, sock_dir: Path) -> None:
    loaded = _loaded_modules(tmp_path, sock_dir)
    assert (
        "kube_edge.client" in loaded
        and "cryptography.hazmat.primitives.asymmetric.ed25519" in loaded
    )
    assert sorted(loaded & NOT_LOADED) == []
