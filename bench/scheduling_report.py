"""The scheduling section of bench/RESULTS.md and its targets: prefix-aware claiming against no affinity
and one vLLM server, the claim script's cost with it, and fair shares counted in tokens."""

from __future__ import annotations

from bench.formats import verdict
from bench.scheduling_figures import Scheduling

HEADING = "## 11. Scheduling: prefix-aware claiming and fair shares by tokens"
HIT_RATE_TARGET = 0.9  # of one vLLM server's hit rate, with prefix-aware claiming
TTFT_TARGET = 0.6  # TTFT p50 with prefix-aware claiming over the run without affinity
CLAIM_TARGET = 1.5  # Redis's time per claimed job with affinity over the claim without
SHARE_TARGET = 1.15  # token throughput of the long-jobs tenant over the short-jobs one, either way


def targets(run: Scheduling | None) -> list[str]:
    """The targets' rows, for the table at RESULTS.md's top."""
    labels = [
        f"prefix-cache hit rate, prefix-aware / one vLLM server >= {HIT_RATE_TARGET} (section 11)",
        f"TTFT p50, prefix-aware / no affinity <= {TTFT_TARGET} (section 11)",
        f"claim script's Redis time per job, with affinity / without <= {CLAIM_TARGET} (section 11)",
        f"tokens served, long-jobs tenant / short-jobs tenant within {SHARE_TARGET}x (section 11)",
    ]
    if run is None:
        return [f"| {label} | not run | **missed** |" for label in labels]
    rows = []
    by_label = {conversation.label: conversation for conversation in run.conversations}
    ours, unbound, peer = (by_label.get(label) for label in (PREFIX_AWARE, NO_AFFINITY, ONE_SERVER))
    if ours and peer:
        ratio = ours.hit_rate / max(peer.hit_rate, 1e-9)
        rows.append(f"| {labels[0]} | {ratio:.2f} | {verdict(ratio >= HIT_RATE_TARGET)} |")
    else:
        rows.append(f"| {labels[0]} | not run | **missed** |")
    if ours and unbound:
        ratio = ours.ttft_p50_ms / unbound.ttft_p50_ms
        rows.append(f"| {labels[1]} | {ratio:.2f} | {verdict(ratio <= TTFT_TARGET)} |")
    else:
        rows.append(f"| {labels[1]} | not run | **missed** |")
    if run.claims:
        ratio = run.claims.usec_with / run.claims.usec_without
        rows.append(
            f"| {labels[2]} | {ratio:.2f} | {verdict(ratio <= CLAIM_TARGET and run.claims.claimed_once)} |"
        )
    else:
        rows.append(f"| {labels[2]} | not run | **missed** |")
    tokens = next((share for share in run.shares if share.unit == "tokens"), None)
    if tokens:
        ratio = tokens.ratio
        met = 1 / SHARE_TARGET <= ratio <= SHARE_TARGET
        rows.append(f"| {labels[3]} | {ratio:.2f} | {verdict(met)} |")
    else:
        rows.append(f"| {labels[3]} | not run | **missed** |")
    return rows


PREFIX_AWARE, NO_AFFINITY, ONE_SERVER = (
    "streampool, prefix-aware",
    "streampool, no affinity",
    "one vLLM server",
)


def section(run: Scheduling) -> list[str]:
    plan = run.plan
    lines = [
        HEADING,
        "",
        "docs/scheduling.md says what is measured and why.",
        "",
    ]
    if run.conversations:
        lines += [
            f"**Conversations on the real engine**, by {run.measured_by.get('conversations')}."
            f" {plan.conversations} conversations of {plan.turns} turns"
            " each over one shared system prompt of about 1,000 tokens, each turn sent as the last answer"
            f" ended (streamed chat, temperature 0, {plan.answer_tokens} tokens an answer); streampool with"
            " two real-engine workers, then vLLM's own server alone. Time to first token: to the first chunk"
            " with content, at the client. Hit rate: vLLM's `vllm:prefix_cache_hits_total` over"
            " `vllm:prefix_cache_queries_total` (tokens), over the run, summed over the engines.",
            "",
            "| deployment | turns | TTFT p50 (ms) | TTFT p99 (ms) | prefix-cache hit rate | seconds |",
            "| --- | --- | --- | --- | --- | --- |",
            *(
                f"| {one.label} | {one.turns} | {one.ttft_p50_ms:.0f} | {one.ttft_p99_ms:.0f} "
                f"| {one.hit_rate:.3f} | {one.seconds:.0f} |"
                for one in run.conversations
            ),
            "",
        ]
    if run.claims:
        claims = run.claims
        lines += [
            f"**The claim script's cost**, by {run.measured_by.get('claims')}. {claims.jobs:,} jobs of"
            f" {claims.prefix_groups} prefix groups"
            f" queued on a private Redis, {claims.workers} workers (each group's blocks advertised by one),"
            " one job claimed a call by the workers in turn, each job then taken out of the queue as a start"
            " does. Redis's own time (INFO commandstats, EVALSHA) over the jobs claimed.",
            "",
            "| claim script | Redis µs per job claimed |",
            "| --- | --- |",
            f"| without affinity | {claims.usec_without:.1f} |",
            f"| prefix-aware | {claims.usec_with:.1f} |",
            "",
            f"Every job claimed once: {'yes' if claims.claimed_once else '**no**'}; claimed by the worker"
            f" holding its group: {claims.held_share:.0%}.",
            "",
        ]
    if run.shares:
        lines += [
            f"**Fair shares by tokens**, by {run.measured_by.get('shares')}. Two tenants of weight 1"
            " kept backlogged for"
            f" {plan.share_seconds:.0f} s on one synthetic worker of 4 slots: `long` (800 prompt tokens,"
            " 200 output), `short` (20, 5)."
            " Served: prompt plus twice the output tokens of the jobs that ended in the window.",
            "",
            "| share counted in | long: jobs, tokens | short: jobs, tokens | long / short tokens |",
            "| --- | --- | --- | --- |",
            *(
                f"| {share.unit} | {share.jobs['long']}, {share.served['long']:,} "
                f"| {share.jobs['short']}, {share.served['short']:,} | {share.ratio:.2f} |"
                for share in run.shares
            ),
            "",
        ]
    return lines
