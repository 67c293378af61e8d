"""A real Prometheus for the e2e suite and the scrape benchmark: Debian's `prometheus`
binary (2.42 tested) run with static scrape targets and tessera's rule file, read through
its HTTP API (`/api/v1/query`, `/api/v1/alerts`, `/api/v1/rules`).

The scrape configuration has the shape the manifests give: one job per program, named as
the rule file's tests name them, each scraping `/metrics` over plain HTTP (tessera-scheduler
on its health port, 8081 as shipped; the node agent and the NRI hook on their metrics
ports, 9465 and 9466; none of the three serves /metrics over TLS on those ports), with
static targets. Where several programs share one host (the e2e suite, a benchmark) each
listens on a port of its own, and the targets name those ports.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import urllib3
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "tessera-alerts.yaml"
BINARY_VAR = "TESSERA_E2E_PROMETHEUS"
SCHEDULER_JOB = "tessera-scheduler"
AGENT_JOB = "tessera-device-plugin"
HOOK_JOB = "tessera-nri-hook"
NEEDS = (
    "Prometheus (`apt-get install prometheus`: Debian's package, 2.42 tested), "
    f"or ${BINARY_VAR} naming its binary"
)
START_TIMEOUT = 60.0


def binary() -> Path | None:
    """The `prometheus` executable: $TESSERA_E2E_PROMETHEUS, else `prometheus` on PATH."""
    named = os.environ.get(BINARY_VAR) or shutil.which("prometheus") or ""
    path = Path(named)
    return path if named and path.is_file() and os.access(path, os.X_OK) else None


def missing(who: str) -> str:
    """'' when Prometheus is found, else one line saying that `who` needs it and how."""
    return "" if binary() is not None else f"{who} needs {NEEDS}"


def duration(seconds: float) -> str:
    """`seconds` as a Prometheus duration: whole seconds as `Ns`, anything finer in ms."""
    if seconds <= 0 or not math.isfinite(seconds):
        raise ValueError(f"a duration must be positive: {seconds}")
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def scrape_config(
    jobs: Mapping[str, Sequence[str]],
    *,
    scrape_interval: float,
    evaluation_interval: float,
    rule_files: Sequence[Path] = (),
    scrape_timeout: float | None = None,
) -> dict[str, Any]:
    """A prometheus.yml: each job (name -> `host:port` targets) scraping `/metrics` over
    plain HTTP every `scrape_interval` seconds, rules evaluated every
    `evaluation_interval`. The timeout defaults to the interval (Prometheus allows no
    longer), so that a slow scrape shows as slow, not as failed."""
    timeout = scrape_interval if scrape_timeout is None else scrape_timeout
    if timeout > scrape_interval:
        raise ValueError(f"scrape timeout {timeout}s is longer than the interval")
    if not jobs or any(not targets for targets in jobs.values()):
        raise ValueError(f"every job needs a target: {dict(jobs)}")
    return {
        "global": {
            "scrape_interval": duration(scrape_interval),
            "scrape_timeout": duration(timeout),
            "evaluation_interval": duration(evaluation_interval),
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                "scheme": "http",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": list(targets)}],
            }
            for job, targets in jobs.items()
        ],
    }


def find_alert(doc: Mapping[str, Any], alert: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(group, rule) of the alerting rule `alert` in a rule file's document."""
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                return group, rule
    raise KeyError(f"no alert {alert} in the rule file")


def with_shorter_for(shipped: Mapping[str, Any], alert: str, for_: str) -> dict[str, Any]:
    """A rule file holding the one alert `alert` of `shipped`, in a group of the same name,
    with its `for:` set to `for_` and everything else as shipped: for a test that cannot
    wait the shipped `for:` (Prometheus keys groups by file and name, so it loads this
    file beside the shipped one). `changed_fields` proves the difference."""
    group, rule = find_alert(shipped, alert)
    if "for" not in rule:
        raise ValueError(f"{alert} has no for: to shorten")
    derived_group = {k: copy.deepcopy(v) for k, v in group.items() if k != "rules"}
    derived_group["rules"] = [{**copy.deepcopy(rule), "for": for_}]
    return {"groups": [derived_group]}


