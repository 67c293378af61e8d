"""deploy/scheduler/ agrees with the code: flags exist, every tessera resource is managed,
and RBAC allows exactly the API calls the scheduler makes (nothing unused)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler_plugin.cli import build_parser, check_config
from scheduler_plugin.config import SchedulerConfig
from scheduler_plugin.serving.answers import VERBS
from tessera import resources as rn
from tessera_cli import config_from
from tessera_testbed.apiserver import FakeApiServer, parse_path
from tests.scheduler.helpers import ROOT, pod, populate, serving, share, wait_for

DEPLOY = ROOT / "deploy" / "scheduler"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def test_kube_scheduler_configuration_names_every_tessera_resource_and_verb() -> None:
    (config,) = docs("kube-scheduler-config.yaml")
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    (ext,) = config["extenders"]
    assert {ext[f"{v}Verb"] for v in VERBS} == set(VERBS)
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False
    assert ext["weight"] > 0 and re.fullmatch(r"\d+s", ext["httpTimeout"])
    managed = {m["name"]: m["ignoredByScheduler"] for m in ext["managedResources"]}
    assert set(managed) == set(rn.TESSERA_RESOURCES)
    assert ext["enableHTTPS"] is True and ext["urlPrefix"].startswith("https://")


def test_deployment_args_parse_and_mount_the_integrity_key() -> None:
    (deployment,) = docs("deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.integrity_key_file == rn.DEFAULT_INTEGRITY_KEY_FILE
    assert args.leader_elect and args.tls_client_ca_file
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    secret = volumes[mounts[rn.DEFAULT_INTEGRITY_KEY_FILE]]["secret"]["secretName"]
    assert secret == "tessera-record-signing"  # the private keys: only the scheduler
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def _tls_secrets() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs("tls-secrets.example.yaml")}


def test_extender_is_mutual_tls_and_probes_use_the_plain_health_port() -> None:
    (deployment,) = docs("deployment.yaml")
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    args = build_parser().parse_args(container["args"])
    assert not args.insecure_allow_unauthenticated
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["https"] == args.listen[1] and ports["health"] == args.health_listen[1]
    assert ports["https"] != ports["health"]
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == (path, "health", "HTTP")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["health"])
    assert annotations["prometheus.io/scheme"] == "http"
    # the TLS flags name files of the mounted serving Secret
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    secrets = _tls_secrets()
    for flag in (args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file):
        folder, key = flag.rsplit("/", 1)
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
        secret_name = volumes[mount["name"]]["secret"]["secretName"]
        assert key in secrets[secret_name]["stringData"], flag
        assert secrets[secret_name]["metadata"]["namespace"] == rn.DEFAULT_HEARTBEAT_NAMESPACE
    # the Service exposes the extender port kube-scheduler calls, and nothing else
    (service,) = docs("service.yaml")
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "https"
    (config,) = docs("kube-scheduler-config.yaml")
    (ext,) = config["extenders"]
    # the Service's fixed ClusterIP (tests/deploy/test_install_modes.py checks the address)
    assert ext["urlPrefix"].endswith(f":{port['port']}")


def test_deployment_flags_pass_the_binary_checks_with_real_tls_files(pki: Path) -> None:
    """The shipped flags are a combination the binary accepts (authenticated, non-loopback),
    with the Secret's files replaced by real ones."""
    (deployment,) = docs("deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    config = config_from(SchedulerConfig, build_parser().parse_args(container["args"]))
    config = dataclasses.replace(
        config,
        tls_cert_file=str(pki / "server.crt"),
        tls_key_file=str(pki / "server.key"),
        tls_client_ca_file=str(pki / "ca.crt"),
    )
    assert check_config(config) is not None


def test_kube_scheduler_tls_config_names_the_client_secret_files() -> None:
    (config,) = docs("kube-scheduler-config.yaml")
    (ext,) = config["extenders"]
    tls = ext["tlsConfig"]
    assert set(tls) == {"certFile", "keyFile", "caFile"}  # never insecure
    client = _tls_secrets()["tessera-kube-scheduler-client"]["stringData"]
    assert {tls[k].rsplit("/", 1)[1] for k in tls} == set(client)
    assert len({tls[k].rsplit("/", 1)[0] for k in tls}) == 1


def _rules() -> list[tuple[str, str, str, frozenset[str], frozenset[str]]]:
    """(scope namespace or '*', group, resource, verbs, resourceNames)."""
    result = []
    for doc in docs("rbac.yaml"):
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        if doc["metadata"]["name"] != "tessera-scheduler":
            continue  # roles for people (tessera-debug-reader), not the scheduler's
        scope = doc["metadata"].get("namespace", "*") if doc["kind"] == "Role" else "*"
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    result.append(
                        (
                            scope,
                            group,
                            resource,
                            frozenset(rule["verbs"]),
                            frozenset(rule.get("resourceNames", ())),
                        )
                    )
    return result


def _verb(method: str, name: str | None, watch: bool) -> str:
    if method == "GET":
        return "watch" if watch else ("get" if name else "list")
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]


