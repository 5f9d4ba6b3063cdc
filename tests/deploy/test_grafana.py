"""deploy/grafana/streampool.json: a dashboard that queries exactly the metrics streampool exports, and
vLLM's own series that the installed vLLM registers (a worker's metrics port serves both)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from tests.deploy.manifests import METRICS, REPO, metrics_in

DASHBOARD: dict[str, Any] = json.loads((REPO / "deploy" / "grafana" / "streampool.json").read_text())
PANELS = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
EXPRESSIONS = [target["expr"] for panel in PANELS for target in panel["targets"]]
HISTOGRAMS = {name for name in METRICS if name.endswith("_seconds")}
QUANTILE = re.compile(r"histogram_quantile\((0\.\d+), sum by \(le\) \(rate\(([\w:]+)\[.+\]\)\)\)")
VLLM_SERIES = re.compile(r"\bvllm:[a-z0-9_]+")
# A counter is registered without `_total`, a histogram without its series' suffix.
VLLM_SUFFIX = re.compile(r"_(total|bucket|sum|count)$")
# The engine panels and the series they read; the real engine's test checks a worker serves each.
ENGINE_PANELS = {
    "KV cache use": {"vllm:kv_cache_usage_perc"},
    "Engine requests waiting and running": {"vllm:num_requests_waiting", "vllm:num_requests_running"},
    "Prefix-cache hit rate": {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
    "Engine time to first token": {"vllm:time_to_first_token_seconds_bucket"},
    "Engine inter-token latency": {"vllm:inter_token_latency_seconds_bucket"},
    "Engine tokens": {"vllm:prompt_tokens_total", "vllm:generation_tokens_total"},
}
DASHBOARD_VLLM_SERIES = set().union(*ENGINE_PANELS.values())


def vllm_registered_names() -> set[str]:
    """The metric names vLLM's stat loggers register, read from the installed vLLM's source: importing
    vLLM to build its Prometheus logger takes a whole engine configuration."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    metrics = Path(next(iter(spec.submodule_search_locations))) / "v1" / "metrics"
    source = "".join(path.read_text() for path in metrics.glob("*.py"))
    return set(re.findall(r"name=\"(vllm:[a-z0-9_]+)\"", source))


def test_dashboard_queries_only_contract_metrics() -> None:
    queried = set().union(*(metrics_in(expr) for expr in EXPRESSIONS))
    assert queried - METRICS == set()


def test_dashboard_shows_every_contract_metric() -> None:
    queried = set().union(*(metrics_in(expr) for expr in EXPRESSIONS))
    assert METRICS - queried == set()


def test_every_expression_names_a_streampool_or_a_vllm_metric() -> None:
    assert all(metrics_in(expr) or VLLM_SERIES.search(expr) for expr in EXPRESSIONS)


def test_engine_panels_read_their_vllm_series() -> None:
    read = {
        panel["title"]: {m for t in panel["targets"] for m in VLLM_SERIES.findall(t["expr"])}
        for panel in PANELS
    }
    assert {title: read.get(title) for title in ENGINE_PANELS} == ENGINE_PANELS
    assert set().union(*read.values()) == DASHBOARD_VLLM_SERIES


def test_engine_panels_query_series_the_installed_vllm_registers() -> None:
    registered = vllm_registered_names()
    assert {"vllm:generation_tokens", "vllm:time_to_first_token_seconds"} <= registered  # the reading works
    assert {VLLM_SUFFIX.sub("", series) for series in DASHBOARD_VLLM_SERIES} - registered == set()


def test_engine_latency_histograms_show_p50_and_p99_by_bucket() -> None:
    for series in ("vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket"):
        matches = [QUANTILE.fullmatch(expr) for expr in EXPRESSIONS if series in expr]
        assert all(match and match.group(2) == series for match in matches), series
        assert {"0.5", "0.99"} <= {match.group(1) for match in matches if match}, series


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
