"""Sections 1 to 3, 5 and 6 of bench/RESULTS.md, and their targets: the phases on the real engine, one
gateway and one worker against the same engine in-process."""

from __future__ import annotations

import math

from bench.engine_figures import MAX_TOKENS, SHORT_PROMPTS
from bench.formats import ms, verdict
from bench.results_figures import Results
from bench.stats import percentile


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _in_process_ttft(results: Results) -> list[float]:
    return [ttft for run in results.in_process for ttft in run.first_tokens]


def _rate_ratios(results: Results) -> list[float]:
    """Tokens/s of the full path over the in-process runs' mean, level by level."""
    return [
        level.tokens_per_second / _mean([run.levels[index].tokens_per_second for run in results.in_process])
        for index, level in enumerate(results.full_path)
    ]


def targets(results: Results) -> list[str]:
    """The rows of the phases on the real engine in the targets' table."""
    ratios = _rate_ratios(results)
    levels = [s.concurrency for s in results.full_path]
    in_process, full = _in_process_ttft(results), [sample.ttft for sample in results.first_tokens]
    added50 = percentile(full, 50) - percentile(in_process, 50)
    added99 = percentile(full, 99) - percentile(in_process, 99)
    pickup50, pickup99 = percentile(results.pickup, 50), percentile(results.pickup, 99)
    steps = [c.steps_after_accepted for c in results.cancels]
    cancel_ms = [c.seconds_to_cancelled_event for c in results.cancels]
    ratio_text = ", ".join(f"{c}: {r:.3f}" for c, r in zip(levels, ratios, strict=False))
    ttft_text = (
        f"p50 {1000 * added50:+.2f} ms, p99 {1000 * added99:+.2f} ms "
        f"({len(results.first_tokens)} jobs full path, {len(in_process)} in-process)"
    )
    rtt = ", ".join(f"{c.jobs} jobs: {c.round_trips_per_step:.2f}" for c in results.step_costs)
    return [
        f"| tokens/s full / in-process >= 0.97 at 1-32 streams | {ratio_text} "
        f"| {verdict(bool(ratios) and min(ratios) >= 0.97)} |",
        f"| TTFT added p50 <= 5 ms, p99 <= 20 ms, at 1 stream (section 2) "
        f"| {ttft_text} | {verdict(added50 <= 0.005 and added99 <= 0.020)} |",
        f"| queue pickup p99 <= 10 ms | p50 {ms(pickup50)} ms, p99 {ms(pickup99)} ms "
        f"| {verdict(pickup99 <= 0.010)} |",
        f"| cancel to engine abort <= 2 decoding steps | max {max(steps, default=-1)} steps, "
        f"p50 {percentile(steps, 50)}; {ms(percentile(cancel_ms, 50))} / {ms(percentile(cancel_ms, 99))} ms "
        f"p50/p99 to the `cancelled` event | {verdict(0 <= max(steps, default=-1) <= 2)} |",
        f"| Redis round trips per engine step per worker = 1 | {rtt} "
        f"| {verdict(all(c.round_trips_per_step <= 1.05 for c in results.step_costs))} |",
    ]


