"""tessera's alerting rules (deploy/prometheus/tessera-alerts.yaml).

The real promtool checks the file and runs the unit tests beside it
(deploy/prometheus/tests/: every alert fires on the series that should fire it and stays
silent on near misses). Here, without promtool: every alert carries what an operator needs
(severity, a one-line summary, a description, a runbook section that exists and names real
`kubectl tessera` commands), queries only metrics the components export, and is fired by at
least one promtool case and kept silent by another. The chart and the kustomize component
ship this one file.

promtool comes with Debian's `prometheus` package; `.ci/run` installs it. Without it the
promtool tests fail, saying how to install it, unless TESSERA_SKIP_PROMTOOL=1 says to leave
them out: a suite that skips them silently would prove nothing.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.exported_metrics import METRIC, exported_series
from tests.deploy.install_modes import (
    CHART,
    DEPLOY,
    NAMESPACE,
    chart_copy,
    kustomize,
    lint,
    lint_errors,
)

ROOT = DEPLOY.parent
FOLDER = DEPLOY / "prometheus"
RULES = FOLDER / "tessera-alerts.yaml"
CASES = sorted((FOLDER / "tests").glob("*.yaml"))
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
RUNBOOK = "https://github.com/tessera-dev/tessera/blob/main/docs/troubleshooting.md#"
SEVERITIES = {"critical", "warning"}
SKIP_PROMTOOL = "TESSERA_SKIP_PROMTOOL"
PROMTOOL_TIMEOUT = 300

NOT_YET_EXPORTED: dict[str, str] = {}
"""Metrics the rules use that their components (named) do not export yet. The test below
fails as soon as one of them is exported (remove it here), and for any other name."""


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


ALERTS = {rule["alert"]: rule for rule in _rules()}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is not None:
        return found
    if os.environ.get(SKIP_PROMTOOL) == "1":
        pytest.skip(f"promtool is not installed ({SKIP_PROMTOOL}=1 leaves these tests out)")
    pytest.fail(
        "promtool is not installed: `apt-get install prometheus` (Debian's package has it), "
        f"or set {SKIP_PROMTOOL}=1 to leave the alert rule tests out",
        pytrace=False,
    )


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=PROMTOOL_TIMEOUT,
    )


# --- the real promtool ---------------------------------------------------------------------


def test_promtool_checks_the_rule_file() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_promtool_runs_every_alert_test_and_they_pass() -> None:
    assert CASES, "no promtool test files"
    done = _promtool("test", "rules", *map(str, CASES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(CASES), done.stdout


def test_promtool_fails_a_case_that_expects_the_wrong_answer(tmp_path: Path) -> None:
    """The runner can fail: a near miss turned into an expected alert is refused."""
    doc = yaml.safe_load((FOLDER / "tests" / "nodes.yaml").read_text())
    doc["rule_files"] = [str(RULES)]
    silent = next(
        t for group in doc["tests"] for t in group["alert_rule_test"] if not t["exp_alerts"]
    )
    silent["exp_alerts"] = [{"exp_labels": {"severity": "warning"}}]
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(doc))
    done = _promtool("test", "rules", str(broken))
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr


def test_without_promtool_the_tests_fail_saying_how_to_install_it_unless_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv(SKIP_PROMTOOL, raising=False)
    with pytest.raises(pytest.fail.Exception, match="apt-get install prometheus"):
        promtool()
    monkeypatch.setenv(SKIP_PROMTOOL, "1")
    with pytest.raises(pytest.skip.Exception, match=SKIP_PROMTOOL):
        promtool()


# --- what each alert carries ----------------------------------------------------------------


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _sections() -> dict[str, str]:
    """Each heading's anchor -> its section's text, to the next heading of its level or
    above."""
    lines = TROUBLESHOOTING.read_text().splitlines()
    heads = [
        (i, len(m.group(1)), m.group(2))
        for i, line in enumerate(lines)
        if (m := re.match(r"^(#{1,6}) (.+)$", line))
    ]
    out = {}
    for n, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[n + 1 :] if lv <= level), len(lines))
        out[_anchor(title)] = "\n".join(lines[i:end])
    return out


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_each_alert_says_how_bad_what_where_and_links_its_runbook(name: str) -> None:
    rule = ALERTS[name]
    assert rule["labels"]["severity"] in SEVERITIES, name
    notes = rule["annotations"]
    assert set(notes) == {"summary", "description", "runbook_url"}, name
    assert notes["summary"].strip() and "\n" not in notes["summary"], name
    assert len(notes["description"].split()) >= 10, name
    assert notes["runbook_url"] == RUNBOOK + name.lower(), name


PLACEHOLDER_VALUES = {"NS": "team-a", "NAMESPACE": "team-a"}
"""The runbooks' placeholders whose flags check their value, and a value that passes."""


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_each_runbook_section_says_what_it_means_what_to_check_and_what_to_do(
    name: str,
) -> None:
    from kubectl_tessera.cli import parser

    sections = _sections()
    anchor = ALERTS[name]["annotations"]["runbook_url"].removeprefix(RUNBOOK)
    assert anchor in sections, f"docs/troubleshooting.md has no section #{anchor}"
    section = sections[anchor]
    for part in ("**What it means**", "**What to check**", "**What to do**"):
        assert part in section, (name, part)
    commands = re.findall(r"`kubectl tessera ([^`]+)`", section) + re.findall(
        r"^kubectl tessera (.+)$", section, re.M
    )
    assert commands, f"{name}: the runbook names no `kubectl tessera` command"
    for command in commands:
        # a placeholder stands for a value; the namespace's is checked, so give it one
        words = [PLACEHOLDER_VALUES.get(word, word) for word in shlex.split(command)]
        try:
            parser().parse_args(words)
        except SystemExit:
            pytest.fail(f"{name}: `kubectl tessera {command}` is not a command it takes")


