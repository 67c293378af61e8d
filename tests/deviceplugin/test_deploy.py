"""The manifests agree with the code: CRD names and schema, RBAC = the calls actually made."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.inventory import InventoryConfig, InventoryPublisher, cr_spec
from deviceplugin.record_pods import RecordChooser
from kube_edge.client import KubeClient
from tessera.isolation import NodeIsolation
from tessera.record import Keyring
from tessera.resources import (
    DEFAULT_HEARTBEAT_NAMESPACE,
    DEFAULT_INTEGRITY_KEY_FILE,
    INVENTORY_GROUP,
    INVENTORY_KIND,
    INVENTORY_PLURAL,
    INVENTORY_VERSION,
)
from tessera_edge.keyfiles import KeyringSource
from tessera_edge.topology_file import load_topology
from tessera_testbed.apiserver import FakeApiServer, parse_path
from tests.deviceplugin.conftest import ROOT

DEPLOY = ROOT / "deploy"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _crd() -> dict[str, Any]:
    (crd,) = _docs(DEPLOY / "crds" / "nodedevices.yaml")
    return crd


def test_crd_names_match_the_shared_constants() -> None:
    crd = _crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{INVENTORY_PLURAL}.{INVENTORY_GROUP}"
    assert (spec["group"], spec["scope"]) == (INVENTORY_GROUP, "Cluster")
    assert (spec["names"]["kind"], spec["names"]["plural"]) == (INVENTORY_KIND, INVENTORY_PLURAL)
    (version,) = spec["versions"]
    assert version["name"] == INVENTORY_VERSION and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    # the scheduler's (tests/deploy/test_crd.py): only its printed summary is declared
    assert status["type"] == "object" and status["x-kubernetes-preserve-unknown-fields"]


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _check(value: Any, schema: dict[str, Any], path: str) -> None:
    kind = schema.get("type")
    if kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), path
        if "minimum" in schema:
            assert value >= schema["minimum"], path
    elif kind is not None:
        assert isinstance(value, _TYPES[kind]), f"{path}: want {kind}, got {value!r}"
    if kind == "string":
        assert len(value) <= schema.get("maxLength", len(value)), path
        assert value in schema.get("enum", [value]), path
    if kind == "object":
        for key in schema.get("required", []):
            assert key in value, f"{path}.{key} is required"
        props = schema.get("properties", {})
        if not schema.get("x-kubernetes-preserve-unknown-fields") and props:
            assert set(value) <= set(props), f"{path}: fields the schema would prune"
        for key, sub in props.items():
            if key in value:
                _check(value[key], sub, f"{path}.{key}")
    if kind == "array":
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]")


@pytest.mark.parametrize("topology", ["h100-sxm-8x", "a100-pcie-8x", "t4-4x"])
def test_what_the_agent_writes_fits_the_schema(topology: str) -> None:
    inventory = load_topology(topology, "n")
    inventory = inventory.with_gpu_health(inventory.gpus[0].uuid, False, "XID 79")
    # with --isolation, the layer as the probe reports it, each field used
    layer = NodeIsolation("hami-core", False, "8f3a89c+tessera.1", "8f3a" * 10, "x" * 256)
    inventory = replace(inventory, isolation=layer)
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = cr_spec(inventory)
    _check({"spec": spec}, schema, "$")
    declared = schema["properties"]["spec"]["properties"]
    assert set(spec) == set(declared)  # every field we write is named in the schema
    assert set(spec["gpus"][0]) == set(declared["gpus"]["items"]["properties"])


def _rbac() -> list[dict[str, Any]]:
    return _docs(DEPLOY / "deviceplugin" / "rbac.yaml")


def _granted() -> set[tuple[str, str, str, str]]:
    """(namespace or "*", apiGroup, resource, verb) the agent's ServiceAccount may do."""
    docs = _rbac()
    roles = {
        (d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")
    }
    granted = set()
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": "tessera-device-plugin",
                "namespace": DEFAULT_HEARTBEAT_NAMESPACE,
            }
        ]
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        scope = binding["metadata"].get("namespace", "*")
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((scope, group, resource, verb))
    return granted


_VERBS = {
    ("GET", True): "get",
    ("POST", False): "create",
    ("PUT", True): "update",
    ("PATCH", True): "patch",
    ("DELETE", True): "delete",
    ("GET", False): "list",
}


def _needed(requests: list[tuple[str, str]]) -> set[tuple[str, str, str, str]]:
    needed = set()
    for method, path in requests:
        target = parse_path(path)
        resource = target.resource + (f"/{target.subresource}" if target.subresource else "")
        verb = _VERBS[(method, target.name is not None)]
        needed.add((target.namespace or "*", target.group, resource, verb))
    return needed


def test_rbac_grants_exactly_what_the_agent_calls() -> None:
    inventory = load_topology("t4-4x", "node-a")
    with FakeApiServer() as server:
        server.create("nodes", {"metadata": {"name": "node-a"}})
        publisher = InventoryPublisher(KubeClient.for_host(server.url), InventoryConfig("node-a"))
        publisher.heartbeat()
        publisher.publish(inventory)
        publisher.update_labels(inventory)
        publisher.heartbeat()
        publisher.publish(inventory.with_gpu_health(inventory.gpus[0].uuid, False, "x"))
        server.fail("/apis/coordination.k8s.io", method="PUT", status=409)
        publisher.heartbeat()  # a conflict path: GET again, then PUT
        chooser = RecordChooser(
            KubeClient.for_host(server.url),
            "node-a",
            KeyringSource.fixed(Keyring.generate().verifier()),
            lambda: inventory,
        )
        chooser.pods()  # GetPreferredAllocation's look at the pods bound to this node
        needed = _needed(server.requests)
    assert needed == _granted()
    assert not any("status" in resource for _, _, resource, _ in _granted())


def test_daemonset_wiring() -> None:
    (ds,) = _docs(DEPLOY / "deviceplugin" / "daemonset.yaml")
    pod = ds["spec"]["template"]["spec"]
    assert ds["metadata"]["namespace"] == DEFAULT_HEARTBEAT_NAMESPACE
    sa = next(d for d in _rbac() if d["kind"] == "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    (container,) = pod["containers"]
    assert container["command"] == ["tessera-device-plugin"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert (
        mounts["device-plugins"] == volumes["device-plugins"] == "/var/lib/kubelet/device-plugins"
    )
    assert mounts["pod-resources"] == volumes["pod-resources"] == "/var/lib/kubelet/pod-resources"
    keys = next(v for v in pod["volumes"] if v["name"] == "record-keys")
    assert keys["secret"] == {"secretName": "tessera-record-verify", "optional": True}
    assert mounts["record-keys"] == DEFAULT_INTEGRITY_KEY_FILE
    from deviceplugin.cli import build_parser

    known = {s for a in build_parser()._actions for s in a.option_strings}
    for arg in container["args"]:
        assert arg.split("=")[0] in known
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
