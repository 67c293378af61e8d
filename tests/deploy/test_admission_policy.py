"""The node agent's admission policy, evaluated with a real CEL interpreter.

The API server evaluates the same expressions; here every validation is compiled and run
against the writes a node agent makes (allowed) and the writes a compromised agent could
attempt on other nodes (refused).
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

from tessera.resources import DOMAIN, HEARTBEAT_LEASE_PREFIX, INVENTORY_GROUP, INVENTORY_PLURAL

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


def admit(
    resource: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    user: str = AGENT_USER,
    node: str | None = "node-a",
) -> str | None:
    """None when the policy admits the write, else the message of the first failed rule."""
    extra = {NODE_CLAIM: [node]} if node is not None else {}
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
    spec = POLICY["spec"]
    for condition in spec["matchConditions"]:
        if not _program(condition["expression"]).evaluate(activation):
            return None
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
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
    assert "admission-policy.yaml" in (ROOT / "deploy" / "kustomization.yaml").read_text()
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
        labels["nvidia.com/gpu.present"] = "true"
    elif change == "change-foreign-label":
        labels["team"] = "other"
    elif change == "drop-foreign-label":
        del labels["team"]
    elif change == "uncordon":
        spec["unschedulable"] = False
    else:
        spec["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    assert "only the tessera.dev/ labels" in str(admit("nodes", new, old))


def test_a_token_without_a_node_claim_is_refused() -> None:
    assert "names no node" in str(admit("nodedevices", {"metadata": {"name": "node-a"}}, node=None))


def test_other_users_are_not_matched() -> None:
    assert admit("nodedevices", {"metadata": {"name": "node-b"}}, user="system:admin") is None
