"""deploy/grafana/streampool.json: a dashboard that queries exactly the metrics streampool exports."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.deploy.manifests import METRICS, REPO, metrics_in

DASHBOARD: dict[str, Any] = json.loads((REPO / "deploy" / "grafana" / "streampool.json").read_text())
PANELS = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
EXPRESSIONS = [target["expr"] for panel in PANELS for target in panel["targets"]]
HISTOGRAMS = {name for name in METRICS if name.endswith("_seconds")}
QUANTILE = re.compile(r"histogram_quantile\((0\.\d+), sum by \(le\) \(rate\((\w+)\[.+\]\)\)\)")


def test_dashboard_queries_only_contract_metrics() -> None:
    queried = set().union(*(metrics_in(expr) for expr in EXPRESSIONS))
    assert queried - METRICS == set()


def test_dashboard_shows_every_contract_metric() -> None:
    queried = set().union(*(metrics_in(expr) for expr in EXPRESSIONS))
    assert METRICS - queried == set()


def test_every_expression_names_a_streampool_metric() -> None:
    assert all(metrics_in(expr) for expr in EXPRESSIONS)


def test_latency_histograms_show_p50_and_p99_by_bucket() -> None:
    for histogram in HISTOGRAMS:
        quantiles = set()
        for expr in EXPRESSIONS:
            if f"{histogram}_bucket" in expr:
                match = QUANTILE.fullmatch(expr)
                assert match and match.group(2) == f"{histogram}_bucket", expr
                quantiles.add(match.group(1))
        assert {"0.5", "0.99"} <= quantiles, histogram


def test_http_errors_are_split_into_4xx_and_5xx() -> None:
    http = [expr for expr in EXPRESSIONS if "streampool_http_requests_total" in expr]
    assert any('status=~"4.."' in expr for expr in http)
    assert any('status=~"5.."' in expr for expr in http)


def test_panels_use_the_datasource_variable_and_do_not_overlap() -> None:
    [variable] = DASHBOARD["templating"]["list"]
    assert variable["name"] == variable["type"] == "datasource"
    assert variable["query"] == "prometheus"
    cells: set[tuple[int, int]] = set()
    for panel in DASHBOARD["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        columns = range(grid["x"], grid["x"] + grid["w"])
        area = {(x, y) for x in columns for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not area & cells, panel["title"]
        cells |= area
    assert len({panel["id"] for panel in DASHBOARD["panels"]}) == len(DASHBOARD["panels"])
