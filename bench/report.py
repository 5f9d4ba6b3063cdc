"""bench/RESULTS.md, its plots and results.json from one run's figures."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import first_token, fleet_cluster_report, fleet_report
from bench.cancel import CancelSample
from bench.commands import StepCost
from bench.engine_baseline import EngineRun
from bench.first_token import FirstToken
from bench.peer import PeerLevel, PeerRun
from bench.redis_probe import Ceiling
from bench.relay_load import RelayLevel
from bench.stats import PhaseSummary, percentile

if TYPE_CHECKING:  # bench.fair_share writes its figures here when run alone (`write_fair_share`)
    from bench.fair_share import FairShare
    from bench.fleet_figures import FleetRun

FAIR_SHARE_TARGET = 0.90
"""Jobs started per second with tenants, at least this share of the single queue's (issue 21)."""
FAIR_SHARE_HEADING = "## 8. Fair sharing among tenants"
HAND_WRITTEN = "**Written by hand"
"""How a paragraph written by hand under a generated section begins: `write_fair_share` keeps it."""


@dataclass
class Results:
    """Everything one run measured, in the order the phases ran."""

    command: str
    mode: str
    machine: dict[str, str]
    max_tokens: int
    in_process: list[EngineRun] = field(default_factory=list)  # before the system, and after it
    full_path: list[PhaseSummary] = field(default_factory=list)
    first_tokens: list[FirstToken] = field(default_factory=list)
    pickup: list[float] = field(default_factory=list)
    fair_share: FairShare | None = None
    cancels: list[CancelSample] = field(default_factory=list)
    step_costs: list[StepCost] = field(default_factory=list)
    ceilings: list[Ceiling] = field(default_factory=list)
    relay: list[RelayLevel] = field(default_factory=list)
    peer_vllm: list[PeerRun] = field(default_factory=list)  # vLLM's server, before streampool and after it
    peer_streampool: PeerRun | None = None
    peer_input_len: int = 0
    peer_output_len: int = 0
    generate_vllm: list[PeerRun] = field(default_factory=list)  # /inference/v1/generate, as peer_vllm
    generate_streampool: PeerRun | None = None
    fleet: FleetRun | None = None
    minutes: float = 0.0


def _ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def _verdict(met: bool) -> str:
    return "**met**" if met else "**missed**"


def _in_process_rates(results: Results) -> list[list[float]]:
    """Tokens/s of each level in each in-process run."""
    return [[level.tokens_per_second for level in run.levels] for run in results.in_process]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _in_process_ttft(results: Results) -> list[float]:
    return [ttft for run in results.in_process for ttft in run.first_tokens]


def _plots(results: Results, out: Path) -> list[str]:
    # Imported here: only a benchmark run draws (matplotlib is the `bench` extra), while the report's
    # text is also rendered by the tests.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    figure, axis = plt.subplots(figsize=(6, 4))
    sides = [(f"in-process engine, run {n + 1}", run.levels) for n, run in enumerate(results.in_process)]
    for label, summaries in [*sides, ("full path", results.full_path)]:
        rates = [s.tokens_per_second for s in summaries]
        axis.plot([s.concurrency for s in summaries], rates, "o-", label=label)
    axis.set(xscale="log", xlabel="concurrent streams", ylabel="tokens/s", title="Throughput")
    axis.legend()
    figure.savefig(out / "throughput.png", dpi=100, bbox_inches="tight")
    names.append("throughput.png")
    figure, axis = plt.subplots(figsize=(6, 4))
    for level in results.relay:
        lags = sorted(level.lags)
        if lags:
            share = [(n + 1) / len(lags) for n in range(len(lags))]
            axis.plot([lag * 1000 for lag in lags], share, label=f"{level.streams} streams")
    axis.axvline(20, color="grey", linestyle="--", label="20 ms target")
    axis.set(xscale="log", xlabel="relay lag, ms (XADD to client receipt)", ylabel="share of events")
    axis.set_title("Relay lag CDF, one gateway, 10 events/s per stream")
    axis.legend()
    figure.savefig(out / "relay_lag_cdf.png", dpi=100, bbox_inches="tight")
    names.append("relay_lag_cdf.png")
    plt.close("all")
    return names


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
            f"| {_ms(ttft50)} / {_ms(b.ttft_p50)} ({_ms(b.ttft_p50 - ttft50)}) "
            f"| {_ms(ttft99)} / {_ms(b.ttft_p99)} ({_ms(b.ttft_p99 - ttft99)}) "
            f"| {_ms(_mean([a.itl_p50 for a in runs]))} / {_ms(b.itl_p50)} "
            f"| {_ms(_mean([a.itl_p99 for a in runs]))} / {_ms(b.itl_p99)} "
            f"| {_mean([a.client_cpu_percent for a in runs]):.0f} / {b.client_cpu_percent:.0f} |"
        )
    return lines


