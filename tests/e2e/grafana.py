"""The Grafana dashboard's panel queries as Grafana sends them to Prometheus.

Grafana replaces template variables in a query before it sends it. The forms it knows are
`$name`, `${name}`, `${name:format}`, `[[name]]` and `[[name:format]]`; the names are the
dashboard's own variables (its `templating` list) and Grafana's built-ins. What the
Prometheus data source (Grafana 10) puts in for the built-ins:

- `$__interval`: the dashboard's time range divided by the panel's max data points (its
  width in pixels unless set), rounded to one of Grafana's steps (ROUNDED_STEPS), and not
  below the panel's min interval, else the data source's scrape interval setting; written
  in its largest whole unit (`15s`, `1m`, `500ms`); `$__interval_ms` in milliseconds;
- `$__rate_interval`: max(`$__interval` + scrape interval, 4 x scrape interval), the scrape
  interval being the query's min step when set, else the data source's setting; written
  in seconds (`60s`);
- `$__range`, `$__range_s`, `$__range_ms`: the time range (`21600s`, `21600`, `21600000`).

A dashboard variable's value goes in as the Prometheus data source writes it: a single
value of a variable that is neither multi-value nor has an "All" option with `\\` and `'`
escaped; otherwise each value regex-escaped, several as `(a|b)`. A variable this module
is not given a value for, or a format it does not know, is an error: a new variable in
the dashboard needs a value in the test that runs its queries.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ROUNDED_STEPS: tuple[tuple[int, int], ...] = (
    (10, 1),
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1_500, 1_000),
    (3_500, 2_000),
    (7_500, 5_000),
    (12_500, 10_000),
    (17_500, 15_000),
    (25_000, 20_000),
    (45_000, 30_000),
    (90_000, 60_000),
    (210_000, 120_000),
    (450_000, 300_000),
    (750_000, 600_000),
    (1_050_000, 900_000),
    (1_500_000, 1_200_000),
    (2_700_000, 1_800_000),
    (5_400_000, 3_600_000),
    (9_000_000, 7_200_000),
    (16_200_000, 10_800_000),
    (32_400_000, 21_600_000),
    (86_400_000, 43_200_000),
    (604_800_000, 86_400_000),
    (1_814_400_000, 604_800_000),
    (3_628_800_000, 2_592_000_000),
)
"""(below this many ms, the interval becomes this many ms); above the last, one year."""
YEAR_MS = 31_536_000_000
UNITS_MS = (("y", YEAR_MS), ("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000))
VARIABLE = re.compile(
    r"\$(?P<bare>\w+)"
    r"|\[\[(?P<old>\w+?)(?::(?P<old_format>\w+))?\]\]"
    r"|\$\{(?P<braced>\w+)(?::(?P<format>[^}]+))?\}"
)
"""Grafana's variable forms (its field paths, `${name.field}`, are not used here)."""
_REGEX_SPECIALS = re.compile(r"[$^*{}\[\]'+?.()|]")


class VariableError(ValueError):
    """A query names a variable, or a format, that has no value here."""


def round_interval(ms: float) -> int:
    """Grafana's step for a raw interval of `ms` milliseconds."""
    at = bisect.bisect_right([limit for limit, _ in ROUNDED_STEPS], ms)
    return ROUNDED_STEPS[at][1] if at < len(ROUNDED_STEPS) else YEAR_MS


def hms(ms: int) -> str:
    """`ms` in its largest whole unit, the rest dropped, as Grafana writes an interval."""
    for unit, size in UNITS_MS:
        if ms >= size:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def seconds_text(text: str) -> float:
    """A Grafana or Prometheus duration (`15s`, `1m`, `500ms`) in seconds."""
    found = re.fullmatch(r"(\d+)(ms|s|m|h|d|w|y)", text.strip())
    if found is None:
        raise ValueError(f"not a duration: {text!r}")
    per = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return int(found.group(1)) * per[found.group(2)]


@dataclass(frozen=True)
class Variable:
    values: tuple[str, ...]
    multi: bool = False
    include_all: bool = False


@dataclass(frozen=True)
class View:
    """What Grafana computes the built-ins from: the time range shown, the panel's max data
    points, and the data source's scrape interval setting."""

    range_s: int
    max_data_points: int
    scrape_interval_s: float
    variables: Mapping[str, Variable] = field(default_factory=dict)


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref: str
    expr: str
    min_interval: str | None
    """The query's min step (`interval` of the target), else the panel's min interval."""


def panel_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    """Every Prometheus query of every panel (rows' panels included), in dashboard order."""
    out: list[PanelQuery] = []

    def walk(panels: Sequence[Mapping[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels") or [])
            for target in panel.get("targets") or []:
                if target.get("expr") is None or target.get("hide"):
                    continue
                interval = target.get("interval") or panel.get("interval") or None
                out.append(PanelQuery(panel["title"], target["refId"], target["expr"], interval))

    walk(dashboard.get("panels") or [])
    return out


def builtins(view: View, min_interval: str | None) -> dict[str, str]:
    """The built-in variables for a query with this min interval (None: the data source's
    scrape interval is the floor)."""
    scrape_ms = round(view.scrape_interval_s * 1000)
    floor_ms = round(seconds_text(min_interval) * 1000) if min_interval else scrape_ms
    range_ms = view.range_s * 1000
    interval_ms = max(round_interval(range_ms / view.max_data_points), floor_ms)
    step_ms = floor_ms  # the scrape interval $__rate_interval counts with
    rate_s = max(interval_ms + step_ms, 4 * step_ms) / 1000
    return {
        "__interval": hms(interval_ms),
        "__interval_ms": str(interval_ms),
        "__rate_interval": f"{rate_s:g}s",
        "__range": f"{view.range_s}s",
        "__range_s": str(view.range_s),
        "__range_ms": str(range_ms),
    }


def _regular_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\\\'")


def _regex_escape(value: str) -> str:
    return _REGEX_SPECIALS.sub(lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def _formatted(variable: Variable) -> str:
    if not variable.multi and not variable.include_all:
        (value,) = variable.values
        return _regular_escape(value)
    escaped = [_regex_escape(v) for v in variable.values]
    return escaped[0] if len(escaped) == 1 else f"({'|'.join(escaped)})"


def substitute(query: PanelQuery, view: View) -> str:
    """The query's expression with every variable replaced as Grafana does."""
    known = builtins(view, query.min_interval)

    def one(match: re.Match[str]) -> str:
        name = match.group("bare") or match.group("old") or match.group("braced")
        fmt = match.group("format") or match.group("old_format")
        if fmt is not None:
            raise VariableError(f"{query.panel}/{query.ref}: format {fmt!r} of ${name}")
        if name in known:
            return known[name]
        if name in view.variables:
            return _formatted(view.variables[name])
        raise VariableError(f"{query.panel}/{query.ref}: no value for ${name}")

    return VARIABLE.sub(one, query.expr)


def default_range_s(dashboard: Mapping[str, Any]) -> int:
    """The dashboard's default time range in seconds (`now-6h` to `now`)."""
    shown = dashboard.get("time") or {"from": "now-6h", "to": "now"}
    start, end = shown.get("from", ""), shown.get("to", "")
    found = re.fullmatch(r"now-(\d+[smhdwy])", start)
    if end != "now" or found is None:
        raise ValueError(f"not a relative time range: {shown}")
    return round(seconds_text(found.group(1)))
