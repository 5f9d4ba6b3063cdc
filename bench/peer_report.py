"""Sections 7 and 7b of bench/RESULTS.md, and their targets: streampool beside vLLM's own server, the mean
of vLLM's two runs (before streampool and after it) against streampool's."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.formats import verdict
from bench.peer_figures import PeerLevel, SideBySide

CHAT_ROW = ""
"""How the targets of the row of vLLM's benchmark client (section 7) begin: as they always have."""
GENERATE_ROW = "tokens in, tokens out (`/inference/v1/generate`): "
"""How the targets of the row of `/inference/v1/generate` (section 7b) begin."""
ITL_TAIL_RATIO = 1.5
PEER_HEADING = "## 7. streampool beside vLLM's own server, vLLM's benchmark client on both"
GENERATE_HEADING = "## 7b. Tokens in, tokens out beside vLLM's own server (`/inference/v1/generate`)"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class PeerComparison:
    """One concurrency level: vLLM's server (the mean of its runs) against streampool, latencies in ms."""

    concurrency: int
    vllm_runs: list[PeerLevel]
    streampool: PeerLevel

    def vllm(self, name: str) -> float:
        return _mean([getattr(level, name) for level in self.vllm_runs])

    def ratio(self, name: str) -> float:
        return float(getattr(self.streampool, name)) / self.vllm(name)

    def throughput_met(self) -> bool:
        return self.ratio("output_tokens_per_second") >= 0.97

    def itl_met(self) -> bool:
        return self.ratio("itl_p50") <= 1.03

    def itl_tail_met(self) -> bool:
        """Within 1.5x under load (at one request at a time there is no neighbour to stall a stream)."""
        return self.concurrency == 1 or self.ratio("itl_p99") <= ITL_TAIL_RATIO

    def ttft_met(self) -> bool:
        """Within 10 ms at one request at a time, within 10 % under load."""
        if self.concurrency == 1:
            return self.streampool.ttft_p50 - self.vllm("ttft_p50") <= 10
        return self.ratio("ttft_p50") <= 1.10


def _comparisons(row: SideBySide | None) -> list[PeerComparison]:
    if row is None or not row.vllm:
        return []
    return [
        PeerComparison(level.concurrency, [run.levels[index] for run in row.vllm], level)
        for index, level in enumerate(row.streampool.levels)
    ]


