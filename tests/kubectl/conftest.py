"""A cluster on the simulated API server: real NodeDevices from the built-in topologies,
heartbeat Leases, and tessera-scheduler (the real service) binding pods with signed records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.inventory import cr_spec
from tessera import resources as rn
from tessera_edge.topology_file import load_topology
from tessera_testbed.apiserver import FakeApiServer
from tests.scheduler.helpers import heartbeat


def nodedevices(node: str, topology: str) -> dict[str, Any]:
    """What the node agent publishes for a node with this topology."""
    return {
        "apiVersion": rn.INVENTORY_API_VERSION,
        "kind": rn.INVENTORY_KIND,
        "metadata": {"name": node},
        "spec": cr_spec(load_topology(topology, node_name=node)),
    }


def add_node(fake: FakeApiServer, node: str, topology: str, lease_age: float = 0.0) -> None:
    fake.create("nodes", {"metadata": {"name": node}})
    fake.create("nodedevices", nodedevices(node, topology))
    fake.create("leases", heartbeat(node, offset=-lease_age))


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kubeconfig(fake: FakeApiServer, tmp_path: Path) -> str:
    return fake.kubeconfig(str(tmp_path / "kubeconfig"))
