from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import binaries
from tests.e2e.controlplane import ControlPlane, topology_for, wait_for

NODES = [f"e2e-node-{i}" for i in range(4)]
TOPOLOGY = "h100-sxm-8x"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Collect this folder only when the e2e marker is selected (`make e2e`): the default
    run (`-m "not e2e"`) then does not even import it."""
    markexpr = str(config.option.markexpr or "")
    if "e2e" not in markexpr or "not e2e" in markexpr:
        return collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    return None


def _workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TESSERA_E2E_WORKDIR")))


def _cleanup(work: Path) -> None:
    if os.environ.get("TESSERA_E2E_KEEP"):
        print(f"e2e work dir kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def _spec_of(cp: ControlPlane, path: str) -> Any:
    return cp.admin.get(path).get("spec")


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-scheduler + two tessera-scheduler replicas + one node
    agent per node of NODES, all real processes (see controlplane.py)."""
    bins = binaries.require(*binaries.CONTROL_PLANE)
    work = _workdir("tessera-e2e-cp-")
    started = time.monotonic()
    cp = ControlPlane(work, bins)
    try:
        cp.start_api()
        cp.install()
        for node in NODES:
            cp.add_node(node, topology_for(node, TOPOLOGY, work))
        cp.start_schedulers(replicas=2, extra_managed=("nvidia.com/gpu",))
        for node in NODES:
            path = f"/apis/tessera.dev/v1alpha1/nodedevices/{node}"
            wait_for(
                functools.partial(_spec_of, cp, path), 60, f"{node}'s NodeDevices from its agent"
            )
        print(f"control plane up in {time.monotonic() - started:.1f}s ({work})")
        yield cp
    finally:
        codes = cp.stop()
        print(f"control plane exit codes: {codes}")
        _cleanup(work)
