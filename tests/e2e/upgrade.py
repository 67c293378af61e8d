"""Two releases of tessera side by side, for the upgrade and rollback e2e cases.

The previous release is a git revision of this repository (PREVIOUS_RELEASE, or
$TESSERA_E2E_PREVIOUS_RELEASE: a revision, or a folder holding a checkout), unpacked with
`git archive` into the test's work folder with its protobuf stubs generated; this checkout
is the new one. Each program runs from its release's tree with this suite's interpreter
(`python -P` and PYTHONPATH=<tree>: the tree's packages, never this checkout's), with the
arguments the release's installed objects give its container, read back from the API
server after Helm or kubectl applied them. No controller manager runs: the test stands in
for a Deployment's or DaemonSet's rollout by stopping a program (SIGTERM, as the kubelet
does) and starting the other release's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.controlplane import ROOT, ControlPlane, Proc, free_port

PREVIOUS_RELEASE = "86d4f2e"
"""The release the upgrade starts from: the tree before the record compatibility rule."""
PREVIOUS_VAR = "TESSERA_E2E_PREVIOUS_RELEASE"
NAMESPACE = "tessera-system"


@dataclass(frozen=True)
class Release:
    name: str
    tree: Path

    @property
    def chart(self) -> Path:
        return self.tree / "deploy" / "helm" / "tessera"

    def overlay(self, mode: str) -> Path:
        return self.tree / "deploy" / "overlays" / mode

    def env(self, **extra: str) -> dict[str, str]:
        return {"PYTHONPATH": str(self.tree), **extra}

    def command(self, module: str, args: list[str]) -> list[str]:
        return [sys.executable, "-P", "-m", module, *args]


def previous_release(work: Path) -> Release:
    """The previous release's tree, unpacked into `work` (or the folder the variable names)."""
    wanted = os.environ.get(PREVIOUS_VAR, PREVIOUS_RELEASE)
    if Path(wanted).is_dir():
        tree = Path(wanted).resolve()
    else:
        tree = work / "previous-release"
        tree.mkdir()
        archive = work / "previous-release.tar"
        done = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "-o", str(archive), wanted],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(
                f"cannot unpack the previous release {wanted} (${PREVIOUS_VAR}): {done.stderr}"
            )
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        archive.unlink()
    subprocess.run(
        [sys.executable, "-P", "tools/gen_protos.py"], cwd=tree, check=True, capture_output=True
    )
    return Release(f"previous ({wanted})", tree)


def this_release() -> Release:
    return Release("this checkout", ROOT)


READ_SCRIPT = """
import json, sys
from tessera.record import decode
from tessera_edge.keyfiles import load_keyring
keys = load_keyring(sys.argv[1])
out = {}
for name, (text, uid, node) in json.load(sys.stdin).items():
    try:
        decode(text, keys, require_integrity=True, pod_uid=uid, node=node)
        out[name] = ""
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def unreadable(release: Release, public_keys: Path, pods: list[dict[str, Any]]) -> dict[str, str]:
    """What `release`'s record reader says about each pod's record ('' when it reads it),
    run in a process of its own on its own tree."""
    from tessera.resources import ALLOCATION_ANNOTATION  # one annotation in both releases

    wanted = {
        p["metadata"]["name"]: (
            p["metadata"]["annotations"][ALLOCATION_ANNOTATION],
            p["metadata"]["uid"],
            p["spec"]["nodeName"],
        )
        for p in pods
    }
    done = subprocess.run(
        [sys.executable, "-P", "-c", READ_SCRIPT, str(public_keys)],
        input=json.dumps(wanted),
        capture_output=True,
        text=True,
        env=dict(os.environ, **release.env()),
        check=True,
        timeout=120,
    )
    return {k: v for k, v in json.loads(done.stdout).items() if v}


def with_flags(args: list[str], flags: dict[str, str | None]) -> list[str]:
    """`args` with each flag of `flags` set to its value (None: removed; '': a bare flag),
    appended when `args` lacks it."""
    out = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag not in flags:
            out.append(arg)
    for flag, value in flags.items():
        if value is not None:
            out.append(f"{flag}={value}" if value else flag)
    return out


def container(cp: ControlPlane, kind: str, name: str, container_name: str) -> dict[str, Any]:
    """A container of an installed Deployment's or DaemonSet's pod template."""
    plural = {"Deployment": "deployments", "DaemonSet": "daemonsets"}[kind]
    obj = cp.admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/{plural}/{name}")
    (found,) = [
        c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == container_name
    ]
    return dict(found)


def spawn(cp: ControlPlane, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
    """`cmd` as the process `name` of `cp` (a running one is stopped first)."""
    old = cp.procs.get(name)
    if old is not None:
        old.stop()
    proc = Proc(cp.work, name, cmd, env).start()
    cp.procs[name] = proc
    return proc


def loopback() -> str:
    return f"127.0.0.1:{free_port()}"


def since_start(proc: Proc) -> str:
    """What `proc` logged since its latest start."""
    return proc.tail(1 << 20).rsplit("=== start ", 1)[-1]