def test_debug_reader_role_grants_the_debug_paths() -> None:
    (reader,) = [d for d in docs("rbac.yaml") if d["metadata"]["name"] == "tessera-debug-reader"]
    (rule,) = reader["rules"]
    assert set(rule["nonResourceURLs"]) == {"/debug", "/debug/*"} and rule["verbs"] == ["get"]


def test_rbac_allows_every_call_the_scheduler_makes_and_nothing_it_does_not() -> None:
    with FakeApiServer() as fake:
        populate(fake, ["n"], gpus=1)
        fake.create("pods", pod("x", share(10, 10)))  # so the status writer has work
        seen: list[tuple[str, str]] = []
        original = fake.requests
        with serving(
            fake,
            leader_elect=True,
            leader_namespace=rn.DEFAULT_HEARTBEAT_NAMESPACE,
            retry_period=0.05,
        ) as served:
            service = served.service
            assert served.schedule(pod("a", share(50, 50)), ["n"]) == "n"
            fake.tokens["t"] = {"username": "ops"}
            fake.grants.add(("ops", "get", "/debug/*"))
            service.authorizer.check("t", "/debug/pods")  # a /debug caller's bearer token
            created = fake.create("pods", pod("b", share(10, 10)))
            served.bind(created, "n")  # bind without filter: reads the pod
            # a running pod whose record its author altered fences the node: an Event
            fake.patch("pods", "a", {"metadata": {"annotations": {rn.ALLOCATION_ANNOTATION: "{"}}})
            wait_for(lambda: fake.items("events"))
            service.status_writer.flush()
            service.reconciler.assume_ttl = 0
            service.reconciler.expire_assumed(service.client, now=float("inf"))
        seen = list(original)
    rules = _rules()
    used: set[int] = set()
    test_writes = {("POST", "/api/v1/namespaces/default/pods")}  # the test creates pods
    for method, path in seen:
        if (method, path) in test_writes:
            continue
        p = parse_path(path)
        group = p.group
        resource = p.resource + (f"/{p.subresource}" if p.subresource else "")
        watch = False  # list and watch share a path; both verbs are granted together below
        verb = _verb(method, p.name, watch)
        ns = p.namespace
        allowed = [
            i
            for i, (scope, g, r, verbs, names) in enumerate(rules)
            if g == group
            and r == resource
            and (scope in ("*", ns))
            and (verb in verbs or (verb == "list" and "watch" in verbs))
            and (not names or p.name in names)
        ]
        assert allowed, f"RBAC does not allow {method} {path}"
        used.update(allowed)
    assert used == set(range(len(rules))), [r for i, r in enumerate(rules) if i not in used]


@pytest.mark.parametrize(
    "name",
    ["serviceaccount.yaml", "service.yaml", "record-signing-secret.example.yaml", "rbac.yaml"],
)
def test_everything_lives_in_the_tessera_namespace(name: str) -> None:
    for doc in docs(name):
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == rn.DEFAULT_HEARTBEAT_NAMESPACE
