"""The two install modes as shipped: the kustomize overlays render, their objects refer to
each other consistently (service accounts, Secrets, ConfigMaps, ports, the extender URL),
and the Helm chart lints in both modes with the same images and extender settings.

What the chart renders is compared field by field with the overlays in
tests/e2e/test_install.py (rendering needs an API server with helm-sdkpy)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from scheduler_plugin.cli import build_parser, check_config
from scheduler_plugin.config import SchedulerConfig
from tessera import resources as rn
from tessera_cli import config_from
from tests.deploy.install_modes import (
    CHART,
    DEPLOY,
    MODES,
    NAMESPACE,
    by_kind,
    chart_copy,
    doc_blocks,
    essentials,
    kustomize,
    lint,
    lint_errors,
    overlay,
    pod_templates,
)
from tests.deploy.test_admission_policy import evaluate

BUILT_IN_ROLES = {
    ("ClusterRole", "system:kube-scheduler"),
    ("ClusterRole", "system:volume-scheduler"),
    ("Role", "extension-apiserver-authentication-reader"),
}
"""Roles every cluster has (the API server makes them): bound, never shipped."""
OPERATOR_SECRETS = {"tessera-record-signing", "tessera-record-verify", "tessera-scheduler-tls"}
"""The Secrets the operator creates before installing (docs/operations.md)."""


@pytest.fixture(scope="module", params=MODES)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, overlay(request.param)


def _container(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (c,) = [
        c
        for c in pod_templates(objs)["tessera-scheduler"]["spec"]["containers"]
        if c["name"] == name
    ]
    container: dict[str, Any] = c
    return container


def _scheduler_args(objs: list[dict[str, Any]]) -> Any:
    return build_parser().parse_args(_container(objs, "tessera-scheduler")["args"])


def test_every_reference_resolves(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    mode, objs = rendered
    index = by_kind(objs)
    names = {(kind, ns, name) for kind, ns, name in index}
    assert ("Namespace", "", NAMESPACE) in names
    for workload, template in pod_templates(objs).items():
        spec = template["spec"]
        account = spec.get("serviceAccountName")
        if account:
            assert ("ServiceAccount", NAMESPACE, account) in names, workload
        for volume in spec.get("volumes") or []:
            if "secret" in volume:
                assert volume["secret"]["secretName"] in OPERATOR_SECRETS, (workload, volume)
            if "configMap" in volume:
                assert ("ConfigMap", NAMESPACE, volume["configMap"]["name"]) in names, volume
        declared = {v["name"] for v in spec.get("volumes") or []}
        for c in spec["containers"]:
            assert {m["name"] for m in c.get("volumeMounts") or []} <= declared, c["name"]
            ports = {p.get("name") for p in c.get("ports") or []}
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in c:
                    assert c[probe]["httpGet"]["port"] in ports, (c["name"], probe)
    for (kind, ns, name), obj in index.items():
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = obj["roleRef"]
        role_ns = ns if ref["kind"] == "Role" else ""
        shipped = (ref["kind"], role_ns, ref["name"]) in names
        assert shipped or (ref["kind"], ref["name"]) in BUILT_IN_ROLES, (kind, name, ref)
        for subject in obj["subjects"]:
            assert ("ServiceAccount", subject["namespace"], subject["name"]) in names, name
    # the Secrets the workloads mount are the ones the mode needs, and no others
    mounted = {
        v["secret"]["secretName"]
        for t in pod_templates(objs).values()
        for v in t["spec"].get("volumes") or []
        if "secret" in v
    }
    want = OPERATOR_SECRETS - ({"tessera-scheduler-tls"} if mode == "second-scheduler" else set())
    assert mounted == want


def _kube_scheduler_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = by_kind(objs)[("ConfigMap", NAMESPACE, "tessera-kube-scheduler-config")]
    (text,) = cm["data"].values()
    config: dict[str, Any] = yaml.safe_load(text)
    return config


def test_second_scheduler_calls_its_sidecar_on_loopback() -> None:
    objs = overlay("second-scheduler")
    index = by_kind(objs)
    assert ("Service", NAMESPACE, "tessera-scheduler") not in index
    deployment = index[("Deployment", NAMESPACE, "tessera-scheduler")]
    assert deployment["spec"]["replicas"] == 1
    # never two pods at once (their containers could split the two Leases)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    config = _kube_scheduler_config(objs)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert [p["schedulerName"] for p in config["profiles"]] == ["tessera"]
    assert config["clientConnection"]["kubeconfig"] == ""  # the pod's service account
    (ext,) = config["extenders"]
    url = urlsplit(ext["urlPrefix"])
    args = _scheduler_args(objs)
    assert (url.scheme, url.hostname, url.port) == ("http", "127.0.0.1", args.listen[1])
    assert args.listen[0] == "127.0.0.1" and ext["enableHTTPS"] is False
    # loopback without a client CA is a combination the binary accepts
    assert check_config(config_from(SchedulerConfig, args)) is None
    # kube-scheduler's own Lease, and the Role that lets it hold that one
    election = config["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceName"] != "kube-scheduler"
    assert election["resourceName"] != args.leader_elect_lease_name
    assert election["resourceNamespace"] == NAMESPACE
    role = index[("Role", NAMESPACE, "tessera-kube-scheduler")]
    held = {n for r in role["rules"] for n in r.get("resourceNames", ())}
    assert held == {election["resourceName"]}
    ks = _container(objs, "kube-scheduler")
    assert ks["image"].startswith("registry.k8s.io/kube-scheduler:v")
    (config_flag,) = [a for a in ks["command"] if a.startswith("--config=")]
    folder, file = config_flag.split("=", 1)[1].rsplit("/", 1)
    (mount,) = [m for m in ks["volumeMounts"] if m["mountPath"] == folder]
    volumes = {v["name"]: v for v in pod_templates(objs)["tessera-scheduler"]["spec"]["volumes"]}
    cm = volumes[mount["name"]]["configMap"]["name"]
    assert file in index[("ConfigMap", NAMESPACE, cm)]["data"]
    # its probes reach the health port it serves
    (secure,) = [a for a in ks["command"] if a.startswith("--secure-port=")]
    named = {p["name"]: p["containerPort"] for p in ks["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get = ks[probe]["httpGet"]
        assert (named[get["port"]], get["scheme"]) == (int(secure.split("=")[1]), "HTTPS")


def test_extender_url_is_the_service_address_a_host_network_scheduler_reaches() -> None:
    objs = overlay("extender")
    service = by_kind(objs)[("Service", NAMESPACE, "tessera-scheduler")]
    (port,) = service["spec"]["ports"]
    config = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    (ext,) = config["extenders"]
    url = urlsplit(ext["urlPrefix"])
    # a fixed ClusterIP: no DNS needed from the host network
    assert (url.scheme, url.hostname, url.port) == (
        "https",
        service["spec"]["clusterIP"],
        port["port"],
    )
    container = _container(objs, "tessera-scheduler")
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == _scheduler_args(objs).listen[1]
    assert _scheduler_args(objs).tls_client_ca_file  # mutual TLS across the network


def test_both_kube_scheduler_configurations_agree_on_the_extender() -> None:
    """Verbs, weight, timeouts and managed resources are one policy, whichever
    kube-scheduler calls tessera; only how it is reached differs."""
    second = _kube_scheduler_config(overlay("second-scheduler"))
    extender = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    reach = ("urlPrefix", "enableHTTPS", "tlsConfig")
    (a,), (b,) = second["extenders"], extender["extenders"]
    assert {k: v for k, v in a.items() if k not in reach} == {
        k: v for k, v in b.items() if k not in reach
    }
    managed = {m["name"] for m in a["managedResources"]}
    assert managed == set(rn.TESSERA_RESOURCES)


def test_the_modes_differ_only_in_the_scheduler() -> None:
    """What the e2e suite compares with the chart: the node side is the same in both."""
    second, extender = (essentials(overlay(m)) for m in MODES)
    differ = {k for k in set(second) | set(extender) if second.get(k) != extender.get(k)}
    assert differ == {
        "workload/tessera-scheduler",
        f"Service/{NAMESPACE}/tessera-scheduler",
        f"ConfigMap/{NAMESPACE}/tessera-kube-scheduler-config",
        "ClusterRoleBinding//tessera-kube-scheduler",
        "ClusterRoleBinding//tessera-volume-scheduler",
        f"Role/{NAMESPACE}/tessera-kube-scheduler",
        f"RoleBinding/{NAMESPACE}/tessera-kube-scheduler",
        "RoleBinding/kube-system/tessera-kube-scheduler-authentication-reader",
        "ValidatingAdmissionPolicy//tessera-pods-use-tessera-scheduler",
        "ValidatingAdmissionPolicyBinding//tessera-pods-use-tessera-scheduler",
    }


def _tessera_pod(
    scheduler: str | None, *, init: bool = False, key: str = "limits"
) -> dict[str, Any]:
    container = {"name": "c", "resources": {key: {rn.GPU_CORE: "20"}}}
    spec: dict[str, Any] = {"containers": [{"name": "plain"}]}
    spec.setdefault("initContainers" if init else "containers", []).append(container)
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": "p"}, "spec": spec}


def test_second_scheduler_refuses_tessera_pods_for_another_scheduler() -> None:
    """A pod asking for tessera resources must name the profile tessera's kube-scheduler
    serves; every other pod is left alone."""
    objs = overlay("second-scheduler")
    policy = by_kind(objs)[("ValidatingAdmissionPolicy", "", "tessera-pods-use-tessera-scheduler")]
    binding = by_kind(objs)[
        ("ValidatingAdmissionPolicyBinding", "", "tessera-pods-use-tessera-scheduler")
    ]
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    (profile,) = _kube_scheduler_config(objs)["profiles"]
    name = profile["schedulerName"]

    def admit(pod: dict[str, Any]) -> str | None:
        return evaluate(policy, "pods", pod, None, "someone", {})

    for key in ("limits", "requests"):
        for init in (False, True):
            assert admit(_tessera_pod(name, init=init, key=key)) is None
            for other in (None, "default-scheduler", name + "-not"):
                refused = admit(_tessera_pod(other, init=init, key=key))
                assert refused and "schedulerName" in refused, (key, init, other)
    plain = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    assert admit(plain) is None
    nvidia = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    assert admit({"metadata": {"name": "p"}, "spec": nvidia}) is None
    assert ("ValidatingAdmissionPolicy", "", policy["metadata"]["name"]) not in by_kind(
        overlay("extender")
    )


def test_kubectl_apply_k_deploy_is_the_default_mode() -> None:
    assert kustomize(DEPLOY) == overlay("second-scheduler")


def test_chart_crd_and_defaults_match_the_overlays() -> None:
    assert (CHART / "crds" / "nodedevices.yaml").read_text() == (
        DEPLOY / "crds" / "nodedevices.yaml"
    ).read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert values["mode"] == "second-scheduler"
    objs = overlay("second-scheduler")
    images = {c["image"] for t in pod_templates(objs).values() for c in t["spec"]["containers"]}
    ks = values["kubeScheduler"]["image"]
    assert images == {
        f"{values['image']['repository']}:{chart['appVersion']}",
        f"{ks['repository']}:{ks['tag']}",
    }
    assert (
        _kube_scheduler_config(objs)["leaderElection"]["resourceName"]
        == (values["kubeScheduler"]["leaseName"])
    )
    assert values["namespace"]["name"] == NAMESPACE
    namespace = by_kind(objs)[("Namespace", "", NAMESPACE)]
    assert namespace["metadata"]["labels"] == values["namespace"]["labels"]
    for key, secret in (
        ("signingSecret", "tessera-record-signing"),
        ("verifySecret", "tessera-record-verify"),
        ("tlsSecret", "tessera-scheduler-tls"),
    ):
        assert values["keys"][key] == secret


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extra", [{}, {"metrics": {"serviceMonitor": {"enabled": True}}}])
def test_chart_lints(tmp_path: Path, mode: str, extra: dict[str, Any]) -> None:
    values = copy.deepcopy(extra)
    values.update(mode=mode, namespace={"create": True}, scheduler={"pdb": {"enabled": True}})
    result = lint(chart_copy(tmp_path / "tessera", values))
    assert result["TotalChartsLinted"] == 1
    assert not lint_errors(result), result


def test_chart_lint_refuses_an_unknown_mode(tmp_path: Path) -> None:
    """Lint renders the templates: a mode the chart does not know fails it."""
    result = lint(chart_copy(tmp_path / "tessera", {"mode": "sidecar-ish"}))
    assert lint_errors(result), result


SECOND, EXTENDER = "Second-scheduler mode, step by step", "Extender mode, step by step"


def test_walkthrough_creates_the_secrets_each_mode_mounts() -> None:
    """The Secrets the docs' commands create (with their keys) are the ones the shipped
    workloads mount, and the files the flags name are among those keys."""
    made: dict[str, set[str]] = {}
    for section in (SECOND, EXTENDER):
        for block in doc_blocks(section):
            for m in re.finditer(r"create secret generic (\S+)((?: --from-file=\S+)+)", block):
                files = re.findall(r"--from-file=(\S+)", m.group(2))
                made[m.group(1)] = {f.rstrip("/").rsplit("/", 1)[-1] for f in files}
    second_blocks = "".join(doc_blocks(SECOND))
    assert "kubectl apply --server-side -k deploy/overlays/second-scheduler" in second_blocks
    assert "schedulerName: tessera" in second_blocks
    assert "kubectl apply --server-side -k deploy/overlays/extender" in "".join(
        doc_blocks(EXTENDER)
    )
    for mode in MODES:
        objs = overlay(mode)
        for template in pod_templates(objs).values():
            for v in template["spec"].get("volumes") or []:
                if "secret" in v:
                    assert v["secret"]["secretName"] in made, (mode, v)
    tls = made["tessera-scheduler-tls"]
    args = _scheduler_args(overlay("extender"))
    for flag in (args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file):
        assert flag.rsplit("/", 1)[1] in tls, flag
    # record keys: whole folders (tessera-keys writes the key files and signing-key-id)
    assert made["tessera-record-signing"] == {"private"}
    assert made["tessera-record-verify"] == {"public"}


def _hook_args(objs: list[dict[str, Any]]) -> Any:
    from nri_hook.cli import build_parser as hook_parser

    (c,) = pod_templates(objs)["tessera-nri-hook"]["spec"]["containers"]
    return hook_parser().parse_args(c["args"]), c


def test_shipped_hook_limits_gpu_shares_and_can_see_the_layer_it_mounts() -> None:
    """Both installs configure an isolation layer by default (the hook refuses to start
    without one), and the hook sees the layer's files where it checks them: under its
    device root, at the host path it mounts into containers."""
    from nri_hook.cli import check_isolation
    from nri_hook.config import NriHookConfig
    from tessera_cli import config_from
    from tessera_edge.host_paths import DEFAULT_HAMI_CORE_LIBRARY

    values = yaml.safe_load((CHART / "values.yaml").read_text())["nriHook"]
    assert values["isolation"] == "hami-core" and values["allowUnisolatedSharing"] is False
    assert values["hamiCoreLibrary"] == DEFAULT_HAMI_CORE_LIBRARY  # where node-check looks
    for mode in MODES:
        args, container = _hook_args(overlay(mode))
        assert check_isolation(config_from(NriHookConfig, args)) == values["isolation"]
        assert args.hami_core_library == values["hamiCoreLibrary"]
        library_dir = args.hami_core_library.rsplit("/", 1)[0]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "isolation"]
        assert mount["mountPath"] == f"{args.device_root}{library_dir}"
        volumes = pod_templates(overlay(mode))["tessera-nri-hook"]["spec"]["volumes"]
        (volume,) = [v for v in volumes if v["name"] == "isolation"]
        assert volume["hostPath"]["path"] == library_dir


@pytest.mark.parametrize(
    "hook",
    [
        {"isolation": "mps"},
        {"isolation": "hami-core", "hamiCoreLibrary": "/opt/hami/libvgpu.so"},
        {"isolation": "none", "allowUnisolatedSharing": True},
    ],
)
def test_chart_lints_with_each_isolation_layer(tmp_path: Path, hook: dict[str, Any]) -> None:
    result = lint(chart_copy(tmp_path / "tessera", {"nriHook": hook}))
    assert not lint_errors(result), result


@pytest.mark.parametrize(
    "hook",
    [
        {"isolation": "none"},
        {"isolation": "none", "allowUnisolatedSharing": False},
        {"isolation": "vgpu"},
        {"isolation": "hami-core", "hamiCoreLibrary": "libvgpu.so"},
    ],
)
def test_chart_refuses_unlimited_gpu_shares_unless_accepted(
    tmp_path: Path, hook: dict[str, Any]
) -> None:
    """`isolation: none` alone fails the values' schema (helm-sdkpy reports no message
    text: the failing file is what can be checked); with the acceptance it lints above."""
    result = lint(chart_copy(tmp_path / "tessera", {"nriHook": hook}))
    assert any(m["Path"] == "values.yaml" for m in lint_errors(result)), result


def test_one_nri_plugin_name_for_the_hook_and_the_scheduler() -> None:
    """The hook registers under the name the scheduler requires on every pod it binds: in
    each overlay the two flags agree, and the chart sets both from `nriPlugin.name`."""
    for mode in MODES:
        objs = overlay(mode)
        hook, _ = _hook_args(objs)
        scheduler = _scheduler_args(objs)
        assert hook.plugin_name == scheduler.nri_plugin_name == rn.DEFAULT_NRI_PLUGIN_NAME
        assert scheduler.require_nri_plugin, mode
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["nriPlugin"] == {"name": rn.DEFAULT_NRI_PLUGIN_NAME}
    templates = CHART / "templates"
    flag = "={{ .Values.nriPlugin.name }}\n"
    assert (templates / "nri-hook.yaml").read_text().count(f"- --plugin-name{flag}") == 1
    assert (templates / "scheduler.yaml").read_text().count(f"- --nri-plugin-name{flag}") == 1
    for template in templates.glob("*.yaml"):
        assert "plugin-name=tessera" not in template.read_text(), template.name


@pytest.mark.parametrize(
    ("name", "valid"),
    [("gpu-guard", True), ("a_b.c+1", True)] + [(bad, False) for bad in ("bad name", "", "x/y")],
)
def test_chart_takes_only_an_nri_plugin_name_containerd_accepts(
    tmp_path: Path, name: str, valid: bool
) -> None:
    result = lint(chart_copy(tmp_path / "tessera", {"nriPlugin": {"name": name}}))
    failing = [m for m in lint_errors(result) if m["Path"] == "values.yaml"]
    assert bool(failing) != valid, result
