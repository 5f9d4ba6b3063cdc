"""The sizing arithmetic of bench/capacity_model.py, which turns the Redis cost per event `bench.fleet`
measures into GPU workers (docs/scaling.md, "Scaling rules and sizing")."""

from __future__ import annotations

import pytest

from bench.capacity_model import Workload, redis_cores_per_event


def test_a_worker_steps_once_per_token_and_writes_one_event_per_job_and_step() -> None:
    workload = Workload(jobs=32, tokens_per_second=50)
    assert workload.steps_per_second == 50
    assert workload.events_per_second == 1600


def test_a_larger_stream_step_writes_fewer_events_but_steps_as_often() -> None:
    workload = Workload(jobs=32, tokens_per_second=50, stream_step=4)
    assert workload.steps_per_second == 50
    assert workload.events_per_second == 400


def test_redis_load_is_the_workers_events_times_the_cost_of_one() -> None:
    workload = Workload(jobs=32, tokens_per_second=50)
    # one worker: 1,600 events/s x 20 us = 0.032 of a core
    assert redis_cores_per_event(20e-6, workload, 1) == pytest.approx(0.032)
    assert redis_cores_per_event(20e-6, workload, 10) == pytest.approx(0.32)
    assert redis_cores_per_event(20e-6, Workload(jobs=32, tokens_per_second=50, stream_step=4), 1) == (
        pytest.approx(0.008)
    )
