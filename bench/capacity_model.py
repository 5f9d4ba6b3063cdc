"""How much of one Redis core, and of the control plane's, a deployment of GPU workers uses, from the
costs `bench.fleet` measures: the data plane's cost goes with the events (a step is one script call for
all of a worker's jobs, and a gateway reads no stream in steady flow: the step's notice carries its
entries), the control plane's with the jobs started and ended.

An engine step gives every running job one token, and the worker sends one pipeline per step (each
job's lease, which carries a cancel asked for, read even when `stream_step` holds its tokens back), so a
worker's steps/s is one sequence's tokens/s. With `stream_step` 1 it writes jobs x steps/s events a
second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    """One GPU worker's output: `jobs` sequences decoding at `tokens_per_second` each."""

    jobs: int
    tokens_per_second: float
    stream_step: int = 1  # tokens per event
    tokens_per_job: int = 500  # a job's output: as one ends another starts, each slot kept busy

    @property
    def steps_per_second(self) -> float:
        """Pipelines a second: one per engine step, that is one per token of each sequence."""
        return self.tokens_per_second

    @property
    def events_per_second(self) -> float:
        return self.jobs * self.tokens_per_second / self.stream_step

    @property
    def jobs_per_second(self) -> float:
        """Jobs started and ended a second: each of `jobs` slots ends one every `tokens_per_job` tokens."""
        return self.jobs * self.tokens_per_second / self.tokens_per_job


UTILIZATION = 0.7  # of Redis's core and of each gateway's, leaving room for bursts and everything else
TYPICAL = (Workload(32, 50.0), Workload(256, 30.0))
"""A Llama-3-8B class model on one GPU: 32 sequences at about 50 tokens/s each, or 256 at about 30."""


def redis_cores_per_event(cost_per_event: float, workload: Workload, workers: int) -> float:
    """Share of one Redis core that `workers` such workers keep busy, every job's stream followed, at
    `cost_per_event` Redis CPU seconds per relayed event, everything included (the step's append and
    checks, and the relay), as `bench.fleet` measures it: the data plane's cost goes with the events,
    not with the streams followed, since a step is one script call for all of a worker's jobs and a
    gateway reads no stream in steady flow (the step's notice carries its entries)."""
    return workers * workload.events_per_second * cost_per_event


def workers_per_cluster(
    cost_per_event: float, busiest_share: float, masters: int, workload: Workload, utilization: float
) -> int:
    """How many such workers the streams' Redis Cluster of `masters` carries with its busiest master at
    most `utilization` busy: `cost_per_event` is the masters' CPU per event added up, and the busiest
    master takes `busiest_share` times its even share of it (1: the masters evenly loaded)."""
    busiest = redis_cores_per_event(cost_per_event, workload, 1) * busiest_share / masters
    return math.floor(utilization / busiest)


def jobs_per_control_core(cost_per_job: float, utilization: float) -> float:
    """Jobs started and ended a second that keep the control plane's Redis `utilization` busy, at
    `cost_per_job` CPU seconds each (submit, claim, cancel or end): the control plane's own limit,
    whatever the masters of the streams."""
    return utilization / cost_per_job


def control_cores(cost_per_job: float, cost_per_event: float, workload: Workload, workers: int) -> float:
    """Share of the control plane's core that `workers` such workers keep busy: their jobs' starts and
    ends, and what running them costs it per event (the leases' renewals, the workers' heartbeats)."""
    return workers * (workload.jobs_per_second * cost_per_job + workload.events_per_second * cost_per_event)


def workers_per_control_plane(
    cost_per_job: float, cost_per_event: float, workload: Workload, utilization: float
) -> int:
    """How many such workers the control plane's one Redis carries at most `utilization` busy."""
    return math.floor(utilization / control_cores(cost_per_job, cost_per_event, workload, 1))
