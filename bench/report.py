"""bench/RESULTS.md rendered whole from bench/results.json, and results.json read and written.

`render` is pure: the same figures give the same text. Whatever measures writes through `record` (a
phase run alone: its part) or `save` (a run of every phase): results.json first, then RESULTS.md
rendered again from all of it, so that the report never holds a figure results.json lacks. The analysis
written by hand lives beside them, in ANALYSIS.md. `python -m bench.report` renders RESULTS.md again.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import TypeAdapter

from bench import (
    engine_report,
    fair_share_report,
    fleet_cluster_report,
    fleet_report,
    peer_report,
    scheduling_report,
)
from bench.results_figures import Results
from bench.submit_index_figures import INDEX_SIZE, SubmitIndexCost

HERE = Path(__file__).resolve().parent
RESULTS_JSON, RESULTS_MD = "results.json", "RESULTS.md"
_RESULTS = TypeAdapter(Results)
Part = TypeVar("Part")


def _header(results: Results) -> list[str]:
    produced = (
        f"Produced by `{results.command}` ({results.mode} mode, {results.minutes:.1f} minutes), one run"
        if results.command
        else "No run of every phase is recorded here"
    )
    return [
        "# streampool benchmark results",
        "",
        f"{produced}; a section that names another command was measured by that command, alone.",
        "Every ratio below compares figures measured minutes apart on the same machine. The machine is",
        "noisy; read ratios, not absolute values. Rendered whole from [results.json](results.json) by",
        "`bench/report.py`; the analysis written by hand is [ANALYSIS.md](ANALYSIS.md).",
        "",
        "## Machine",
        "",
        *(f"- {name}: {value}" for name, value in results.machine.items()),
        "",
    ]


def _targets(results: Results) -> list[str]:
    return [
        "## Targets (DESIGN.md)",
        "",
        "| target | measured (this run) | verdict |",
        "| --- | --- | --- |",
        *engine_report.targets(results),
        *fleet_report.relay_targets(results.relay),
        *peer_report.targets(results.peer, peer_report.CHAT_ROW, "7"),
        *peer_report.targets(results.generate, peer_report.GENERATE_ROW, "7b"),
        fair_share_report.target(results.fair_share),
        *scheduling_report.targets(results.scheduling),
        "",
    ]


def _part(heading: str, section: Callable[[Part], list[str]], part: Part | None) -> list[str]:
    """A section of a part of the figures, or its heading and a line saying it was not measured."""
    return section(part) if part is not None else [heading, "", "Not measured in this run.", ""]


SUBMIT_INDEX_HEADING = "## 10. The console's job index: its cost per submission"


def submit_index_section(cost: SubmitIndexCost) -> list[str]:
    return [
        SUBMIT_INDEX_HEADING,
        "",
        f"Measured {cost.measured} by `{cost.command}`, alone on a private redis-server: "
        f"{cost.rounds} rounds of {cost.submissions:,} submissions a store, each store first in every other "
        f"round; load average {cost.load:.1f} when it began. "
        f"The index was full ({INDEX_SIZE:,} entries): each indexed submission also trims one.",
        "",
        "| submit script | Redis µs per submission | round trip p50 (µs) |",
        "| --- | --- | --- |",
        f"| with the index (`job_index_size` {INDEX_SIZE:,}) | {cost.with_index:.1f} "
        f"| {cost.trip_with_us:.0f} |",
        f"| without (`job_index_size` 0) | {cost.without_index:.1f} | {cost.trip_without_us:.0f} |",
        "",
        f"The index adds {cost.extra_us:.1f} µs of Redis's time to a submission ({cost.ratio:.2f}x the "
        f"script without it), and holds {cost.index_bytes / 1e6:.2f} MB at {INDEX_SIZE:,} entries.",
        "",
    ]


def render(results: Results) -> list[str]:
    """RESULTS.md's lines, every section from `results`."""
    return [
        *_header(results),
        *_targets(results),
        *engine_report.first_sections(results),
        *_part(fleet_report.RELAY_HEADING, fleet_report.relay_section, results.relay),
        *engine_report.later_sections(results),
        *_part(peer_report.PEER_HEADING, peer_report.peer_section, results.peer),
        *_part(peer_report.GENERATE_HEADING, peer_report.generate_section, results.generate),
        *_part(fair_share_report.HEADING, fair_share_report.section, results.fair_share),
        *_part(fleet_report.HEADING, fleet_report.section, results.fleet),
        *_part(fleet_cluster_report.HEADING, fleet_cluster_report.section, results.fleet_cluster),
        *_part(SUBMIT_INDEX_HEADING, submit_index_section, results.submit_index),
        *_part(scheduling_report.HEADING, scheduling_report.section, results.scheduling),
        "## Notes",
        "",
        *results.notes,
    ]


def load(out: Path = HERE) -> Results:
    """The figures in `out`'s results.json; none where there is no such file yet."""
    path = out / RESULTS_JSON
    return _RESULTS.validate_python(json.loads(path.read_text())) if path.exists() else Results()


def save(results: Results, out: Path = HERE) -> Path:
    """results.json, then RESULTS.md rendered from it; answers RESULTS.md's path."""
    (out / RESULTS_JSON).write_text(json.dumps(dataclasses.asdict(results), indent=1) + "\n")
    path = out / RESULTS_MD
    path.write_text("\n".join(render(load(out))) + "\n")
    return path


def record(out: Path = HERE, /, **parts: Any) -> Path:
    """Put what a phase run alone measured (`parts`, by their names in `Results`) into results.json in
    place of what it had, keep every other part, and render RESULTS.md again; answers its path."""
    return save(dataclasses.replace(load(out), **parts), out)


def main() -> None:
    print(f"rendered {save(load())} from {HERE / RESULTS_JSON}")


if __name__ == "__main__":
    main()