def test_every_link_within_the_page_has_its_heading() -> None:
    sections = _sections()
    links = re.findall(r"\]\(#([^)]+)\)", TROUBLESHOOTING.read_text())
    assert links and [a for a in links if a not in sections] == []


def test_the_anchor_rule_is_githubs() -> None:
    assert _anchor("A node agent's Lease expired") == "a-node-agents-lease-expired"
    assert _anchor("TesseraNriHookNotConnected") == "tesseranrihooknotconnected"


# --- what the rules query ------------------------------------------------------------------


def test_the_rules_query_only_metrics_the_components_export() -> None:
    used = {m for rule in ALERTS.values() for m in METRIC.findall(rule["expr"])}
    exported = exported_series()
    missing = used - exported
    unexpected = missing - set(NOT_YET_EXPORTED)
    assert not unexpected, f"the rules query {sorted(unexpected)}, which nothing exports"
    landed = set(NOT_YET_EXPORTED) & exported
    assert not landed, f"now exported: remove {sorted(landed)} from NOT_YET_EXPORTED"
    assert set(NOT_YET_EXPORTED) <= used, "NOT_YET_EXPORTED names a metric no rule uses"


def test_the_metric_check_sees_a_name_nothing_exports() -> None:
    expr = "tessera_node_gpu_healthy == 0 or tessera_node_gpu_healty == 0"
    assert set(METRIC.findall(expr)) - exported_series() == {"tessera_node_gpu_healty"}


# --- the promtool cases ----------------------------------------------------------------------


def _cases() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path, case)
        for path in CASES
        for group in yaml.safe_load(path.read_text())["tests"]
        for case in group.get("alert_rule_test", [])
    ]


def test_every_alert_fires_in_a_case_and_stays_silent_in_another() -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for path, case in _cases():
        name = case["alertname"]
        # a misspelt name would pass every silent case without testing anything
        assert name in ALERTS, f"{path.name}: no alert {name}"
        if case["exp_alerts"]:
            fired.add(name)
            for alert in case["exp_alerts"]:
                assert alert["exp_labels"]["severity"] == ALERTS[name]["labels"]["severity"]
                assert alert["exp_annotations"]["runbook_url"].endswith(name.lower())
        else:
            silent.add(name)
    assert set(ALERTS) - fired == set(), "never fired by a promtool case"
    assert set(ALERTS) - silent == set(), "never checked silent on a near miss"


