"""tessera's admission policies, evaluated with a real CEL interpreter.

The API server evaluates the same expressions; here every validation is compiled and run
against the writes tessera makes (admitted) and those a compromised node agent or a
tenant could attempt (refused).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel
from celpy.celtypes import MapType, StringType
from celpy.evaluation import CELEvalError

from deviceplugin.inventory import GFD_LABELS, node_labels
from tessera.isolation import NodeIsolation
from tessera.model import NodeInventory
from tessera.resources import (
    ALLOCATION_ANNOTATION,
    DOMAIN,
    HEARTBEAT_LEASE_PREFIX,
    INVENTORY_GROUP,
    INVENTORY_PLURAL,
    ISOLATION_LABEL,
)

ROOT = Path(__file__).resolve().parents[2]
POLICY_FILE = ROOT / "deploy" / "deviceplugin" / "admission-policy.yaml"
NODE_CLAIM = "authentication.kubernetes.io/node-name"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


POLICY, BINDING = _docs(POLICY_FILE)
AGENT_SA = next(
    d
    for d in _docs(ROOT / "deploy" / "deviceplugin" / "rbac.yaml")
    if d["kind"] == "ServiceAccount"
)
AGENT_USER = (
    f"system:serviceaccount:{AGENT_SA['metadata']['namespace']}:{AGENT_SA['metadata']['name']}"
)
ENV = celpy.Environment()


def _program(expression: str) -> Any:
    return ENV.program(ENV.compile(expression))


def evaluate(
    policy: dict[str, Any],
    resource: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    user: str,
    extra: dict[str, list[str]],
) -> str | None:
    """As the API server does: None when `policy` admits the write, else the first message."""
    request = {
        "userInfo": {"username": user, "extra": extra},
        "resource": {"resource": resource},
        "operation": "UPDATE" if old is not None else "CREATE",
    }
    activation: dict[str, Any] = {
        "request": json_to_cel(request),
        "object": json_to_cel(obj),
        "oldObject": json_to_cel(old),
    }
    spec = policy["spec"]
    for condition in spec["matchConditions"]:
        if not _program(condition["expression"]).evaluate(activation):
            return None
    variables: dict[Any, Any] = {}
    for variable in spec.get("variables", []):
        activation["variables"] = MapType(variables)
        try:
            value = _program(variable["expression"]).evaluate(activation)
        except CELEvalError as exc:
            # the API server evaluates variables lazily: an error counts only where used
            value = exc
        variables[StringType(variable["name"])] = value
    activation["variables"] = MapType(variables)
    for rule in spec["validations"]:
        result = _program(rule["expression"]).evaluate(activation)
        if isinstance(result, Exception) or not result:
            return " ".join(rule["message"].split())
    return None


def admit(
    resource: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    user: str = AGENT_USER,
    node: str | None = "node-a",
) -> str | None:
    """The node agent's policy for one write of `user` from a pod on `node`."""
    extra = {NODE_CLAIM: [node]} if node is not None else {}
    return evaluate(POLICY, resource, obj, old, user, extra)


