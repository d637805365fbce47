"""What Grafana's Prometheus data source sends, rebuilt in Python for the tests.

Read from Grafana's source (github.com/grafana/grafana):

- ``pkg/promlib/client/client.go``: with ``httpMethod: POST``, ``api/v1/query`` and
  ``api/v1/query_range`` are POSTs with a form body (``query``, ``start``, ``end``, ``step``,
  ``timeout`` from ``queryTimeout``) and ``Content-Type: application/x-www-form-urlencoded``;
  times are Unix seconds with fractions (``formatTime``), the step seconds
  (``strconv.FormatFloat(step.Seconds(), 'f', -1, 64)``). Resource calls (labels, series) are
  POSTs too, except the paths in ``endpointsSupportOnlyGet``: ``api/v1/label/<name>/values``,
  ``api/v1/metadata`` and ``api/v1/status/buildinfo`` are always GETs, query string only.
- ``pkg/promlib/models/query.go``: the step is ``max(calculated, safe)`` where calculated is
  ``range / maxDataPoints`` rounded (``gtime.RoundInterval``), at least the data source's
  ``timeInterval`` (15 s by default), and safe is ``range / 11000``; the time range is aligned
  down to a multiple of the step (``AlignTimeRange``). ``interpolateVariables`` replaces
  ``$__interval`` (``gtime.FormatInterval``: ``15s``, ``2m``), ``$__range`` (seconds + ``s``)
  and ``$__rate_interval`` = ``max($__interval + scrape, 4 x scrape)`` written by Go's
  ``Duration.String`` (``1m0s``, ``2m15s``).
- ``public/app/plugins/datasource/prometheus/datasource.ts`` (``interpolateQueryExpr``): a
  multi-value or include-all variable becomes ``(a|b)`` of regex-escaped values, a single one
  its value; ``label_values(metric, label)`` is answered from
  ``GET api/v1/label/<label>/values?match[]=metric&start=..&end=..`` (Prometheus >= 2.24).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARDS = ROOT / "dashboards"
DATASOURCE = ROOT / "provisioning" / "datasources" / "metricvault.yaml"
GRAFANA_HEADERS = {"User-Agent": "Grafana/11.3.0", "X-Grafana-Org-Id": "1",
                   "Accept-Encoding": "gzip, deflate"}  # fmt: skip
MAX_DATA_POINTS = 1000  # what a ~1000 px wide panel asks for
_ENV = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_ROUND = [(10, 1), (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500),
          (1_500, 1_000), (3_500, 2_000), (7_500, 5_000), (12_500, 10_000), (17_500, 15_000),
          (25_000, 20_000), (45_000, 30_000), (90_000, 60_000), (210_000, 120_000),
          (450_000, 300_000), (750_000, 600_000), (1_050_000, 900_000),
          (1_500_000, 1_200_000), (2_700_000, 1_800_000), (5_400_000, 3_600_000),
          (9_000_000, 7_200_000), (16_200_000, 10_800_000), (32_400_000, 21_600_000),
          (86_400_000, 43_200_000), (604_800_000, 86_400_000)]  # fmt: skip


def load_datasource(env: dict[str, str]) -> dict[str, Any]:
    """The provisioned data source with ``$VAR``/``${VAR}`` replaced as Grafana does."""
    text = _ENV.sub(lambda m: env.get(m.group(1) or m.group(2), ""), DATASOURCE.read_text())
    sources: list[dict[str, Any]] = yaml.safe_load(text)["datasources"]
    return sources[0]


def datasource_headers(source: dict[str, Any]) -> dict[str, str]:
    json_data, secure = source.get("jsonData", {}), source.get("secureJsonData", {})
    headers = dict(GRAFANA_HEADERS)
    for i in range(1, 10):
        if f"httpHeaderName{i}" in json_data:
            headers[json_data[f"httpHeaderName{i}"]] = secure.get(f"httpHeaderValue{i}", "")
    return headers


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def round_interval(ms: int) -> int:
    for limit, rounded in _ROUND:
        if ms <= limit:
            return rounded
    return 2_592_000_000 if ms < 3_628_800_000 else 31_536_000_000


def format_interval(ms: int) -> str:  # gtime.FormatInterval
    for unit, size in (("y", 31_536_000_000), ("d", 86_400_000), ("h", 3_600_000),
                       ("m", 60_000), ("s", 1_000), ("ms", 1)):  # fmt: skip
        if ms >= size:
            return f"{ms // size}{unit}"
    return "1ms"


def go_duration(ms: int) -> str:  # time.Duration.String for whole milliseconds
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:g}s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    return f"{minutes}m{seconds}" if minutes else seconds


@dataclass
class Request:
    method: str
    path: str
    params: list[tuple[str, str]]
    headers: dict[str, str] = field(default_factory=dict)
    what: str = ""

    def encoded(self) -> tuple[str, bytes | None, dict[str, str]]:
        """(path with query string, body, headers) as Grafana puts them on the wire."""
        form = urllib.parse.urlencode(self.params)
        if self.method == "GET":
            return f"{self.path}?{form}" if form else self.path, None, dict(self.headers)
        headers = {**self.headers, "Content-Type": "application/x-www-form-urlencoded"}
        return self.path, form.encode(), headers


def regex_escape(value: str) -> str:  # prometheusSpecialRegexEscape
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value.replace("\\", "\\\\\\\\"))


def interpolate(expr: str, variables: dict[str, tuple[list[str], bool]]) -> str:
    """Template variables as datasource.ts replaces them: {name: (values, multi_or_all)}."""

    def value(name: str) -> str:
        values, multi = variables[name]
        if not multi:
            return values[0] if values else ""
        escaped = [regex_escape(v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    names = sorted(variables, key=len, reverse=True)
    for name in names:
        expr = expr.replace("${" + name + "}", value(name)).replace("[[" + name + "]]", value(name))
        expr = re.sub(r"\$" + name + r"\b", value(name).replace("\\", "\\\\"), expr)
    return expr


def label_values_request(
    query: str,
    start_s: float,
    end_s: float,
    headers: dict[str, str],
    variables: dict[str, tuple[list[str], bool]],
) -> tuple[Request, str]:
    """The request for a ``label_values(...)`` variable and the label it lists."""
    match = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", query.strip())
    assert match, f"unsupported variable query {query!r}"
    selector, label = match.group(1), match.group(2)
    params = [("start", _seconds(start_s)), ("end", _seconds(end_s))]
    if selector:
        params.insert(0, ("match[]", interpolate(selector, variables)))
    path = f"/api/v1/label/{label}/values"
    return Request("GET", path, params, headers, f"variable {query}"), label


def _seconds(s: float) -> str:
    return repr(round(s, 3)).removesuffix(".0")


@dataclass
class PanelQuery:
    dashboard: str
    panel: str
    ref: str
    expr: str  # after substitution
    request: Request


def panel_requests(board: dict[str, Any], name: str, start_ms: int, end_ms: int,
                   variables: dict[str, tuple[list[str], bool]], source: dict[str, Any],
                   headers: dict[str, str]) -> list[PanelQuery]:  # fmt: skip
    """Every panel target as the backend sends it (query or query_range form)."""
    json_data = source.get("jsonData", {})
    scrape_ms = _duration_ms(json_data.get("timeInterval", "15s"))
    range_ms = end_ms - start_ms
    calculated = range_ms // MAX_DATA_POINTS
    calculated = scrape_ms if calculated < scrape_ms else round_interval(calculated)
    safe = round_interval(range_ms // 11_000)
    step_ms = max(calculated, safe)
    rate_ms = max(step_ms + scrape_ms, 4 * scrape_ms)
    builtins = {"$__rate_interval": go_duration(rate_ms), "$__interval": format_interval(step_ms),
                "$__range": f"{round(range_ms / 1000)}s"}  # fmt: skip
    timeout = json_data.get("queryTimeout")
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, text in builtins.items():  # longest first: $__rate_interval, ...
                expr = expr.replace(var, text)
            expr = interpolate(expr, variables)
            panel_headers = {**headers, "X-Dashboard-Uid": board["uid"],
                             "X-Panel-Id": str(panel["id"]),
                             "X-Datasource-Uid": panel["datasource"]["uid"]}  # fmt: skip
            if target.get("instant"):
                params = [("query", expr), ("time", _seconds(end_ms / 1000))]
                path = "/api/v1/query"
            else:
                lo, hi = start_ms // step_ms * step_ms, end_ms // step_ms * step_ms  # aligned
                params = [
                    ("query", expr),
                    ("start", _seconds(lo / 1000)),
                    ("end", _seconds(hi / 1000)),
                    ("step", f"{step_ms / 1000:g}"),
                ]
                path = "/api/v1/query_range"
            if timeout:
                params.append(("timeout", timeout))
            request = Request("POST", path, params, panel_headers, f"{name}: {panel['title']}")
            out.append(PanelQuery(name, panel["title"], target["refId"], expr, request))
    return out


def _duration_ms(text: str) -> int:
    from metricvault.durations import parse_duration_ms

    return parse_duration_ms(text)
