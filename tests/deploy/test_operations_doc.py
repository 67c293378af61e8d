"""Every command docs/operations.md gives an operator is run by a test: the walkthrough
sections' shell blocks by tests/e2e/test_install.py, every other command by the test named
for it below (a command added to the page without one fails here)."""

from __future__ import annotations

import re
import tomllib

import yaml

from tests.deploy.install_modes import CHART, DEPLOY, DOC, NAMESPACE, ROOT

_UPGRADE = (
    "tests/e2e/test_upgrade.py",
    "test_upgrade_and_rollback_keep_every_running_container_and_record",
)
EXERCISED = {
    "kubectl apply -k deploy/": (
        "tests/deploy/test_install_modes.py",
        "test_kubectl_apply_k_deploy_is_the_default_mode",
    ),
    "pip install .": ("tests/deploy/test_operations_doc.py", "test_pip_install_gives_the_programs"),
    "docker build -f deploy/Dockerfile -t <registry>/tessera:0.1.0 .": (
        "tests/deploy/test_dockerfile.py",
        "test_the_image_copies_every_package_pip_installs",
    ),
    "helm install tessera deploy/helm/tessera --namespace tessera-system": (
        "tests/e2e/test_install.py",
        "test_chart_installs_for_real_and_agrees_with_the_overlays",
    ),
    "kubectl tessera": (
        "tests/e2e/test_install.py",
        "test_second_scheduler_walkthrough_places_a_fractional_pod",
    ),
    "kubectl tessera pods": (
        "tests/e2e/test_install.py",
        "test_second_scheduler_walkthrough_places_a_fractional_pod",
    ),
    "kubectl tessera nodes": (
        "tests/e2e/test_install.py",
        "test_second_scheduler_walkthrough_places_a_fractional_pod",
    ),
    "tessera-scheduler --help": (
        "tests/test_flags_doc.py",
        "test_the_flags_table_matches_the_parser",
    ),
    "kubectl tessera gangs": (
        "tests/e2e/test_install.py",
        "test_second_scheduler_walkthrough_places_a_fractional_pod",
    ),
    "kubectl get nodedevices": (
        "tests/e2e/test_install.py",
        "test_second_scheduler_walkthrough_places_a_fractional_pod",
    ),
    "kubectl get nodedevices gpu-1 -o yaml": (
        "tests/e2e/test_install.py",
        "test_second_scheduler_walkthrough_places_a_fractional_pod",
    ),
    "kubectl -n tessera-system get lease": (
        "tests/e2e/test_install.py",
        "test_second_scheduler_walkthrough_places_a_fractional_pod",
    ),
    "tessera-device-plugin --gfd-labels": (
        "tests/deviceplugin/test_gfd_labels.py",
        "test_labels_in_gfds_formats",
    ),
    "helm upgrade tessera deploy/helm/tessera --namespace tessera-system": _UPGRADE,
    "kubectl apply --server-side --force-conflicts -k deploy/overlays/second-scheduler": _UPGRADE,
    "kubectl tessera explain POD": (
        "tests/kubectl/test_cli.py",
        "test_explain_agrees_with_the_scheduler_node_by_node",
    ),
    "tessera-node-check --root /host": (
        "tests/deviceplugin/test_preflight.py",
        "test_the_documented_report_is_what_the_command_prints",
    ),
}
_COMMAND = re.compile(r"(kubectl|tessera-[a-z-]+ |helm |docker |pip )")


def _commands() -> set[str]:
    """Commands outside shell blocks: inline code and `$ ` lines of example output."""
    text = DOC.read_text()
    outside = re.sub(r"```sh\n.*?```", "", text, flags=re.S)
    inline = {s for s in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", outside, flags=re.S))}
    prompts = set(re.findall(r"^\$ (.*)$", outside, re.M))
    return {c for c in inline | prompts if _COMMAND.match(c) and c != "kubectl"}


def test_every_command_on_the_page_names_the_test_that_runs_it() -> None:
    assert _commands() == set(EXERCISED)
    for path, test in EXERCISED.values():
        assert re.search(rf"^def {test}\(", (ROOT / path).read_text(), re.M), (path, test)


def test_pip_install_gives_the_programs() -> None:
    """`pip install .` gives every program the page runs."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for program in ("tessera-keys", "kubectl-tessera", "tessera-node-check"):
        assert program in scripts


def test_the_image_tag_and_the_helm_install_match_the_shipped_files() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    docker = next(c for c in EXERCISED if c.startswith("docker build"))
    assert (ROOT / docker.split()[3]).resolve() == (DEPLOY / "Dockerfile").resolve()
    assert docker.split()[5].endswith(f"/tessera:{chart['appVersion']}")
    helm = next(c for c in EXERCISED if c.startswith("helm install")).split()
    assert (ROOT / helm[3]).resolve() == CHART.resolve()
    assert helm[5] == NAMESPACE == values["namespace"]["name"]
