"""The fleet's processes and jobs: its gateways (for the whole run), a level's workers (started with
the level's step rate) and their running jobs, and a measuring window over all of them: the one Redis,
or the control plane's Redis and each master of the streams' Redis Cluster."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from bench import redis_probe, system
from bench.fleet_figures import FleetPlan, Window
from bench.redis_probe import Probe, Snapshot
from shared.config import Settings
from shared.jobstore import JobStore
from shared.requests import JobRequest

BATCH = 200  # jobs submitted, cancelled or read at once
START_TIMEOUT_SECONDS = 120.0  # for a share of the jobs to run
TOKENS_MARGIN_SECONDS = 120.0  # a job asks for tokens to outlast its level's windows by this much


def _cpu_times(processes: list[psutil.Process]) -> tuple[float, float]:
    """The CPU time of the processes and of their children (a gateway's `--processes`): in all, and
    the part spent in the kernel."""
    total = system = 0.0
    for process in processes:
        try:
            tree = [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for member in tree:
            try:
                times = member.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
            system += times.system
    return total, system


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    return _cpu_times(processes)[0]


def _machine_cpu() -> tuple[float, float]:
    """The machine's CPU seconds so far, busy and in all, every core's added up."""
    times = psutil.cpu_times()
    total = float(sum(times))
    return total - times.idle - getattr(times, "iowait", 0.0), total


class Fleet:
    """The gateways, on ports of their own, and the workers of the level that runs."""

    def __init__(
        self,
        settings: Settings,
        logs: Path,
        plan: FleetPlan,
        probe: Probe,
        store: JobStore,
        masters: list[Probe] | None = None,
    ) -> None:
        """`probe`: the Redis of `redis_url`; `masters`: the streams' cluster's masters, when they are
        on one (`probe` is then the control plane's alone)."""
        self.settings = settings
        self.logs = logs
        self.plan = plan
        self.probe = probe
        self.store = store
        self.masters = masters or []
        self.starting = (0.0, 0.0)  # the control plane's CPU and seconds of the level's jobs' start
        self.gateways: list[system.Child] = []
        self.workers: list[system.Child] = []
        self.ports = [settings.port, *(system.free_port() for _ in range(plan.gateways - 1))]

    def start_gateways(self) -> None:
        """Each gateway on a port of its own, its processes each given a notice partition of their own
        (`gateway_notice_partition`): the n-th gateway's first is `n` times the processes a gateway."""
        for n, port in enumerate(self.ports):
            update = {
                "port": port,
                "processes": self.plan.gateway_processes,
                "gateway_notice_partition": n * self.plan.gateway_processes,
            }
            settings = self.settings.model_copy(update=update)
            self.gateways.append(system.start(f"gateway-{n}", ["cli", "gateway"], settings, self.logs))
        for gateway, port in zip(self.gateways, self.ports, strict=True):
            system.wait_answering(self.settings.model_copy(update={"port": port}), gateway)

    async def start_jobs(self, streams: int, steps_per_second: float) -> list[str]:
        """Start the workers one at a time, each given its share of `streams` jobs once it is ready, so
        that each claims its own (those before it are full) and its clock starts apart from theirs:
        their steps are out of phase. The running jobs, in order."""
        jobs = math.ceil(streams / self.plan.workers)
        asked = self.plan.unfollowed_seconds + self.plan.seconds + TOKENS_MARGIN_SECONDS
        max_tokens = math.ceil(steps_per_second * asked)
        job_ids: list[str] = []
        self.starting = (0.0, 0.0)
        for n in range(self.plan.workers):
            settings = self.settings.model_copy(
                update={
                    "engine": "synthetic",
                    "synthetic_step_seconds": 1 / steps_per_second,
                    "synthetic_mean_tokens": 0,  # a job ends at max_tokens, or when cancelled
                    "worker_max_jobs": jobs,
                    "max_model_len": max(2048, max_tokens + 64),
                    "metrics_port": system.free_port(),
                }
            )
            self.workers.append(system.start(f"worker-{n}", ["cli", "worker"], settings, self.logs))
            system.wait_ready(self.settings, [*self.gateways, *self.workers], n + 1)
            before = redis_probe.snapshot(self.probe.client)
            share = await self._submit(len(job_ids), min(jobs, streams - len(job_ids)), max_tokens)
            await self._wait_running(share)
            cpu, seconds = self.control_since(before)
            self.starting = (self.starting[0] + cpu, self.starting[1] + seconds)
            job_ids += share
        return job_ids

    def control_since(self, before: Snapshot) -> tuple[float, float]:
        """The control plane's CPU (idle share off) and the seconds since `before`, its snapshot."""
        after = redis_probe.snapshot(self.probe.client)
        return self.probe.busy(before, after), after.taken - before.taken

    async def _submit(self, first: int, count: int, max_tokens: int) -> list[str]:
        """`count` jobs, the first the `first`-th of the level's. Each as the gateway its client follows
        it through (`Clients`: the n-th job's, the n-th gateway in turn) would have submitted it, its
        id in that gateway's notice partition, as a client that submits and follows through one
        gateway has it; on a Redis Cluster ids stay random, as the gateways make them there."""
        request = JobRequest(prompt="fleet", max_tokens=max_tokens, stream_step=self.plan.stream_step)
        model, job_ids, keys = self.settings.model_name, list[str](), self.store.keys

        def job_id(n: int) -> str | None:
            if keys.partitions:
                return None
            gateway = n % self.plan.gateways
            return keys.job_id_in(gateway * self.plan.gateway_processes % keys.notice_partitions)

        for start in range(first, first + count, BATCH):
            submitting = (
                self.store.submit(request, model=model, max_queued=0, job_id=job_id(n))
                for n in range(start, min(start + BATCH, first + count))
            )
            job_ids += [submission.job_id for submission in await asyncio.gather(*submitting)]
        return job_ids

    async def _wait_running(self, job_ids: list[str]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            pipe = self.store.redis.pipeline(transaction=False)
            for job_id in job_ids:
                pipe.hget(self.store.keys.job(job_id), "status")
            if all(status == "running" for status in await pipe.execute()):
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{len(job_ids)} jobs were not all running after {START_TIMEOUT_SECONDS:g} s")

    async def cancel(self, job_ids: list[str]) -> None:
        for start in range(0, len(job_ids), BATCH):
            await asyncio.gather(*(self.store.cancel(job_id) for job_id in job_ids[start : start + BATCH]))

    async def sent(self, job_ids: list[str]) -> dict[str, dict[int, int]]:
        """Each job's deltas as its stream holds them: seq to `at` (ms)."""
        sent: dict[str, dict[int, int]] = {}
        for start in range(0, len(job_ids), BATCH):
            batch = job_ids[start : start + BATCH]
            pipe = self.store.streams.pipeline(transaction=False)
            for job_id in batch:
                pipe.xrange(self.store.keys.stream(job_id))
            for job_id, entries in zip(batch, await pipe.execute(), strict=True):
                sent[job_id] = {
                    int(entry_id.split("-")[0]): int(fields["at"])
                    for entry_id, fields in entries
                    if fields["type"] == "delta"
                }
        return sent

    def stop_workers(self) -> None:
        while self.workers:
            self.workers.pop().stop()

    def stop(self) -> None:
        self.stop_workers()
        while self.gateways:
            self.gateways.pop().stop()

    def _cpu(self) -> tuple[tuple[float, float], float]:
        return (
            _cpu_times([gateway.handle for gateway in self.gateways]),
            _cpu_seconds([worker.handle for worker in self.workers]),
        )

    async def window(self, seconds: float, clients: list[psutil.Process]) -> tuple[Window, float, float]:
        """Measure for `seconds`: the window, and when it opened and closed (epoch seconds). The
        streams' figures (events, Redis CPU, commands) are the masters' added up, when on a cluster."""
        streams = self.masters or [self.probe]
        control, (gateways, workers) = redis_probe.snapshot(self.probe.client), self._cpu()
        before = [redis_probe.snapshot(master.client) for master in streams]
        (busy, total), client_cpu, opened = _machine_cpu(), _cpu_seconds(clients), time.time()
        await asyncio.sleep(seconds)
        closed = time.time()
        after = [redis_probe.snapshot(master.client) for master in streams]
        control_cpu, _ = self.control_since(control)
        gateways_after, workers_after = self._cpu()
        busy_after, total_after = _machine_cpu()
        calls = _added(redis_probe.calls_between(*pair) for pair in zip(before, after, strict=True))
        master_cpu = tuple(
            master.busy(*pair) for master, pair in zip(streams, zip(before, after, strict=True), strict=True)
        )
        window = Window(
            seconds=after[0].taken - before[0].taken,
            events=calls.get("xadd", 0),
            redis_cpu=sum(master_cpu),
            gateway_cpu=gateways_after[0] - gateways[0],
            gateway_system_cpu=gateways_after[1] - gateways[1],
            worker_cpu=workers_after - workers,
            client_cpu=_cpu_seconds(clients) - client_cpu,
            machine_busy=(busy_after - busy) / (total_after - total),
            calls=calls,
            usec=_added(redis_probe.usec_between(*pair) for pair in zip(before, after, strict=True)),
            master_cpu=master_cpu if self.masters else (),
            control_cpu=control_cpu if self.masters else 0.0,
        )
        return window, opened, closed


def _added(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counts by name, added up over the servers."""
    total: dict[str, int] = {}
    for count in counts:
        for name, value in count.items():
            total[name] = total.get(name, 0) + value
    return dict(sorted(total.items()))
