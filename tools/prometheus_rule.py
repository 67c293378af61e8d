"""deploy/prometheus/prometheusrule.yaml, the kustomize component's PrometheusRule, from the
rule file beside it (deploy/prometheus/tessera-alerts.yaml, the one source of the rules).

kustomize cannot put a file's content into an object's field, so the component carries the
rules as a PrometheusRule written from the rule file: `python -m tools.prometheus_rule`
rewrites it, `--check` exits 1 when it differs from what the rule file gives (a test runs
it, so the two never drift apart). The Helm chart reads the rule file itself.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tools.generated import write_or_check

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "deploy" / "prometheus"
RULES = FOLDER / "tessera-alerts.yaml"
OUT = FOLDER / "prometheusrule.yaml"
COMMAND = "python -m tools.prometheus_rule"
HEADER = (
    f"# Written by `{COMMAND}` from tessera-alerts.yaml (the rules,\n"
    "# with why each threshold is what it is): edit that file, then run the command. The\n"
    "# kustomize component in this folder applies it; it needs the monitoring.coreos.com CRDs.\n"
)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (expressions, descriptions) as literal blocks, as written."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render(rules_text: str) -> str:
    rules: Any = yaml.safe_load(rules_text)
    if not isinstance(rules, dict) or not rules.get("groups"):
        raise ValueError(f"{RULES} holds no rule groups")
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "tessera",
            "namespace": "tessera-system",
            "labels": {"app.kubernetes.io/name": "tessera", "app.kubernetes.io/part-of": "tessera"},
        },
        "spec": {"groups": rules["groups"]},
    }
    body = yaml.dump(rule, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return HEADER + body


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say whether it is stale")
    args = parser.parse_args(argv)
    return write_or_check(OUT, render(RULES.read_text()), args.check, COMMAND)


if __name__ == "__main__":
    sys.exit(main())