@dataclass(frozen=True)
class PeerComparison:
    """One concurrency level of vLLM's benchmark client: vLLM's server (the mean of its runs) against
    streampool, latencies in ms."""

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


def _peer_comparisons(vllm_runs: list[PeerRun], streampool: PeerRun | None) -> list[PeerComparison]:
    if streampool is None or not vllm_runs:
        return []
    return [
        PeerComparison(level.concurrency, [run.levels[index] for run in vllm_runs], level)
        for index, level in enumerate(streampool.levels)
    ]


def _peer_table(vllm_runs: list[PeerRun], streampool: PeerRun | None) -> list[str]:
    lines = [
        "| concurrency | requests done / failed, vLLM (runs) / streampool | output tok/s vLLM (runs) "
        "| output tok/s streampool | ratio | TTFT p50 vLLM / streampool (diff), ms "
        "| TTFT p99 vLLM / streampool, ms | ITL p50 vLLM / streampool (ratio), ms "
        "| ITL p99 vLLM / streampool, ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in _peer_comparisons(vllm_runs, streampool):
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


CHAT_ROW = ""
"""How the targets of the row of vLLM's benchmark client (section 7) begin: as they always have."""
GENERATE_ROW = "tokens in, tokens out (`/inference/v1/generate`): "
"""How the targets of the row of `/inference/v1/generate` (section 7b) begin."""
ITL_TAIL_RATIO = 1.5


def _peer_targets(vllm_runs: list[PeerRun], streampool: PeerRun | None, row: str, section: str) -> list[str]:
    """The three targets of one row beside vLLM's server, the same for every route."""
    comparisons = _peer_comparisons(vllm_runs, streampool)
    labels = _peer_target_labels(row, section)
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
        f"| {labels[0]} | {tps} | {_verdict(all(c.throughput_met() for c in comparisons))} |",
        f"| {labels[1]} | {itl} | {_verdict(all(c.itl_met() for c in comparisons))} |",
        f"| {labels[2]} | {ttft} | {_verdict(all(c.ttft_met() for c in comparisons))} |",
        f"| {labels[3]} | {tail} | {_verdict(all(c.itl_tail_met() for c in comparisons))} |",
    ]


def _peer_target_labels(row: str, section: str) -> list[str]:
    return [
        f"{row}output tokens/s streampool / vLLM's server >= 0.97 at 1, 8, 32 requests (section {section})",
        f"{row}ITL p50 streampool / vLLM's server <= 1.03",
        f"{row}TTFT p50 streampool minus vLLM's server <= 10 ms at 1, ratio <= 1.10 at 8 and 32",
        f"{row}ITL p99 streampool / vLLM's server <= {ITL_TAIL_RATIO} at 8 and 32",
    ]


PEER_HEADING = "## 7. streampool beside vLLM's own server, vLLM's benchmark client on both"


