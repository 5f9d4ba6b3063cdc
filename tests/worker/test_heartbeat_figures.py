"""What a worker's heartbeat says of its engine for the console: the KV-cache use read from vLLM's gauge,
and its counters' totals, from real Prometheus registries."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from worker.metrics import KV_CACHE_USAGE, counted, kv_cache_usage


def test_kv_cache_use_is_the_fullest_engines_and_none_before_vllm_registers_it() -> None:
    registry = CollectorRegistry()
    assert kv_cache_usage(registry) is None  # a synthetic worker's: vLLM's stat logger never ran
    gauge = Gauge(KV_CACHE_USAGE, "KV-cache usage", ["model_name", "engine"], registry=registry)
    gauge.labels(model_name="smol", engine="0").set(0.25)
    gauge.labels(model_name="smol", engine="1").set(0.5)
    assert kv_cache_usage(registry) == 0.5


def test_a_counter_counts_what_it_was_given() -> None:
    tokens = Counter("streampool_generated_tokens", "tokens", registry=CollectorRegistry())
    assert counted(tokens) == 0
    tokens.inc(5)
    tokens.inc(3)
    assert counted(tokens) == 8
