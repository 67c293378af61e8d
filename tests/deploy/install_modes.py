"""Shared by the offline install-mode tests and the e2e install test: render the kustomize
overlays and the Helm chart, and pick out the fields both must agree on."""

from __future__ import annotations

import asyncio
import importlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "tessera"
DOC = ROOT / "docs" / "operations.md"
"""Where the install walkthrough lives; tests/e2e/test_install.py runs its shell blocks."""
MODES = ("second-scheduler", "extender")
NAMESPACE = "tessera-system"
KUSTOMIZE_TIMEOUT = 120
"""Seconds for one `kubectl kustomize` (a second alone; generous for a loaded machine)."""


def kubectl_or_skip() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (kustomize is built into it)")
    return found


def kustomize(folder: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize <folder>` renders."""
    out = subprocess.run(
        [kubectl_or_skip(), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        check=True,
        timeout=KUSTOMIZE_TIMEOUT,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def overlay(mode: str) -> list[dict[str, Any]]:
    return kustomize(DEPLOY / "overlays" / mode)


def helm_or_skip() -> Any:
    try:  # untyped: imported by name
        return importlib.import_module("helm_sdkpy")
    except ImportError as exc:  # the Makefile installs it; a bare venv may not have it
        pytest.skip(f"helm-sdkpy is not installed ({exc})")


def chart_copy(dest: Path, values: dict[str, Any]) -> Path:
    """The chart with `values` merged over its values.yaml (Lint takes no values)."""
    shutil.copytree(CHART, dest)
    doc = yaml.safe_load((dest / "values.yaml").read_text())
    _merge(doc, values)
    (dest / "values.yaml").write_text(yaml.safe_dump(doc))
    return dest


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def lint(chart: Path) -> dict[str, Any]:
    helm = helm_or_skip()
    result: dict[str, Any] = asyncio.run(helm.Lint(helm.Configuration()).run(str(chart)))
    return result


def lint_errors(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Messages of severity error (helm's support.ErrorSev = 3) or worse."""
    return [m for m in result.get("Messages") or [] if m.get("Severity", 0) >= 3]


def by_kind(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objs}


def pod_templates(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]
        for o in objs
        if o["kind"] in ("Deployment", "DaemonSet")
    }


def _probe(probe: dict[str, Any] | None) -> Any:
    if not probe:
        return None
    get = probe.get("httpGet") or {}
    return (get.get("path"), get.get("port"), get.get("scheme"))


def essentials(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """What an install mode must agree on however it was rendered: per workload its
    containers' images, commands, args, ports, probes, mounts and the Secrets and
    ConfigMaps behind them; every RBAC rule and binding; Services' ports; and the
    KubeSchedulerConfiguration (extender included)."""
    out: dict[str, Any] = {}
    for name, template in pod_templates(objs).items():
        spec = template["spec"]
        volumes = {}
        for v in spec.get("volumes") or []:
            source = {k: val for k, val in v.items() if k != "name"}
            volumes[v["name"]] = source
        containers = {}
        for c in spec.get("initContainers") or []:
            containers[f"init/{c['name']}"] = _container_essentials(c, volumes)
        for c in spec["containers"]:
            containers[c["name"]] = _container_essentials(c, volumes)
        workload = next(
            o for o in objs if o["metadata"]["name"] == name and "template" in o.get("spec", {})
        )
        out[f"workload/{name}"] = {
            "replicas": workload["spec"].get("replicas"),
            "strategy": workload["spec"].get("strategy") or workload["spec"].get("updateStrategy"),
            "nodeSelector": spec.get("nodeSelector"),
            "tolerations": spec.get("tolerations"),
            "serviceAccount": spec.get("serviceAccountName"),
            "hostNetwork": spec.get("hostNetwork", False),
            "securityContext": spec.get("securityContext"),
            "containers": containers,
        }
    for o in objs:
        meta = o["metadata"]
        key = f"{o['kind']}/{meta.get('namespace', '')}/{meta['name']}"
        if o["kind"] in ("ClusterRole", "Role"):
            out[key] = o.get("rules")
        elif o["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            out[key] = (o["roleRef"], o["subjects"])
        elif o["kind"] == "Service":
            out[key] = (o["spec"].get("clusterIP"), o["spec"]["ports"])
        elif o["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
            # CEL ignores layout, and YAML parsers fold indented lines differently
            out[key] = _squeeze(o["spec"])
        elif o["kind"] == "ConfigMap":
            out[key] = {k: yaml.safe_load(v) for k, v in (o.get("data") or {}).items()}
        elif o["kind"] in ("ServiceAccount", "Namespace", "CustomResourceDefinition"):
            out[key] = True
    return out


def _container_essentials(c: dict[str, Any], volumes: dict[str, Any]) -> dict[str, Any]:
    return {
        "image": c["image"],
        "command": c.get("command"),
        "args": c.get("args"),
        "ports": sorted((p.get("name"), p["containerPort"]) for p in c.get("ports") or []),
        "readiness": _probe(c.get("readinessProbe")),
        "liveness": _probe(c.get("livenessProbe")),
        "mounts": sorted(
            (m["mountPath"], bool(m.get("readOnly")), yaml.safe_dump(volumes[m["name"]]))
            for m in c.get("volumeMounts") or []
        ),
        "securityContext": c.get("securityContext"),
    }


def _squeeze(value: Any) -> Any:
    """`value` with every run of whitespace in its strings made one space."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list):
        return [_squeeze(v) for v in value]
    if isinstance(value, dict):
        return {k: _squeeze(v) for k, v in value.items()}
    return value


def doc_blocks(section: str) -> list[str]:
    """The ```sh blocks of the docs/operations.md section titled `section`, dedented."""
    text = DOC.read_text()
    start = text.index(f"### {section}\n")
    end = text.find("\n### ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    blocks = []
    for m in re.finditer(r"^( *)```sh\n(.*?)^\1```$", body, re.M | re.S):
        indent = len(m.group(1))
        blocks.append("".join(line[indent:] + "\n" for line in m.group(2).splitlines()))
    return blocks
