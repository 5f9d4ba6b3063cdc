"""The fleet harness's pure parts (bench/delivery.py, bench/fleet_figures.py, bench/fleet_report.py): how
what a client received is checked against its stream, the figures per unit of work, and sections 4 and 9."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from bench.delivery import Delivery, account, delta_seq, lags
from bench.fleet import QUICK, long_polls_of_a_gateway_process, main_parser, next_level, plan_of
from bench.fleet_clients import KINDS, LONG_POLL, RESUME, SSE, kind_of
from bench.fleet_figures import ALL, FleetLevel, FleetRun, Lags, Window, lags_by_kind, us_per
from bench.fleet_report import HEADING, RELAY_HEADING, relay_targets, section
from bench.limit_figures import Limit, RequestCost
from bench.report import load, record, render
from bench.results_figures import Results
from shared.events import DeltaEvent


def test_every_delta_once_and_in_order_is_exact() -> None:
    delivery = account([2, 3, 4, 5], [2, 3, 4, 5])
    assert delivery == Delivery(sent=4, delivered=4)
    assert delivery.exact


def test_a_delta_received_twice_counts_as_duplicated_not_as_delivered_twice() -> None:
    delivery = account([2, 3, 4], [2, 3, 3, 4, 2])
    assert (delivery.delivered, delivery.duplicated, delivery.reordered) == (3, 2, 0)
    assert not delivery.exact


def test_a_delta_received_after_a_later_one_counts_as_reordered() -> None:
    delivery = account([2, 3, 4, 5], [2, 4, 3, 5])
    assert (delivery.delivered, delivery.duplicated, delivery.reordered) == (4, 0, 1)


def test_a_delta_never_received_is_lost_and_one_the_stream_lacks_is_unexpected() -> None:
    delivery = account([2, 3, 4], [2, 4, 9])
    assert (delivery.lost, delivery.unexpected, delivery.reordered) == (1, 1, 0)
    assert not delivery.exact


def test_a_level_adds_up_its_jobs() -> None:
    total = account([2, 3], [2, 3]) + account([2, 3], [3, 2, 2]) + account([2], [])
    assert total == Delivery(sent=5, delivered=4, duplicated=1, reordered=1)


def test_a_lag_runs_from_the_middle_of_the_sending_ms_to_the_first_receipt() -> None:
    sent_at_ms = {2: 1_000_000, 3: 1_000_010}
    found = lags([2, 3, 3], [1000.0205, 1000.0305, 1000.5], sent_at_ms, 999.0, 1001.0)
    assert found == pytest.approx([0.020, 0.020])


def test_only_the_deltas_sent_in_the_window_have_their_lag_taken() -> None:
    sent_at_ms = {2: 1_000_000, 3: 1_002_000, 4: 1_004_000}
    found = lags([2, 3, 4], [1005.0, 1005.0, 1005.0], sent_at_ms, 1001.0, 1003.0)
    assert found == pytest.approx([2.9995])


def test_a_deltas_seq_is_read_from_its_json_as_the_worker_writes_it() -> None:
    event = DeltaEvent(seq=1234, text='{"type":"delta","seq":9}', token_ids=[5])
    assert delta_seq(event.model_dump_json()) == 1234
    with pytest.raises(ValueError):
        delta_seq('{"type":"done","seq":7}')


def test_one_client_in_ten_long_polls_and_one_in_ten_resumes() -> None:
    kinds = [kind_of(index) for index in range(100)]
    assert (kinds.count(LONG_POLL), kinds.count(RESUME), kinds.count(SSE)) == (10, 10, 80)


def test_clients_of_one_kind_are_all_of_it_and_the_report_says_so() -> None:
    plan = plan_of(main_parser().parse_args(["--quick", "--clients", LONG_POLL]))
    assert plan.clients == LONG_POLL and plan_of(main_parser().parse_args(["--quick"])).clients == "mixed"
    assert {kind_of(index, plan.clients) for index in range(100)} == {LONG_POLL}
    described = section(replace(run_of(level()), plan=plan))[2]
    assert "every one long-polls" in described and "`--clients long-poll`" in described


def test_a_stream_step_runs_the_steps_that_many_times_faster_at_the_events_asked() -> None:
    plan = plan_of(main_parser().parse_args(["--quick", "--stream-step", "4"]))
    assert plan.stream_step == 4 and plan_of(main_parser().parse_args(["--quick"])).stream_step == 1
    coalesced = replace(level(), steps_per_second=16.0, stream_step=4)
    assert coalesced.asked_rate == level().asked_rate == 4000  # 1,000 streams, an event each 4 steps
    described = section(replace(run_of(coalesced), plan=plan))[2]
    assert "of 4 steps, its `stream_step`" in described
    assert "of 4 steps" not in section(run_of(level()))[2]


def window(events: int, redis_cpu: float, gateway_cpu: float = 0.0, **more: object) -> Window:
    values: dict[str, object] = {
        "seconds": 2.0,
        "events": events,
        "redis_cpu": redis_cpu,
        "gateway_cpu": gateway_cpu,
        "worker_cpu": 0.5,
        "client_cpu": 0.1,
        "machine_busy": 0.5,
    }
    values.update(more)
    return Window(**values)  # type: ignore[arg-type]


def level(lag_seconds: float = 0.005, delivery: Delivery | None = None) -> FleetLevel:
    return FleetLevel(
        streams=1000,
        workers=2,
        gateways=2,
        steps_per_second=4.0,
        unfollowed=window(8000, redis_cpu=0.08),
        followed=window(
            7000,
            redis_cpu=0.21,
            gateway_cpu=0.35,
            gateway_system_cpu=0.21,
            calls={"xadd": 7000, "xread": 1400},
            usec={"evalsha": 70_000, "xadd": 20_000, "xread": 35_000, "xrange": 7_000},
        ),
        delivery=delivery or Delivery(sent=9000, delivered=9000),
        lags=lags_by_kind(
            {SSE: [lag_seconds] * 80, LONG_POLL: [lag_seconds] * 10, RESUME: [lag_seconds] * 10}
        ),
        failures=[],
    )


def test_figures_are_cpu_per_event() -> None:
    assert us_per(0.21, 7000) == pytest.approx(30.0)
    assert math.isnan(us_per(0.1, 0))
    figures = level()
    assert figures.redis_step_us == pytest.approx(10.0)  # 0.08 s over 8,000 events, nobody following
    assert figures.redis_total_us == pytest.approx(30.0)  # 0.21 s over 7,000 events, all followed
    assert figures.redis_relay_us == pytest.approx(20.0)
    assert figures.gateway_us == pytest.approx(50.0)
    assert figures.worker_us == pytest.approx(0.5e6 / 7000)


def test_commandstats_count_the_scripts_without_their_nested_appends_and_the_reads() -> None:
    followed = level().followed
    assert followed.commands_per_event(("evalsha", "eval")) == pytest.approx(10.0)
    assert followed.commands_per_event(("xread", "xrange", "xrevrange")) == pytest.approx(6.0)


def test_the_rate_made_is_the_followed_windows_events_over_the_rate_asked() -> None:
    figures = level()
    assert figures.asked_rate == 4000
    assert figures.achieved == pytest.approx(3500 / 4000)


def test_a_level_is_sustained_only_with_lag_p99_within_20_ms_and_an_exact_delivery() -> None:
    assert level(0.015).sustained
    assert not level(0.025).sustained
    assert not level(0.005, Delivery(sent=9000, delivered=9000, duplicated=1)).sustained
    assert not level(0.005, Delivery(sent=9000, delivered=8999)).sustained


def run_of(*levels: FleetLevel) -> FleetRun:
    limit = Limit("XADD", 16, 100_000, 500_000.0, 0.15)
    return FleetRun("python -m bench.fleet --quick", "today", QUICK, 0.001, [limit], list(levels))


def test_the_section_has_a_row_per_level_in_each_table_and_the_limits_per_command() -> None:
    text = section(run_of(level(), level(0.025)))
    assert text[0] == HEADING
    rows = [line for line in text if line.startswith("| 1000 |")]
    assert len(rows) == 4
    assert "| XADD | 16 | 500,000 | 1.5 |" in text
    costs = "| 1000 | 4 | 4,000 / 3,500 | 30.0 / 10.0 / 20.0 | 10.0 / 6.0 | 0.20 | 50.0 / 30.0 |"
    assert rows[0].startswith(costs)
    assert rows[-1].endswith("| 9000 | 9000 | 0 | 0 | 0 | no |")


def test_a_gateway_process_long_polls_its_share_of_the_tenth_of_the_largest_levels_streams() -> None:
    plan = replace(QUICK, streams=(250, 1000), rate=2000.0, gateways=2, gateway_processes=2)
    assert long_polls_of_a_gateway_process(plan) == (25, 50.0)  # 100 polling clients, 200 events/s, 4 ways
    alone = replace(plan, clients=LONG_POLL)
    assert long_polls_of_a_gateway_process(alone) == (250, 500.0)
    assert long_polls_of_a_gateway_process(replace(plan, clients=SSE)) is None


def test_the_long_polls_floor_is_given_beside_the_sockets_when_it_was_measured() -> None:
    run = run_of(level())
    assert not any("bench.request_limit" in line for line in section(run))
    run.request_cost = RequestCost(50, 100.0, 156, 2000, 97.25, 2000, 2000)
    [line] = [line for line in section(run) if "bench.request_limit" in line]
    assert "100 requests a second over 50 kept-alive connections" in line
    assert "spends 97.2 µs of CPU a request" in line


def test_a_run_whose_first_level_could_not_run_still_writes_its_section_and_says_why() -> None:
    run = run_of()
    run.stopped = "1000 streams at 2,000 events/s could not be run: not ready in 300 s"
    text = "\n".join(section(run))
    assert run.stopped in text
    assert "| GPU worker |" not in text  # no level, no sizing


def test_results_json_keeps_the_lags_as_percentiles_and_counts_by_kind(tmp_path: Path) -> None:
    record(tmp_path, fleet=run_of(level()))
    lags_kept = json.loads((tmp_path / "results.json").read_text())["fleet"]["levels"][0]["lags"]
    assert set(lags_kept) == {*KINDS, ALL}
    assert lags_kept[ALL] == {"events": 100, "p50": 0.005, "p99": 0.005, "p999": 0.005}
    assert load(tmp_path).fleet == run_of(level())


def test_a_lag_is_read_from_its_kinds_percentiles_and_missing_for_a_kind_not_run() -> None:
    figures = replace(level(), lags={ALL: Lags(3, 0.001, 0.002, 0.004), SSE: Lags(3, 0.001, 0.002, 0.004)})
    assert (figures.lag(50), figures.lag(99.9, SSE)) == (0.001, 0.004)
    assert math.isnan(figures.lag(99, LONG_POLL))
    assert any("| n/a, n/a / n/a / n/a |" in line for line in section(run_of(figures)))  # long-poll


def test_flags_change_the_plan_they_name_and_leave_the_rest() -> None:
    plan = plan_of(main_parser().parse_args(["--quick", "--workers", "3", "--streams", "100", "200"]))
    assert (plan.workers, plan.streams, plan.rate) == (3, (100, 200), QUICK.rate)


def test_make_bench_puts_the_fleet_section_before_the_notes() -> None:
    text = render(Results("make bench", "full", {}, 128, fleet=run_of(level())))
    assert text.index(HEADING) < text.index("## Notes")
    alone = render(Results("make bench", "full", {}, 128))
    assert alone[alone.index(HEADING) + 2] == "Not measured in this run."


def test_a_run_alone_records_its_part_keeps_the_others_and_renders_section_9_again(tmp_path: Path) -> None:
    record(tmp_path, pickup=[0.001], notes=["- a note"])
    record(tmp_path, fleet=run_of(level(0.025)))
    record(tmp_path, fleet=run_of(level(0.005)))
    lines = (tmp_path / "RESULTS.md").read_text().splitlines()
    assert lines.count(HEADING) == 1
    assert lines.index("## 8. Fair sharing among tenants") < lines.index(HEADING) < lines.index("## Notes")
    assert lines[-1] == "- a note"
    assert [line for line in lines if line.startswith("| 1000 |")][-1].endswith("| yes |")
    raw_kept = json.loads((tmp_path / "results.json").read_text())
    assert raw_kept["pickup"] == [0.001] and len(raw_kept["fleet"]["levels"]) == 1


def test_the_relay_targets_are_judged_on_one_thousand_streams_at_ten_events_a_second_each() -> None:
    """Section 4: lag p99 within 20 ms at 1,000 streams x 10/s, and the highest rate sustained beside
    redis-benchmark's XADD."""
    at_target = replace(level(0.015), steps_per_second=10.0)  # 1,000 streams x 10 events/s
    raised = replace(level(0.015), steps_per_second=15.0)
    past = replace(level(0.030), steps_per_second=22.5)
    lag, rate = relay_targets(run_of(at_target, raised, past))
    assert lag == (
        "| relay lag p99 <= 20 ms, 1,000 SSE streams x 10/s, one gateway | p99 15.0 ms, 9000/9000 delivered"
        " | **met** |"
    )
    assert "| 15,000 events/s (1000 streams) vs P16: 500,000/s | (reported) |" in rate
    missed, _ = relay_targets(run_of(replace(level(0.025), steps_per_second=10.0)))
    assert missed.endswith("**missed** |")
    assert relay_targets(None)[0].endswith("| not run | **missed** |")
    assert relay_targets(run_of(level()))[0].endswith("| not run | **missed** |")  # no level at 10/s