def _node(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": dict(spec)}


def test_policy_matches_the_objects_the_agent_writes() -> None:
    rules = {
        (group, resource)
        for rule in POLICY["spec"]["matchConstraints"]["resourceRules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        (INVENTORY_GROUP, INVENTORY_PLURAL),
        ("", "nodes"),
        ("coordination.k8s.io", "leases"),
    }
    assert BINDING["spec"]["policyName"] == POLICY["metadata"]["name"]
    assert BINDING["spec"]["validationActions"] == ["Deny"]
    assert POLICY["spec"]["failurePolicy"] == "Fail"
    assert (
        "admission-policy.yaml"
        in (ROOT / "deploy" / "deviceplugin" / "kustomization.yaml").read_text()
    )
    text = POLICY_FILE.read_text()
    assert f"'{DOMAIN}/'" in text and f"'{HEARTBEAT_LEASE_PREFIX}'" in text


def test_own_node_writes_are_admitted() -> None:
    assert admit("nodedevices", {"metadata": {"name": "node-a"}}) is None
    assert admit("leases", {"metadata": {"name": f"{HEARTBEAT_LEASE_PREFIX}node-a"}}) is None
    old = _node("node-a", {"kubernetes.io/hostname": "node-a"}, podCIDR="10.0.0.0/24")
    new = copy.deepcopy(old)
    new["metadata"]["labels"][f"{DOMAIN}/gpu-model"] = "H100"
    assert admit("nodes", new, old) is None
    removed = copy.deepcopy(new)
    del removed["metadata"]["labels"][f"{DOMAIN}/gpu-model"]
    assert admit("nodes", removed, new) is None
    # the isolation label, as the agent writes every label it owns: node_labels' keys
    layer = NodeInventory("node-a", isolation=NodeIsolation("mps", False, reason="x"))
    labelled = copy.deepcopy(removed)
    labelled["metadata"]["labels"] |= {k: v for k, v in node_labels(layer).items() if v}
    assert labelled["metadata"]["labels"][ISOLATION_LABEL] == "mps"
    assert admit("nodes", labelled, removed) is None


def test_other_nodes_objects_are_refused() -> None:
    assert "only the NodeDevices of its own node" in str(
        admit("nodedevices", {"metadata": {"name": "node-b"}})
    )
    assert "own heartbeat" in str(
        admit("leases", {"metadata": {"name": f"{HEARTBEAT_LEASE_PREFIX}node-b"}})
    )
    assert "own heartbeat" in str(admit("leases", {"metadata": {"name": "tessera-scheduler"}}))
    old = _node("node-b")
    new = _node("node-b", {f"{DOMAIN}/gpu-model": "H100"})
    assert "only its own Node" in str(admit("nodes", new, old))


@pytest.mark.parametrize(
    "change",
    ["add-foreign-label", "change-foreign-label", "drop-foreign-label", "uncordon", "taint"],
)
def test_own_node_beyond_tessera_labels_is_refused(change: str) -> None:
    old = _node("node-a", {"team": "ml", f"{DOMAIN}/gpu-count": "8"}, unschedulable=True)
    new = copy.deepcopy(old)
    labels, spec = new["metadata"]["labels"], new["spec"]
    if change == "add-foreign-label":
        labels["nvidia.com/mig.capable"] = "true"
    elif change == "change-foreign-label":
        labels["team"] = "other"
    elif change == "drop-foreign-label":
        del labels["team"]
    elif change == "uncordon":
        spec["unschedulable"] = False
    else:
        spec["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    assert "only the tessera.dev/ labels" in str(admit("nodes", new, old))


def test_exactly_the_gfd_labels_are_admitted_beside_tessera_ones() -> None:
    old = _node("node-a", {"team": "ml"})
    for key in GFD_LABELS:
        new = _node("node-a", {"team": "ml", key: "1"})
        assert admit("nodes", new, old) is None, key
        assert admit("nodes", old, new) is None, key  # and removed again
    (listed,) = [v for v in POLICY["spec"]["variables"] if v["name"] == "gfdLabels"]
    assert [str(k) for k in _program(listed["expression"]).evaluate({})] == list(GFD_LABELS)
    for key in (
        "nvidia.com/gpu",
        "nvidia.com/gpu.present2",
        "nvidia.com/gpu.memoryx",
        "nvidia.com/gpu.replicas",
        "nvidia.com/mig.strategy",
        "Nvidia.com/gpu.count",
    ):
        new = _node("node-a", {"team": "ml", key: "1"})
        assert "only the tessera.dev/ labels" in str(admit("nodes", new, old)), key
    # on another node even the GFD labels are refused
    assert "only its own Node" in str(
        admit("nodes", _node("node-b", {GFD_LABELS[0]: "true"}), _node("node-b"))
    )


def test_a_token_without_a_node_claim_is_refused() -> None:
    assert "names no node" in str(admit("nodedevices", {"metadata": {"name": "node-a"}}, node=None))


def test_other_users_are_not_matched() -> None:
    assert admit("nodedevices", {"metadata": {"name": "node-b"}}, user="system:admin") is None


# --- the allocation record: written by tessera-scheduler only --------------------------------

RECORD_POLICY, RECORD_BINDING = _docs(ROOT / "deploy" / "scheduler" / "admission-policy.yaml")
SCHEDULER_SA = next(
    d
    for d in _docs(ROOT / "deploy" / "scheduler" / "serviceaccount.yaml")
    if d["kind"] == "ServiceAccount"
)
SCHEDULER_USER = (
    f"system:serviceaccount:{SCHEDULER_SA['metadata']['namespace']}:"
    f"{SCHEDULER_SA['metadata']['name']}"
)
TENANT = "alice@example.com"


def _pod(record: str | None = None, **annotations: str) -> dict[str, Any]:
    if record is not None:
        annotations[ALLOCATION_ANNOTATION] = record
    return {"metadata": {"name": "p", "annotations": annotations}, "spec": {}}


def write_record(
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    user: str = TENANT,
    resource: str = "pods",
) -> str | None:
    return evaluate(RECORD_POLICY, resource, obj, old, user, {})


def test_record_policy_names_the_shared_constants() -> None:
    assert (
        f"'{ALLOCATION_ANNOTATION}'"
        in (ROOT / "deploy" / "scheduler" / "admission-policy.yaml").read_text()
    )
    assert SCHEDULER_USER in RECORD_POLICY["spec"]["matchConditions"][0]["expression"]
    assert RECORD_BINDING["spec"]["policyName"] == RECORD_POLICY["metadata"]["name"]
    assert RECORD_BINDING["spec"]["validationActions"] == ["Deny"]
    assert (
        "admission-policy.yaml"
        in (ROOT / "deploy" / "scheduler" / "kustomization.yaml").read_text()
    )


def test_tenants_cannot_write_the_record() -> None:
    refused = "only tessera-scheduler may set, change or remove"
    assert refused in str(write_record(_pod("[" * 1000)))
    assert refused in str(write_record(_pod("forged"), _pod()))
    assert refused in str(write_record(_pod("changed"), _pod("signed")))
    assert refused in str(write_record(_pod(), _pod("signed")))
    binding = {"metadata": {"name": "p", "annotations": {ALLOCATION_ANNOTATION: "x"}}}
    assert refused in str(write_record(binding, resource="pods/binding"))


def test_tenants_keep_every_other_write() -> None:
    assert write_record(_pod(team="ml")) is None
    assert write_record(_pod("signed", team="new"), _pod("signed", team="old")) is None
    assert write_record({"metadata": {"name": "p"}, "spec": {}}) is None
    assert write_record({"metadata": {"name": "p"}}, resource="pods/binding") is None


def test_the_scheduler_writes_and_removes_records() -> None:
    assert write_record(_pod("signed"), _pod(), user=SCHEDULER_USER) is None
    assert write_record(_pod(), _pod("signed"), user=SCHEDULER_USER) is None
