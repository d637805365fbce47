"""deploy/grafana/ is a valid Grafana set-up for metricvault (issue 13).

The provisioned data source is a Prometheus one pointed at ``metricvault serve`` with the
settings docs/grafana.md gives; every dashboard is a dashboard JSON Grafana loads (schema
version, unique panel ids and refIds, grid positions inside the 24 columns), every panel,
target and variable names the provisioned data source's uid, every query parses as PromQL once
Grafana's variables are substituted, and every metric it reads is one the project produces:
DCGM_* fields of the NVML source and the simulator, the training API's series, the gateway's
own metrics (or ``up``, which Prometheus adds to every scrape). The queries themselves run
against a real gateway in tests/e2e/test_grafana.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser as pp
import pytest
import yaml

from metricvault.server.prometheus_api import PROMETHEUS_COMPATIBLE_VERSION

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
SRC = ROOT / "src" / "metricvault"
EXPECTED = {"gateway", "gpu-cluster", "gpu-node", "training-run"}
BUILTINS = {"$__rate_interval": "1m0s", "$__interval": "20s", "$__range": "21600s"}


def _datasource() -> dict[str, Any]:
    text = (GRAFANA / "provisioning" / "datasources" / "metricvault.yaml").read_text()
    sources: list[dict[str, Any]] = yaml.safe_load(text)["datasources"]
    assert len(sources) == 1
    return sources[0]


def _board(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def _produced_names() -> str:
    """The text of the modules that name the series the project writes."""
    files = [*(SRC / "collect" / "sources" / "nvml").glob("*.py"), *(SRC / "sim").glob("*.py"),
             SRC / "collect" / "training.py", SRC / "server" / "metrics.py"]  # fmt: skip
    return "\n".join(p.read_text() for p in files) + (ROOT / "docs" / "metrics.md").read_text()


def _metric_names(node: Any) -> set[str]:
    if node is None or isinstance(node, (str, int, float)):
        return set()
    if isinstance(node, list):
        return set().union(*(_metric_names(n) for n in node)) if node else set()
    if type(node).__name__ == "VectorSelector":
        return {node.name} if node.name else set()
    found: set[str] = set()
    for attr in ("lhs", "rhs", "expr", "param", "args", "vector_selector", "vs"):
        if hasattr(node, attr):
            found |= _metric_names(getattr(node, attr))
    return found


def _substituted(expr: str) -> str:
    for name, value in BUILTINS.items():
        expr = expr.replace(name, value)
    return re.sub(r"\$\{?(\w+)\}?", "value", expr)


def test_provisioned_data_source_is_metricvault_as_prometheus_2_42() -> None:
    source = _datasource()
    assert (source["type"], source["uid"], source["access"]) == ("prometheus", "metricvault",
                                                                 "proxy")  # fmt: skip
    json_data = source["jsonData"]
    assert json_data["httpMethod"] == "POST"
    assert json_data["prometheusType"] == "Prometheus"
    assert json_data["prometheusVersion"] == PROMETHEUS_COMPATIBLE_VERSION  # buildinfo's answer
    assert source["url"] == "${METRICVAULT_URL}"
    assert json_data["httpHeaderName1"] == "Authorization"
    assert source["secureJsonData"]["httpHeaderValue1"] == "Bearer ${METRICVAULT_TOKEN}"
    providers = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "metricvault.yaml").read_text()
    )["providers"]
    assert [(p["type"], bool(p["options"]["path"])) for p in providers] == [("file", True)]


def test_the_four_dashboards_are_shipped() -> None:
    assert {p.stem for p in DASHBOARDS} == EXPECTED
    uids = [_board(p)["uid"] for p in DASHBOARDS]
    titles = [_board(p)["title"] for p in DASHBOARDS]
    assert len(set(uids)) == len(set(titles)) == len(DASHBOARDS)


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_dashboard_is_valid_grafana_json_on_the_provisioned_source(path: Path) -> None:
    board = _board(path)
    uid = _datasource()["uid"]
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert board["uid"] and len(board["uid"]) <= 40 and board["title"]
    assert board["time"]["from"].startswith("now-") and board["time"]["to"] == "now"
    panels = board["panels"]
    assert panels and len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        assert panel["type"] in {"timeseries", "stat", "table", "gauge", "bargauge"}
        assert panel["datasource"]["uid"] == uid, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs), panel["title"]
        for t in panel["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
    positions = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels}
    assert len(positions) == len(panels), "two panels in the same place"
    for var in board["templating"]["list"]:
        assert var["type"] == "query" and var["datasource"]["uid"] == uid, var["name"]
        assert re.fullmatch(r"label_values\((.+, *)?\w+\)", var["query"]["query"]), var["name"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_dashboard_queries_parse_and_read_series_the_project_produces(path: Path) -> None:
    board = _board(path)
    produced = _produced_names()
    queries = [t["expr"] for p in board["panels"] for t in p["targets"]]
    for var in board["templating"]["list"]:
        inner = re.fullmatch(r"label_values\((.+), *\w+\)", var["query"]["query"])
        if inner:
            queries.append(inner.group(1))
    names: set[str] = set()
    for expr in queries:
        try:
            names |= _metric_names(pp.parse(_substituted(expr)))
        except ValueError as exc:
            pytest.fail(f"{path.stem}: {expr!r} does not parse: {exc}")
    assert names
    unknown = [n for n in sorted(names) if n != "up"
               and re.sub(r"_(total|bucket|count|sum)$", "", n) not in produced]  # fmt: skip
    assert not unknown, f"{path.stem} reads series nothing in metricvault writes: {unknown}"
    uses = " ".join(queries)
    assert "$__rate_interval" in uses or "$__interval" in uses, "Grafana sizes windows with them"
