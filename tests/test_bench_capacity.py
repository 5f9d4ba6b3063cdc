"""The sizing arithmetic of bench/capacity_model.py, which turns measured Redis costs into workers and
gateways (docs/scaling.md, "Scaling rules and sizing")."""

from __future__ import annotations

import pytest

from bench.capacity_model import RedisCosts, Workload, gateways_for, redis_cores, workers_per_redis

COSTS = RedisCosts(per_step=400e-6, per_followed_stream=500e-6)


def test_a_worker_steps_once_per_token_and_writes_one_event_per_job_and_step() -> None:
    workload = Workload(jobs=32, tokens_per_second=50)
    assert workload.steps_per_second == 50
    assert workload.events_per_second == 1600


def test_a_larger_stream_step_writes_fewer_events_but_steps_as_often() -> None:
    workload = Workload(jobs=32, tokens_per_second=50, stream_step=4)
    assert workload.steps_per_second == 50
    assert workload.events_per_second == 400


def test_redis_load_is_steps_times_step_cost_plus_followed_streams_times_their_cost() -> None:
    workload = Workload(jobs=32, tokens_per_second=50)
    # one worker: 50 steps x 400 us + 32 streams x 500 us = 0.02 + 0.016
    assert redis_cores(COSTS, workload, 1) == pytest.approx(0.036)
    assert redis_cores(COSTS, workload, 10) == pytest.approx(0.36)


def test_workers_per_redis_is_the_whole_workers_that_fit_under_the_utilization() -> None:
    workload = Workload(jobs=32, tokens_per_second=50)
    assert workers_per_redis(COSTS, workload, 0.7) == 19  # 0.7 / 0.036 = 19.4
    assert workers_per_redis(COSTS, workload, 1.0) == 27  # 1 / 0.036 = 27.8


def test_gateways_round_up_to_carry_every_event() -> None:
    # 30,400 events/s at 50 us each is 1.52 cores; at 70 % a gateway, 2.17 gateways: 3
    assert gateways_for(30_400, 50e-6, 0.7) == 3
    assert gateways_for(10_000, 50e-6, 0.7) == 1
