"""throughput.png, the plot under section 1 of bench/RESULTS.md: tokens/s by concurrent streams, each
in-process run beside the full path. Drawn by a run of every phase (matplotlib is the `bench` extra)."""

from __future__ import annotations

from pathlib import Path

from bench.results_figures import Results


def throughput(results: Results, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    sides = [(f"in-process engine, run {n + 1}", run.levels) for n, run in enumerate(results.in_process)]
    for label, summaries in [*sides, ("full path", results.full_path)]:
        rates = [s.tokens_per_second for s in summaries]
        axis.plot([s.concurrency for s in summaries], rates, "o-", label=label)
    axis.set(xscale="log", xlabel="concurrent streams", ylabel="tokens/s", title="Throughput")
    axis.legend()
    path = out / "throughput.png"
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close("all")
    return path
