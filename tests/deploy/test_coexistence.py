"""docs/coexistence.md: the node affinity it gives NVIDIA's device plugin keeps that plugin
off every node tessera's DaemonSets run on, and on every other node; the patch command it
shows applies that affinity (run offline, `kubectl patch --local`)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.install_modes import (
    CHART,
    KUSTOMIZE_TIMEOUT,
    ROOT,
    kubectl_or_skip,
    overlay,
    pod_templates,
)

DOC = ROOT / "docs" / "coexistence.md"
NVIDIA_DAEMONSET = """\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nvidia-device-plugin-daemonset, namespace: kube-system}
spec:
  selector: {matchLabels: {name: nvidia-device-plugin-ds}}
  template:
    metadata: {labels: {name: nvidia-device-plugin-ds}}
    spec:
      containers: [{name: nvidia-device-plugin-ctr, image: nvcr.io/nvidia/k8s-device-plugin}]
"""
"""NVIDIA's static manifest, cut to what the patch touches."""


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", DOC.read_text(), re.M | re.S)


def _matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    """One nodeSelectorTerm's matchExpressions, as the API server evaluates them."""
    for e in term.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _runs_on(affinity: dict[str, Any], labels: dict[str, str]) -> bool:
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return any(_matches(t, labels) for t in required["nodeSelectorTerms"])


def _tessera_selectors() -> list[dict[str, str]]:
    selectors = [
        t["spec"]["nodeSelector"]
        for name, t in pod_templates(overlay("second-scheduler")).items()
        if name in ("tessera-device-plugin", "tessera-nri-hook")
    ]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    selectors += [values["nodeAgent"]["nodeSelector"], values["nriHook"]["nodeSelector"]]
    return selectors


def test_the_documented_affinity_splits_the_nodes_with_tessera() -> None:
    (doc_yaml,) = [b for b in _blocks("yaml") if "nodeAffinity" in b]
    affinity = yaml.safe_load(doc_yaml)["affinity"]
    selectors = _tessera_selectors()
    assert len(selectors) == 4
    for selector in selectors:
        assert not _runs_on(affinity, selector)  # never beside tessera
        assert not _runs_on(affinity, {**selector, "gpu": "yes"})
    assert _runs_on(affinity, {})
    assert _runs_on(affinity, {"tessera.dev/node-agent": "false"})


def test_the_documented_patch_gives_nvidias_daemonset_that_affinity(tmp_path: Path) -> None:
    kubectl = kubectl_or_skip()
    (block,) = [b for b in _blocks("sh") if "patch daemonset" in b]
    words = shlex.split(block)
    assert words[:2] == ["kubectl", "-n"] and words[3:6] == [
        "patch",
        "daemonset",
        "nvidia-device-plugin-daemonset",
    ]
    manifest = tmp_path / "nvidia-device-plugin.yaml"
    manifest.write_text(NVIDIA_DAEMONSET)
    # the same patch, applied to the manifest instead of the cluster's object
    local = [kubectl, "patch", "--local", "-f", str(manifest), *words[6:], "-o", "yaml"]
    done = subprocess.run(
        local, capture_output=True, text=True, timeout=KUSTOMIZE_TIMEOUT, check=False
    )
    assert done.returncode == 0, done.stderr
    patched = yaml.safe_load(done.stdout)["spec"]["template"]["spec"]
    (doc_yaml,) = [b for b in _blocks("yaml") if "nodeAffinity" in b]
    assert patched["affinity"] == yaml.safe_load(doc_yaml)["affinity"]
    assert patched["containers"][0]["name"] == "nvidia-device-plugin-ctr"  # merged, not replaced