def changed_fields(shipped: Mapping[str, Any], derived: Mapping[str, Any]) -> list[str]:
    """Where the derived rule file's one rule differs from the shipped rule of its name, as
    `group/alert: field` lines (its group's settings count as fields too)."""
    ((group,),) = [derived["groups"]]
    ((rule,),) = [group["rules"]]
    shipped_group, shipped_rule = find_alert(shipped, rule["alert"])
    where = f"{group['name']}/{rule['alert']}"
    fields = [
        f"{where}: group {k}"
        for k in sorted((set(group) | set(shipped_group)) - {"rules"})
        if group.get(k) != shipped_group.get(k)
    ]
    fields += [
        f"{where}: {k}"
        for k in sorted(set(rule) | set(shipped_rule))
        if rule.get(k) != shipped_rule.get(k)
    ]
    return fields


class PrometheusError(Exception):
    """Prometheus's API answered an error (its type and message), or no answer came."""


class Prometheus:
    """One Prometheus process with `config` (a prometheus.yml document), its data and log in
    `work`, its API on 127.0.0.1:`port`."""

    def __init__(self, executable: Path, work: Path, config: Mapping[str, Any], port: int) -> None:
        self.executable = executable
        self.work = work
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.config_file = work / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        self.log = work / "prometheus.log"
        self._popen: subprocess.Popen[bytes] | None = None
        self._http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(10))

    def start(self) -> Prometheus:
        with self.log.open("ab") as log:
            self._popen = subprocess.Popen(
                [
                    str(self.executable),
                    f"--config.file={self.config_file}",
                    f"--storage.tsdb.path={self.work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=info",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._popen.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited ({self._popen.returncode}): {self.tail()}"
                )
            try:
                if self._http.request("GET", f"{self.url}/-/ready").status == 200:
                    return self
            except urllib3.exceptions.HTTPError:
                pass  # not listening yet
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready after {START_TIMEOUT:.0f}s: {self.tail()}")

    def stop(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            self._popen.terminate()
            try:
                self._popen.wait(15)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()
        self._http.clear()

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a GET of /api/v1/<path>; PrometheusError with Prometheus's own
        error type and message when it answers an error."""
        try:
            answer = self._http.request("GET", f"{self.url}/api/v1/{path}", fields=params)
        except urllib3.exceptions.HTTPError as exc:
            raise PrometheusError(f"GET /api/v1/{path}: {exc}") from None
        try:
            body = json.loads(answer.data)
        except ValueError:
            raise PrometheusError(
                f"GET /api/v1/{path}: {answer.status} {answer.data[:200]!r}"
            ) from None
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result now (a vector: one entry per series; a matrix for a
        range selector; a scalar as one entry without labels)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Every pending or firing alert (labels, state, activeAt)."""
        return list(self.api("alerts")["alerts"])

    def alert_rules(self) -> list[dict[str, Any]]:
        """Every alerting rule loaded, each with `file` (its rule file) and `group`."""
        return [
            {**rule, "file": group["file"], "group": group["name"]}
            for group in self.api("rules", type="alert")["groups"]
            for rule in group["rules"]
        ]

    def targets_up(self) -> dict[str, bool]:
        """`job/instance` -> whether its last scrape succeeded, for every target scraped at
        least once."""
        return {
            f"{s['metric']['job']}/{s['metric']['instance']}": s["value"][1] == "1"
            for s in self.query("up")
        }


@contextmanager
def running(
    executable: Path, work: Path, config: Mapping[str, Any], port: int
) -> Iterator[Prometheus]:
    """A started Prometheus for the block, stopped after it."""
    work.mkdir(parents=True, exist_ok=True)
    prometheus = Prometheus(executable, work, config, port)
    try:
        yield prometheus.start()
    finally:
        prometheus.stop()


def finite(result: Sequence[Mapping[str, Any]]) -> list[float]:
    """The finite sample values of an instant vector result (NaN and Inf left out)."""
    values = [float(s["value"][1]) for s in result]
    return [v for v in values if math.isfinite(v)]