def peer_section(results: Results) -> list[str]:
    """Section 7, from a run of `make bench` or of `python -m bench.run --only-completions`."""
    return [
        PEER_HEADING,
        "",
        f"Measured by `{results.command}` ({results.mode} mode). vLLM's server (`python -m"
        " vllm.entrypoints.openai.api_server`, the worker's engine arguments and `--enable-scale-out`), then"
        " streampool (gateway, Redis, worker), then vLLM's server again: one engine alive at a time. The"
        " client is `vllm.benchmarks.serve` unchanged: `openai` backend on /v1/completions, random dataset"
        f" (seed 0) of {results.peer_input_len}-token prompts, {results.peer_output_len} output tokens each"
        " (`ignore_eos`), temperature 0, one warm-up request per level. vLLM's figures are the mean of its"
        " two runs (each run in brackets; their gap is the machine's drift). Done-failed counts per side.",
        "",
        *_peer_table(results.peer_vllm, results.peer_streampool),
        "",
    ]


GENERATE_HEADING = "## 7b. Tokens in, tokens out beside vLLM's own server (`/inference/v1/generate`)"


def generate_section(results: Results) -> list[str]:
    """Section 7b, from a run of `make bench` or of `python -m bench.run --only-generate`."""
    if results.generate_streampool is None:
        return [GENERATE_HEADING, "", "Not measured in this run.", ""]
    return [
        GENERATE_HEADING,
        "",
        f"Measured by `{results.command}` ({results.mode} mode). The same arrangement as section 7 (vLLM's"
        " server, streampool, vLLM's server again; in `make bench`, right after section 7's client on the"
        " same servers),"
        " with `bench/generate_client.py` on both sides, as vLLM's benchmark client has no backend for this"
        f" route: streamed requests of {results.peer_input_len} random token ids from the model's"
        f" vocabulary (seed 0), {results.peer_output_len} output tokens each (`ignore_eos`), temperature 0,"
        " one warm-up request per level. TTFT to the first chunk with token ids; ITL is each later"
        " chunk's gap spread over its tokens (a chunk without tokens, such as one that only ends a"
        " choice, is no gap); percentiles are nearest-rank. Done-failed counts per side.",
        "",
        *_peer_table(results.generate_vllm, results.generate_streampool),
        "",
    ]


def write_side_by_side(results: Results, out: Path, row: str) -> Path:
    """Put a run of one row beside vLLM's server alone (`row`: "completions", vLLM's benchmark client on
    /v1/completions, or "generate", `/inference/v1/generate`) into results.json and RESULTS.md (its
    section and targets) in place, as `write_fair_share` does; answers RESULTS.md's path."""
    raw_path, path = out / "results.json", out / "RESULTS.md"
    raw = json.loads(raw_path.read_text())
    if row == "completions":
        name, vllm_runs, streampool = "peer", results.peer_vllm, results.peer_streampool
        section, before, label, number = peer_section(results), GENERATE_HEADING, CHAT_ROW, "7"
    else:
        name, vllm_runs, streampool = "generate", results.generate_vllm, results.generate_streampool
        section, before, label, number = generate_section(results), FAIR_SHARE_HEADING, GENERATE_ROW, "7b"
    raw[f"{name}_vllm"] = [dataclasses.asdict(run) for run in vllm_runs]
    raw[f"{name}_streampool"] = dataclasses.asdict(streampool or PeerRun(""))
    raw_path.write_text(json.dumps(raw, indent=1, default=str))
    lines = _put_section(path.read_text().splitlines(), section, before)
    targets = _peer_targets(vllm_runs, streampool, label, number)
    for target, target_label in zip(targets, _peer_target_labels(label, number), strict=False):
        lines = _put_target(lines, target, target_label)
    path.write_text("\n".join(lines) + "\n")
    return path


FAIR_SHARE_TARGET_LABEL = (
    f"jobs started/s with tenants / single queue >= {FAIR_SHARE_TARGET:.2f} at 1, 10, 100 tenants (section 8)"
)