def _throughput_table(results: Results) -> list[str]:
    """In-process figures are the mean of its runs (tokens/s shown for each run too)."""
    lines = [
        "| streams | in-process tok/s (runs) | full path tok/s | ratio | TTFT p50 in-proc / full (added), ms "
        "| TTFT p99 in-proc / full (added), ms | ITL p50 in-proc / full, ms | ITL p99 in-proc / full, ms "
        "| client CPU % in-proc / full |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for index, b in enumerate(results.full_path):
        runs = [run.levels[index] for run in results.in_process]
        rate = _mean([a.tokens_per_second for a in runs])
        ttft50, ttft99 = _mean([a.ttft_p50 for a in runs]), _mean([a.ttft_p99 for a in runs])
        lines.append(
            f"| {b.concurrency} | {rate:.1f} ({' / '.join(f'{a.tokens_per_second:.1f}' for a in runs)}) "
            f"| {b.tokens_per_second:.1f} | {b.tokens_per_second / rate:.3f} "
            f"| {ms(ttft50)} / {ms(b.ttft_p50)} ({ms(b.ttft_p50 - ttft50)}) "
            f"| {ms(ttft99)} / {ms(b.ttft_p99)} ({ms(b.ttft_p99 - ttft99)}) "
            f"| {ms(_mean([a.itl_p50 for a in runs]))} / {ms(b.itl_p50)} "
            f"| {ms(_mean([a.itl_p99 for a in runs]))} / {ms(b.itl_p99)} "
            f"| {_mean([a.client_cpu_percent for a in runs]):.0f} / {b.client_cpu_percent:.0f} |"
        )
    return lines


FIRST_TOKEN_PARTS = (
    ("client before its POST to the gateway's `created_at` (HTTP, validation, prompt count)", "to_record"),
    ("`created_at` to the worker's `started_at` (the queue)", "pickup"),
    ("`started_at` to the first delta's append (start script, render, engine, publish)", "to_append"),
    ("the append to the client's receipt (relay; stream ids have 1 ms resolution)", "relay"),
)


def _first_token_tables(results: Results) -> list[str]:
    in_process, full = _in_process_ttft(results), [sample.ttft for sample in results.first_tokens]
    quantiles = (50, 90, 99)
    lines = [
        "| side | jobs | " + " | ".join(f"TTFT p{q}, ms" for q in quantiles) + " |",
        "| --- | --- | " + " | ".join("---" for _ in quantiles) + " |",
        f"| in-process (both runs) | {len(in_process)} | "
        + " | ".join(ms(percentile(in_process, q)) for q in quantiles)
        + " |",
        f"| full path | {len(full)} | " + " | ".join(ms(percentile(full, q)) for q in quantiles) + " |",
        "| added (full minus in-process) | | "
        + " | ".join(ms(percentile(full, q) - percentile(in_process, q)) for q in quantiles)
        + " |",
        "",
        "Where the full path's first token went (each part's own percentiles; they need not add up):",
        "",
        "| part | p50, ms | p99, ms |",
        "| --- | --- | --- |",
    ]
    for label, name in FIRST_TOKEN_PARTS:
        values = [getattr(sample, name) for sample in results.first_tokens]
        lines.append(f"| {label} | {ms(percentile(values, 50))} | {ms(percentile(values, 99))} |")
    to_append = [sample.to_append for sample in results.first_tokens]
    lines.append(
        "| the worker's own share: `started_at` to the append, minus the in-process TTFT (p50s) "
        f"| {ms(percentile(to_append, 50) - percentile(in_process, 50))} | |"
    )
    return lines


def _step_costs(results: Results) -> list[str]:
    lines = [
        "| running jobs | engine steps | round trips | round trips/step | XADD/step | EXISTS/step "
        "| EVAL (finish) | all commands/step | all commands in the window |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in results.step_costs:
        top = ", ".join(f"{name} {count}" for name, count in sorted(c.calls.items(), key=lambda i: -i[1])[:8])
        lines.append(
            f"| {c.jobs} | {c.steps} | {c.round_trips} | {c.round_trips_per_step:.2f} "
            f"| {c.per_step('xadd'):.2f} "
            f"| {c.per_step('exists'):.2f} | {c.calls.get('eval', 0)} | {c.all_per_step:.1f} | {top} |"
        )
    return lines


def first_sections(results: Results) -> list[str]:
    """Sections 1 to 3: throughput, time to first token, queue pickup."""
    return [
        f"## 1. Engine in-process vs full path (max_tokens {results.max_tokens}, temperature 0, seed fixed)",
        "",
        "Tokens are counted from token_ids (in-process) and from the terminal event's usage (full path).",
        "The full path's clock starts before the HTTP submission; in-process it starts before rendering.",
        "Jobs per side and level (each in-process run, and the full path): "
        + ", ".join(f"{level.streams} at {level.concurrency}" for level in results.full_path)
        + ".",
        "",
        *_throughput_table(results),
        "",
        "![throughput](throughput.png)",
        "",
        f"## 2. Time to first token at 1 stream (max_tokens {MAX_TOKENS}, jobs one at a time)",
        "",
        f"Short greedy prompts ({', '.join(repr(p) for p in SHORT_PROMPTS)}), the same on both"
        " sides. Each full-path job is one `POST /v1/jobs` with `Accept: text/event-stream` (submit and"
        " follow in one request), from a raw-socket client on one kept-alive connection.",
        "",
        *_first_token_tables(results),
        "",
        "## 3. Queue pickup (enqueue to worker start)",
        "",
        f"{len(results.pickup)} jobs of max_tokens 1, one every 20 ms over HTTP; created_at (gateway, before",
        "its submit script) to started_at (worker, before its start script): time.time() of one machine.",
        "",
        f"p50 {ms(percentile(results.pickup, 50))} ms, p99 {ms(percentile(results.pickup, 99))} ms, "
        f"max {ms(max(results.pickup, default=math.nan))} ms.",
        "",
    ]


def later_sections(results: Results) -> list[str]:
    """Sections 5 and 6: cancel latency, Redis commands per engine step."""
    cancel_rows = [
        f"| {n + 1} | {ms(c.seconds_to_cancelled_event)} | {c.steps_after_accepted} "
        f"| {c.steps_after_published} |"
        for n, c in enumerate(results.cancels)
    ]
    return [
        "## 5. Cancel latency",
        "",
        "| job | cancel POST to `cancelled` event, ms | steps after the cancel returned (client view) "
        "| steps after it returned (stream view) |",
        "| --- | --- | --- | --- |",
        *cancel_rows,
        "",
        "## 6. Redis commands and round trips per engine step, one worker",
        "",
        *_step_costs(results),
        "",
    ]