def test_section_4_has_the_levels_costs_and_delivery_beside_the_limits() -> None:
    text = render(
        Results("make bench", "full", {}, 128, relay=run_of(replace(level(), steps_per_second=10.0)))
    )
    at = text.index(RELAY_HEADING)
    section_4 = text[at : text.index("## 5. Cancel latency")]
    assert "| XADD | 16 | 500,000 | 1.5 |" in section_4
    assert len([line for line in section_4 if line.startswith("| 1000 |")]) == 2


def test_the_levels_run_the_streams_at_the_fixed_rate_then_raise_it_until_one_is_not_sustained() -> None:
    plan = replace(QUICK, streams=(250, 1000), rate=2000.0, rate_streams=250, rate_factor=2.0, rate_levels=3)
    assert next_level(plan, []) == (250, 2000.0)
    assert next_level(plan, [level(0.050)]) == (1000, 2000.0)
    assert next_level(plan, [level(0.050), level(0.050)]) == (250, 4000.0)  # fixed levels never stop it
    assert next_level(plan, [level()] * 3) == (250, 8000.0)
    assert next_level(plan, [level()] * 3 + [level(0.050)]) is None
    assert next_level(plan, [level()] * 5) is None  # rate_levels reached


def test_the_sizing_takes_the_costs_per_event_of_the_level_with_the_most_streams() -> None:
    """256 jobs x 30 tokens/s is 7,680 events/s; at 30 µs of Redis an event a worker takes 0.230 of a
    core, so three fit in 70 %; at 50 µs of gateway CPU an event it takes 0.5 of a gateway process."""
    text = section(run_of(replace(level(), streams=250), level()))
    row = next(line for line in text if line.startswith("| 256 jobs x 30 tokens/s |"))
    assert row == "| 256 jobs x 30 tokens/s | 7,680 | 30.0 (the level's) | 0.230 | 3 | 50.0 | 0.5 |"
    assert any("at the costs of the 1000-stream level" in line for line in text)


def test_a_busy_redis_step_cost_sizes_a_second_row_with_the_levels_relay_and_joins_the_limits() -> None:
    """With the step's busy cost (`bench.step_limit`) of 5 µs and the level's relay of 20 µs, a GPU
    worker costs 25 µs an event: 7,680 events/s take 0.192 of a core, so three fit in 70 %."""
    run = run_of(level())
    run.step_limit = Limit("step script, 256 jobs a call (per job-step)", 8, 1000, 120_000.0, 0.005)
    text = section(run)
    assert "| step script, 256 jobs a call (per job-step) | 8 | 120,000 | 5.0 |" in text
    rows = [line for line in text if line.startswith("| 256 jobs x 30 tokens/s |")]
    busy = "25.0 (busy step 5.0 + the level's relay)"
    assert rows == [
        "| 256 jobs x 30 tokens/s | 7,680 | 30.0 (the level's) | 0.230 | 3 | 50.0 | 0.5 |",
        f"| 256 jobs x 30 tokens/s | 7,680 | {busy} | 0.192 | 3 | 50.0 | 0.5 |",
    ]
