"""The shipped viewer ClusterRole grants exactly what `kubectl tessera` calls."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubectl_tessera.cli import main
from tessera_testbed.apiserver import FakeApiServer, parse_path
from tests.kubectl.conftest import add_node
from tests.scheduler.helpers import gang_member, pod, share

ROLE = Path(__file__).resolve().parents[2] / "deploy" / "kubectl-tessera" / "viewer-rbac.yaml"


def _granted() -> set[tuple[str, str, str]]:
    role = yaml.safe_load(ROLE.read_text())
    assert role["kind"] == "ClusterRole"
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_viewer_role_grants_exactly_what_the_commands_call(
    fake: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_node(fake, "t4", "t4-4x")
    fake.create("pods", pod("p", share(10, 10)))
    fake.create("pods", gang_member("m", "g", 1, namespace="default"))
    for argv in (
        ["nodes"],
        ["pods"],
        ["pods", "-A"],
        ["explain", "p"],
        ["gangs"],
        ["explain", "m"],
    ):
        assert main([*argv, "--kubeconfig", kubeconfig]) == 0
    capsys.readouterr()
    needed = set()
    for method, path in fake.requests:
        assert method == "GET"  # it only reads
        target = parse_path(path)
        verb = "get" if target.name is not None else "list"
        needed.add((target.group, target.resource, verb))
    assert needed == _granted()
