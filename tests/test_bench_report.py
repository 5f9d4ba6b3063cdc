"""bench/RESULTS.md is rendered whole from bench/results.json: the committed report is what its figures
render to, and a report recorded again from the figures it was rendered from is the same text."""

from __future__ import annotations

from pathlib import Path

from bench import run
from bench.report import HERE, RESULTS_MD, load, record, render, save
from bench.results_figures import Results


def test_the_committed_report_is_what_the_committed_figures_render_to() -> None:
    assert "\n".join(render(load(HERE))) + "\n" == (HERE / RESULTS_MD).read_text()


def test_figures_saved_and_loaded_again_are_the_same_and_render_the_same_text(tmp_path: Path) -> None:
    figures = load(HERE)
    first = save(figures, tmp_path).read_text()
    assert load(tmp_path) == figures
    assert record(tmp_path).read_text() == first


def test_a_run_of_every_phase_replaces_what_it_measured_and_keeps_what_only_a_run_of_its_own_measures(
    tmp_path: Path,
) -> None:
    earlier = load(HERE)
    record(tmp_path, pickup=[0.5], submit_index=earlier.submit_index, fleet_cluster=earlier.fleet_cluster)
    run.save(Results("make bench QUICK=1", "quick", {}, 32, pickup=[0.001]), tmp_path)
    kept = load(tmp_path)
    assert (kept.command, kept.pickup) == ("make bench QUICK=1", [0.001])
    assert (kept.submit_index, kept.fleet_cluster) == (earlier.submit_index, earlier.fleet_cluster)
