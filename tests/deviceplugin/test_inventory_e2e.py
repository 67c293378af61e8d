"""The inventory against a real kube-apiserver (opt-in: `pytest -m e2e tests/deviceplugin`
with TESSERA_E2E_KUBECONFIG naming a kubeconfig for a disposable cluster)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from deviceplugin.inventory import InventoryConfig, InventoryPublisher, cr_path, lease_path
from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from tessera.model import NodeInventory
from tessera_edge.topology_file import load_topology
from tests.deviceplugin.conftest import ROOT

pytestmark = pytest.mark.e2e

NODE = "tessera-e2e-node"


@pytest.fixture
def api() -> Iterator[KubeClient]:
    kubeconfig = os.environ.get("TESSERA_E2E_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("set TESSERA_E2E_KUBECONFIG to run against a real kube-apiserver")
    client = KubeClient.connect(kubeconfig)
    crd = yaml.safe_load((ROOT / "deploy" / "crds" / "nodedevices.yaml").read_text())
    for path, body in [
        ("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd),
        ("/api/v1/namespaces", {"metadata": {"name": "tessera-system"}}),
        ("/api/v1/nodes", {"metadata": {"name": NODE}}),
    ]:
        try:
            client.request("POST", path, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
    deadline = time.monotonic() + 30
    while True:
        crd_now = client.request(
            "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nodedevices.tessera.dev"
        )
        conditions = {
            c["type"]: c["status"] for c in crd_now.get("status", {}).get("conditions", [])
        }
        if conditions.get("Established") == "True":
            break
        assert time.monotonic() < deadline, "CRD not established"
        time.sleep(0.5)
    yield client
    for path in (cr_path(NODE), f"/api/v1/nodes/{NODE}"):
        with contextlib.suppress(ApiError):
            client.request("DELETE", path)


def test_publish_labels_and_heartbeat(api: KubeClient, tmp_path: Path) -> None:
    inventory = load_topology("h100-sxm-8x", NODE)
    publisher = InventoryPublisher(api, InventoryConfig(NODE))
    publisher.publish(inventory)
    assert not publisher.publish(inventory, force_check=True)
    obj = api.request("GET", cr_path(NODE))
    assert NodeInventory.from_dict(obj["spec"]) == inventory
    # the scheduler's status survives our next replace
    obj["status"] = {"allocated": 1}
    api.request("PUT", cr_path(NODE) + "/status", obj)
    publisher.publish(inventory.with_gpu_health(inventory.gpus[0].uuid, False, "XID 79"))
    obj = api.request("GET", cr_path(NODE))
    assert obj["status"] == {"allocated": 1}
    assert obj["spec"]["summary"]["healthyGpuCount"] == 7
    publisher.update_labels(inventory)
    node = api.request("GET", f"/api/v1/nodes/{NODE}")
    assert node["metadata"]["labels"]["tessera.dev/gpu-count"] == "8"
    publisher.heartbeat()
    publisher.heartbeat()
    lease = api.request("GET", lease_path("tessera-system", f"tessera-node-{NODE}"))
    assert lease["spec"]["holderIdentity"] == NODE