def _fair_share_target(fair: FairShare | None) -> str:
    if fair is None:
        return f"| {FAIR_SHARE_TARGET_LABEL} | not run | **missed** |"
    ratios = fair.ratios()
    text = ", ".join(f"{count}: {ratio:.3f}" for count, ratio in ratios.items())
    met = all(ratio >= FAIR_SHARE_TARGET for ratio in ratios.values())
    return f"| {FAIR_SHARE_TARGET_LABEL} | {text} | {_verdict(met)} |"


def fair_share_section(fair: FairShare | None) -> list[str]:
    """Section 8, from a run of `make bench` or of `python -m bench.fair_share` alone."""
    if fair is None:
        return [FAIR_SHARE_HEADING, "", "Not measured in this run.", ""]
    plan, ratios = fair.plan, fair.ratios()
    lines = [
        FAIR_SHARE_HEADING,
        "",
        f"Measured by `{fair.command}` ({fair.measured}), one worker (max_jobs {fair.max_jobs}). Tiny jobs"
        " (max_tokens 1, `workload.request`) submitted by `JobStore.submit` round-robin over the tenants"
        " (weight 1 each); with no tenant every job waits in the default share: the single queue of a"
        f" deployment without tenants. Burst: {plan.burst_jobs} jobs submitted while the worker's process"
        " is held (SIGSTOP), so that all of them wait in the queue when it resumes; jobs started per second"
        " are (N - 1) over the span of their `started_at`. Each figure is the median of"
        f" {plan.rounds} round(s) (each round's in brackets); a round runs every row once, each round"
        " beginning with the next row, after one warm-up burst. The first claim: the jobs the worker's"
        f" first claim takes as it resumes (up to {fair.max_jobs}), which start without waiting for the"
        " engine to end any; the rest start as jobs end. Pickup: "
        f"{plan.pickup_jobs} jobs one at a time, one every 20 ms, `created_at` to `started_at`, on an idle"
        " system (one job waits at a time: only its tenant's share has one).",
        "",
        "| tenants | jobs started/s (rounds) | ratio to no tenant | first claim's jobs started/s (rounds) "
        "| ratio | pickup p50, ms | pickup p99, ms | pickup max, ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    single = fair.single_queue.first_claim_per_second
    for run in fair.runs:
        rounds = " / ".join(f"{rate:.0f}" for rate in run.burst_rates)
        first = " / ".join(f"{rate:.0f}" for rate in run.first_rates)
        ratio = f"{ratios[run.tenants]:.3f}" if run.tenants in ratios else "1"
        lines.append(
            f"| {run.label} | {run.jobs_per_second:.0f} ({rounds}) | {ratio} "
            f"| {run.first_claim_per_second:.0f} ({first}) | {run.first_claim_per_second / single:.3f} "
            f"| {_ms(percentile(run.pickup, 50))} | {_ms(percentile(run.pickup, 99))} "
            f"| {_ms(max(run.pickup, default=math.nan))} |"
        )
    lines += [
        "",
        f"The claim script alone, without the engine, on the same Redis: {plan.claims} jobs queued across"
        " the tenants (by `JobStore.submit`, for a model no worker serves), then claimed one per call"
        f" (`wanted` 1, `read_limit` {fair.read_limit} as the worker passes it), each claimed job then"
        " taken off the queue as the start script takes it. Before fair sharing: `bench/fifo_claim.lua`,"
        " the claim script as it was (the due jobs read from the queue's head, up to `read_limit`, in"
        " submission order), on copies of the same queue: with the worker's `read_limit`, and with 1 (the"
        " head alone: the least a FIFO claim can read). Time per call as Redis counts it (INFO"
        " commandstats, EVALSHA: the script's own run; the idle worker's few calls in the same seconds"
        " count too), and the client's round trip.",
        "",
        f"| jobs queued across | claims | µs/claim before, read_limit {fair.read_limit} "
        "| µs/claim before, read_limit 1 | µs/claim fair sharing | fair / before (read_limit 1) "
        "| round trip p50 before / before (1) / fair, µs |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cost in fair.claims:
        fair_us = cost.fair.us
        lines.append(
            f"| {cost.label} | {cost.claims} | {cost.fifo.us:.1f} | {cost.fifo_head.us:.1f} "
            f"| {fair_us:.1f} | {fair_us / cost.fifo.us:.2f} ({fair_us / cost.fifo_head.us:.2f}) "
            f"| {cost.fifo.round_trip_us:.0f} / {cost.fifo_head.round_trip_us:.0f} "
            f"/ {cost.fair.round_trip_us:.0f} |"
        )
    return [*lines, ""]


def _put_section(lines: list[str], section: list[str], before: str = "## Notes") -> list[str]:
    """`lines` with `section` in place of the one under the same heading (up to the next heading, or to
    a paragraph written by hand, which stays), or else before the heading `before` (the notes')."""
    heading = section[0]
    if heading in lines:
        begins = lines.index(heading)
        ends = next(
            (
                index
                for index in range(begins + 1, len(lines))
                if lines[index].startswith(("## ", HAND_WRITTEN))
            ),
            len(lines),
        )
    else:
        begins = ends = lines.index(before) if before in lines else len(lines)
    return [*lines[:begins], *section, *lines[ends:]]


def _put_target(lines: list[str], row: str, label: str) -> list[str]:
    """`lines` with `row` in place of the Targets table's row of `label`, or else as its last row."""
    at = next((index for index, line in enumerate(lines) if line.startswith(f"| {label} |")), None)
    if at is not None:
        return [*lines[:at], row, *lines[at + 1 :]]
    table = lines.index("## Targets (DESIGN.md)") + 2
    end = next((index for index in range(table, len(lines)) if not lines[index].startswith("| ")), len(lines))
    return [*lines[:end], row, *lines[end:]]


def write_fair_share(fair: FairShare, out: Path) -> Path:
    """Put a run of `python -m bench.fair_share` alone into results.json (its `fair_share`) and RESULTS.md
    (section 8 and its target row) in place, leaving everything else as it is; answers RESULTS.md's path.

    Not through `write`: RESULTS.md's analysis is written by hand, and results.json keeps only the
    relay lags' percentiles (the lag CDF could not be drawn again), so regenerating would lose both."""
    raw_path, path = out / "results.json", out / "RESULTS.md"
    raw = json.loads(raw_path.read_text())
    raw["fair_share"] = dataclasses.asdict(fair)
    raw_path.write_text(json.dumps(raw, indent=1, default=str))
    lines = _put_section(path.read_text().splitlines(), fair_share_section(fair))
    lines = _put_target(lines, _fair_share_target(fair), FAIR_SHARE_TARGET_LABEL)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_section(section: list[str], name: str, measured: object, out: Path) -> Path:
    """Put a phase run alone (its `section` of RESULTS.md, and `measured`, a dataclass, as results.json's
    `name`) in place, leaving everything else as it is, as `write_fair_share` does; answers RESULTS.md's
    path."""
    raw_path, path = out / "results.json", out / "RESULTS.md"
    raw = json.loads(raw_path.read_text())
    raw[name] = dataclasses.asdict(measured)  # type: ignore[call-overload]
    raw_path.write_text(json.dumps(raw, indent=1, default=str))
    path.write_text("\n".join(_put_section(path.read_text().splitlines(), section)) + "\n")
    return path


def fleet_section(fleet: FleetRun | None) -> list[str]:
    if fleet is None:
        return [fleet_report.HEADING, "", "Not measured in this run.", ""]
    return fleet_report.section(fleet)


def write_fleet(fleet: FleetRun, out: Path) -> Path:
    """Put a run of `python -m bench.fleet` alone into results.json (its `fleet`) and RESULTS.md (its
    section) in place, as `write_fair_share` does; answers RESULTS.md's path."""
    raw_path, path = out / "results.json", out / "RESULTS.md"
    raw = json.loads(raw_path.read_text())
    raw["fleet"] = fleet_report.raw(fleet)
    raw_path.write_text(json.dumps(raw, indent=1, default=str))
    path.write_text("\n".join(_put_section(path.read_text().splitlines(), fleet_section(fleet))) + "\n")
    return path


def write_fleet_cluster(fleet: FleetRun, out: Path) -> Path:
    """Put a run of `python -m bench.fleet --masters ...` into results.json (its `fleet_cluster`) and
    RESULTS.md (its section, after section 9) in place, as `write_fleet` does; answers RESULTS.md's path."""
    raw_path, path = out / "results.json", out / "RESULTS.md"
    raw = json.loads(raw_path.read_text())
    raw["fleet_cluster"] = fleet_cluster_report.raw(fleet)
    raw_path.write_text(json.dumps(raw, indent=1, default=str))
    path.write_text(
        "\n".join(_put_section(path.read_text().splitlines(), fleet_cluster_report.section(fleet))) + "\n"
    )
    return path


def _first_token_tables(results: Results) -> list[str]:
    in_process, full = _in_process_ttft(results), [sample.ttft for sample in results.first_tokens]
    quantiles = (50, 90, 99)
    lines = [
        "| side | jobs | " + " | ".join(f"TTFT p{q}, ms" for q in quantiles) + " |",
        "| --- | --- | " + " | ".join("---" for _ in quantiles) + " |",
        f"| in-process (both runs) | {len(in_process)} | "
        + " | ".join(_ms(percentile(in_process, q)) for q in quantiles)
        + " |",
        f"| full path | {len(full)} | " + " | ".join(_ms(percentile(full, q)) for q in quantiles) + " |",
        "| added (full minus in-process) | | "
        + " | ".join(_ms(percentile(full, q) - percentile(in_process, q)) for q in quantiles)
        + " |",
        "",
        "Where the full path's first token went (each part's own percentiles; they need not add up):",
        "",
        "| part | p50, ms | p99, ms |",
        "| --- | --- | --- |",
    ]
    parts = (
        (
            "client before its POST to the gateway's `created_at` (HTTP, validation, prompt count)",
            "to_record",
        ),
        ("`created_at` to the worker's `started_at` (the queue)", "pickup"),
        ("`started_at` to the first delta's append (start script, render, engine, publish)", "to_append"),
        ("the append to the client's receipt (relay; stream ids have 1 ms resolution)", "relay"),
    )
    for label, name in parts:
        values = [getattr(sample, name) for sample in results.first_tokens]
        lines.append(f"| {label} | {_ms(percentile(values, 50))} | {_ms(percentile(values, 99))} |")
    to_append = [sample.to_append for sample in results.first_tokens]
    lines.append(
        "| the worker's own share: `started_at` to the append, minus the in-process TTFT (p50s) "
        f"| {_ms(percentile(to_append, 50) - percentile(in_process, 50))} | |"
    )
    return lines


def _relay_table(results: Results) -> list[str]:
    lines = [
        "| streams x 10/s | sent | delivered | delivered/s | lag p50 ms | lag p99 ms | lag max ms "
        "| gateway CPU % | Redis CPU % | clients CPU % | producer CPU % | gateway Redis conns "
        "| connected_clients delta | sustained |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results.relay:
        lines.append(
            f"| {r.streams} | {r.sent} | {r.received} ({r.failures} failed streams) "
            f"| {r.delivered_per_second:.0f} | {_ms(r.lag_p50)} | {_ms(r.lag_p99)} "
            f"| {_ms(max(r.lags, default=math.nan))} | {r.gateway_cpu_percent:.0f} "
            f"| {r.redis_cpu_percent:.0f} | {r.client_cpu_percent:.0f} | {r.producer_cpu_percent:.0f} "
            f"| {r.gateway_redis_connections} | {r.connected_clients_delta:+d} "
            f"| {'yes' if r.sustained else 'no'} |"
        )
    return lines


def write(results: Results, out: Path, extra_notes: list[str]) -> Path:
    """Write the plots, results.json and RESULTS.md under `out`; answers RESULTS.md's path."""
    plots = _plots(results, out)
    raw = dataclasses.asdict(results)
    for level in raw["relay"]:
        level["lags"] = {f"p{q}": percentile(level["lags"], q) for q in (50, 90, 99, 99.9, 100)}
    if results.fleet is not None:
        raw["fleet"] = fleet_report.raw(results.fleet)
    (out / "results.json").write_text(json.dumps(raw, indent=1, default=str))
    text = "\n".join(render(results, plots, extra_notes)) + "\n"
    path = out / "RESULTS.md"
    path.write_text(text)
    return path


def _facts(results: Results) -> dict[str, Any]:
    """The figures the targets are judged on."""
    rates = _in_process_rates(results)
    ratios = [
        b.tokens_per_second / _mean([run[index] for run in rates])
        for index, b in enumerate(results.full_path)
    ]
    in_process, full = _in_process_ttft(results), [sample.ttft for sample in results.first_tokens]
    at_1000 = next((r for r in results.relay if r.streams == 1000), None)
    sustained = [r for r in results.relay if r.sustained]
    steps = [c.steps_after_accepted for c in results.cancels]
    return {
        "ratios": ratios,
        "added50": percentile(full, 50) - percentile(in_process, 50),
        "added99": percentile(full, 99) - percentile(in_process, 99),
        "pickup_p50": percentile(results.pickup, 50),
        "pickup_p99": percentile(results.pickup, 99),
        "at_1000": at_1000,
        "best": max(sustained, key=lambda r: r.streams * r.rate, default=None),
        "cancel_steps_max": max(steps, default=-1),
        "cancel_steps_p50": percentile(steps, 50),
        "cancel_ms_p50": percentile([c.seconds_to_cancelled_event for c in results.cancels], 50),
        "cancel_ms_p99": percentile([c.seconds_to_cancelled_event for c in results.cancels], 99),
    }


def _targets(results: Results, facts: dict[str, Any]) -> list[str]:
    ratios, added50, added99 = facts["ratios"], facts["added50"], facts["added99"]
    levels = [s.concurrency for s in results.full_path]
    ratio_text = ", ".join(f"{c}: {r:.3f}" for c, r in zip(levels, ratios, strict=False))
    ttft_text = (
        f"p50 {1000 * added50:+.2f} ms, p99 {1000 * added99:+.2f} ms "
        f"({len(results.first_tokens)} jobs full path, {len(_in_process_ttft(results))} in-process)"
    )
    at_1000: RelayLevel | None = facts["at_1000"]
    best: RelayLevel | None = facts["best"]
    ceiling = ", ".join(f"P{c.pipeline}: {c.requests_per_second:,.0f}/s" for c in results.ceilings)
    relay_text = (
        f"p99 {_ms(at_1000.lag_p99)} ms, {at_1000.received}/{at_1000.sent} delivered"
        if at_1000
        else "not run (quick mode has no 1,000 level?)"
    )
    best_text = (
        f"{best.streams * best.rate:,.0f} events/s ({best.streams} streams)" if best else "no level sustained"
    )
    rtt = ", ".join(f"{c.jobs} jobs: {c.round_trips_per_step:.2f}" for c in results.step_costs)
    return [
        "| target | measured (this run) | verdict |",
        "| --- | --- | --- |",
        f"| tokens/s full / in-process >= 0.97 at 1-32 streams | {ratio_text} "
        f"| {_verdict(bool(ratios) and min(ratios) >= 0.97)} |",
        f"| TTFT added p50 <= 5 ms, p99 <= 20 ms, at 1 stream (section 2) "
        f"| {ttft_text} | {_verdict(added50 <= 0.005 and added99 <= 0.020)} |",
        f"| queue pickup p99 <= 10 ms | p50 {_ms(facts['pickup_p50'])} ms, p99 {_ms(facts['pickup_p99'])} ms "
        f"| {_verdict(facts['pickup_p99'] <= 0.010)} |",
        f"| relay lag p99 <= 20 ms, 1,000 SSE streams x 10/s, one gateway | {relay_text} "
        f"| {_verdict(at_1000 is not None and at_1000.sustained)} |",
        f"| highest rate one gateway sustains vs redis-benchmark XADD | {best_text} vs {ceiling} "
        "| (reported) |",
        f"| cancel to engine abort <= 2 decoding steps | max {facts['cancel_steps_max']} steps, "
        f"p50 {facts['cancel_steps_p50']}; {_ms(facts['cancel_ms_p50'])} / {_ms(facts['cancel_ms_p99'])} ms "
        f"p50/p99 to the `cancelled` event | {_verdict(0 <= facts['cancel_steps_max'] <= 2)} |",
        f"| Redis round trips per engine step per worker = 1 | {rtt} "
        f"| {_verdict(all(c.round_trips_per_step <= 1.05 for c in results.step_costs))} |",
        *_peer_targets(results.peer_vllm, results.peer_streampool, CHAT_ROW, "7"),
        *_peer_targets(results.generate_vllm, results.generate_streampool, GENERATE_ROW, "7b"),
        _fair_share_target(results.fair_share),
    ]


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


def render(results: Results, plots: list[str], extra_notes: list[str]) -> list[str]:
    facts = _facts(results)
    machine = "\n".join(f"- {name}: {value}" for name, value in results.machine.items())
    cancel_rows = [
        f"| {n + 1} | {_ms(c.seconds_to_cancelled_event)} | {c.steps_after_accepted} "
        f"| {c.steps_after_published} |"
        for n, c in enumerate(results.cancels)
    ]
    return [
        "# streampool benchmark results",
        "",
        f"Produced by `{results.command}` ({results.mode} mode, {results.minutes:.1f} minutes), one run:",
        "every ratio below compares figures measured minutes apart on the same machine. The machine is",
        "noisy; read ratios, not absolute values. Raw figures: [results.json](results.json).",
        "",
        "## Machine",
        "",
        machine,
        "",
        "## Targets (DESIGN.md)",
        "",
        *_targets(results, facts),
        "",
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
        f"![throughput]({plots[0]})",
        "",
        f"## 2. Time to first token at 1 stream (max_tokens {first_token.MAX_TOKENS}, jobs one at a time)",
        "",
        f"Short greedy prompts ({', '.join(repr(p) for p in first_token.SHORT_PROMPTS)}), the same on both"
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
        f"p50 {_ms(facts['pickup_p50'])} ms, p99 {_ms(facts['pickup_p99'])} ms, "
        f"max {_ms(max(results.pickup, default=math.nan))} ms.",
        "",
        "## 4. Relay capacity, engine taken out",
        "",
        *_relay_table(results),
        "",
        "redis-benchmark XADD ceiling, same run, same Redis: "
        + ", ".join(
            f"pipeline {c.pipeline}: {c.requests_per_second:,.0f} XADD/s (p50 {c.p50_ms} ms)"
            for c in results.ceilings
        )
        + ".",
        "",
        f"![relay lag CDF]({plots[1]})",
        "",
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
        *peer_section(results),
        *generate_section(results),
        *fair_share_section(results.fair_share),
        *fleet_section(results.fleet),
        "## Notes",
        "",
        *extra_notes,
    ]