def test_every_case_file_tests_the_shipped_rule_file() -> None:
    for path in CASES:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../tessera-alerts.yaml"], path.name
        assert (path.parent / doc["rule_files"][0]).resolve() == RULES.resolve()


# --- shipped both ways ---------------------------------------------------------------------


def test_the_chart_reads_the_rule_file_itself() -> None:
    """One source: the chart's files/tessera-alerts.yaml is a link to the rule file, and the
    template puts that file's groups under the PrometheusRule's spec."""
    link = CHART / "files" / "tessera-alerts.yaml"
    assert link.is_symlink() and link.resolve() == RULES.resolve()
    template = (CHART / "templates" / "prometheusrule.yaml").read_text()
    assert '.Files.Get "files/tessera-alerts.yaml" | fromYaml' in template
    assert "toYaml $rules.groups" in template
    assert template.startswith("{{- if .Values.metrics.prometheusRule.enabled }}")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["metrics"]["prometheusRule"] == {"enabled": False, "labels": {}}


def _chart_beside_its_rules(tmp_path: Path, values: dict[str, Any]) -> Path:
    """The chart copied with its link, and the rule file where the link points."""
    chart = tmp_path / "deploy" / "helm" / "tessera"
    shutil.copytree(CHART, chart, symlinks=True)
    (tmp_path / "deploy" / "prometheus").mkdir(parents=True)
    shutil.copy(RULES, tmp_path / "deploy" / "prometheus" / RULES.name)
    doc = yaml.safe_load((chart / "values.yaml").read_text())
    doc["metrics"]["prometheusRule"].update(values)
    (chart / "values.yaml").write_text(yaml.safe_dump(doc))
    return chart


def test_the_chart_lints_with_the_prometheus_rule_through_its_link(tmp_path: Path) -> None:
    chart = _chart_beside_its_rules(
        tmp_path, {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}
    )
    result = lint(chart)
    assert result["TotalChartsLinted"] == 1
    assert not lint_errors(result), result


def test_the_chart_refuses_prometheus_rule_labels_that_are_not_strings(tmp_path: Path) -> None:
    result = lint(
        chart_copy(tmp_path / "tessera", {"metrics": {"prometheusRule": {"labels": {"a": 1}}}})
    )
    assert any(m["Path"] == "values.yaml" for m in lint_errors(result)), result


def test_the_kustomize_component_applies_the_rule_file_as_a_prometheus_rule(
    tmp_path: Path,
) -> None:
    """The kustomization docs/metrics.md shows, as written (its paths made relative to
    where it lies): the install mode, the component, the label for a ruleSelector."""
    from tools import prometheus_rule

    assert prometheus_rule.main(["--check"]) == 0, "run python -m tools.prometheus_rule"
    doc = (ROOT / "docs" / "metrics.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "components:" in b]
    mine = tmp_path / "cluster"
    mine.mkdir()
    base = os.path.relpath(DEPLOY, mine)
    text = "\n".join(line[2:] for line in block.splitlines())  # the list item's indent
    (mine / "kustomization.yaml").write_text(text.replace("- deploy/", f"- {base}/"))
    objs = kustomize(mine)
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert len(objs) == len(kustomize(DEPLOY / "overlays" / "second-scheduler")) + 1


def test_the_component_file_is_stale_once_the_rules_change() -> None:
    from tools import prometheus_rule

    changed = RULES.read_text().replace("for: 10m", "for: 11m", 1)
    assert prometheus_rule.render(changed) != prometheus_rule.OUT.read_text()
    with pytest.raises(ValueError, match="no rule groups"):
        prometheus_rule.render("groups: []\n")
