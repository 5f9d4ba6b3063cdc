"""On the CPU backend each worker keeps its own process and its engine core off the cores vLLM binds
its model runner to (worker/cpu_placement.py): checked on the running workers' processes."""

from __future__ import annotations

import os

import psutil
import pytest

from tests.conftest import System


def thread_cores(process: psutil.Process) -> set[int]:
    """The cores any thread of the process may run on."""
    cores: set[int] = set()
    for thread in process.threads():
        cores |= os.sched_getaffinity(thread.id)
    return cores


def test_each_worker_and_its_engine_core_run_off_the_model_runner_cores(system: System) -> None:
    allowed = os.sched_getaffinity(0)  # the workers were started from here
    for worker in system.workers:
        process = psutil.Process(worker.pid)
        descendants = process.children(recursive=True)
        if all(set(child.cpu_affinity()) == allowed for child in descendants):
            pytest.skip("vLLM bound no model runner to cores (a GPU, or VLLM_CPU_OMP_THREADS_BIND=nobind)")
        # vLLM bound its model runner: the worker must then keep to the cores the runner leaves free.
        worker_cores = thread_cores(process)
        assert worker_cores < allowed
        runners = [child for child in descendants if thread_cores(child).isdisjoint(worker_cores)]
        assert runners, "no model runner apart from the worker"
        for child in descendants:
            if child not in runners:  # the engine core, multiprocessing's resource tracker
                assert thread_cores(child) <= worker_cores, child.name()