def _table(row: SideBySide) -> list[str]:
    lines = [
        "| concurrency | requests done / failed, vLLM (runs) / streampool | output tok/s vLLM (runs) "
        "| output tok/s streampool | ratio | TTFT p50 vLLM / streampool (diff), ms "
        "| TTFT p99 vLLM / streampool, ms | ITL p50 vLLM / streampool (ratio), ms "
        "| ITL p99 vLLM / streampool, ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in _comparisons(row):
        runs = " / ".join(f"{level.output_tokens_per_second:.1f}" for level in c.vllm_runs)
        counts = " / ".join(f"{level.completed}-{level.failed}" for level in [*c.vllm_runs, c.streampool])
        sp = c.streampool
        lines.append(
            f"| {c.concurrency} | {counts} | {c.vllm('output_tokens_per_second'):.1f} ({runs}) "
            f"| {sp.output_tokens_per_second:.1f} | {c.ratio('output_tokens_per_second'):.3f} "
            f"| {c.vllm('ttft_p50'):.1f} / {sp.ttft_p50:.1f} ({sp.ttft_p50 - c.vllm('ttft_p50'):+.1f}) "
            f"| {c.vllm('ttft_p99'):.1f} / {sp.ttft_p99:.1f} "
            f"| {c.vllm('itl_p50'):.2f} / {sp.itl_p50:.2f} ({c.ratio('itl_p50'):.3f}) "
            f"| {c.vllm('itl_p99'):.2f} / {sp.itl_p99:.2f} |"
        )
    return lines


def _target_labels(label: str, section: str) -> list[str]:
    return [
        f"{label}output tokens/s streampool / vLLM's server >= 0.97 at 1, 8, 32 requests (section {section})",
        f"{label}ITL p50 streampool / vLLM's server <= 1.03",
        f"{label}TTFT p50 streampool minus vLLM's server <= 10 ms at 1, ratio <= 1.10 at 8 and 32",
        f"{label}ITL p99 streampool / vLLM's server <= {ITL_TAIL_RATIO} at 8 and 32",
    ]


def targets(row: SideBySide | None, label: str, section: str) -> list[str]:
    """The four targets of one row beside vLLM's server, the same for every route."""
    comparisons = _comparisons(row)
    labels = _target_labels(label, section)
    if not comparisons:
        return [f"| {labels[0]} | not run | **missed** |"]
    tps = ", ".join(f"{c.concurrency}: {c.ratio('output_tokens_per_second'):.3f}" for c in comparisons)
    itl = ", ".join(f"{c.concurrency}: {c.ratio('itl_p50'):.3f}" for c in comparisons)
    tail = ", ".join(f"{c.concurrency}: {c.ratio('itl_p99'):.3f}" for c in comparisons if c.concurrency > 1)
    ttft = ", ".join(
        f"{c.concurrency}: {c.streampool.ttft_p50 - c.vllm('ttft_p50'):+.1f} ms"
        + ("" if c.concurrency == 1 else f" ({c.ratio('ttft_p50'):.3f})")
        for c in comparisons
    )
    return [
        f"| {labels[0]} | {tps} | {verdict(all(c.throughput_met() for c in comparisons))} |",
        f"| {labels[1]} | {itl} | {verdict(all(c.itl_met() for c in comparisons))} |",
        f"| {labels[2]} | {ttft} | {verdict(all(c.ttft_met() for c in comparisons))} |",
        f"| {labels[3]} | {tail} | {verdict(all(c.itl_tail_met() for c in comparisons))} |",
    ]


def peer_section(row: SideBySide) -> list[str]:
    """Section 7, from a run of `make bench` or of `python -m bench.run --only-completions`."""
    return [
        PEER_HEADING,
        "",
        f"Measured by `{row.command}` ({row.mode} mode). vLLM's server (`python -m"
        " vllm.entrypoints.openai.api_server`, the worker's engine arguments and `--enable-scale-out`), then"
        " streampool (gateway, Redis, worker), then vLLM's server again: one engine alive at a time. The"
        " client is `vllm.benchmarks.serve` unchanged: `openai` backend on /v1/completions, random dataset"
        f" (seed 0) of {row.input_len}-token prompts, {row.output_len} output tokens each"
        " (`ignore_eos`), temperature 0, one warm-up request per level. vLLM's figures are the mean of its"
        " two runs (each run in brackets; their gap is the machine's drift). Done-failed counts per side.",
        "",
        *_table(row),
        "",
    ]


def generate_section(row: SideBySide) -> list[str]:
    """Section 7b, from a run of `make bench` or of `python -m bench.run --only-generate`."""
    return [
        GENERATE_HEADING,
        "",
        f"Measured by `{row.command}` ({row.mode} mode). The same arrangement as section 7 (vLLM's"
        " server, streampool, vLLM's server again; in `make bench`, right after section 7's client on the"
        " same servers),"
        " with `bench/generate_client.py` on both sides, as vLLM's benchmark client has no backend for this"
        f" route: streamed requests of {row.input_len} random token ids from the model's"
        f" vocabulary (seed 0), {row.output_len} output tokens each (`ignore_eos`), temperature 0,"
        " one warm-up request per level. TTFT to the first chunk with token ids; ITL is each later"
        " chunk's gap spread over its tokens (a chunk without tokens, such as one that only ends a"
        " choice, is no gap); percentiles are nearest-rank. Done-failed counts per side.",
        "",
        *_table(row),
        "",
    ]
