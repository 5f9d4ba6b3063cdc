"""On the CPU backend: the worker's own process and vLLM's engine-core process keep off the cores
that vLLM binds its model runner to.

vLLM's CPU backend binds the model runner's OpenMP threads to every core but the ones it reserves
(`VLLM_CPU_NUM_OF_RESERVED_CPU`, at least one) and leaves its other processes free to run anywhere.
The worker's process (vLLM's front end, which detokenizes, and streampool's chunking and publishing)
works while the model runs the next step: wherever the kernel puts it on a model runner's core, that
step waits for it. Bound to the cores the model runner leaves free, it never delays a step.
"""

from __future__ import annotations

import logging
import os

import psutil

log = logging.getLogger(__name__)


def bind(process: psutil.Process, cores: set[int]) -> None:
    """Every thread of the process: an affinity set through the process alone binds only its main thread."""
    for thread in process.threads():
        try:
            os.sched_setaffinity(thread.id, cores)
        except (ProcessLookupError, PermissionError):  # a thread that just ended, or one not ours
            pass


def keep_off_model_cores() -> set[int] | None:
    """Bind this process and its unbound descendants to the cores no model runner is bound to.

    Answers the cores this process could use before, for `restore`; None when there is nothing to do
    (vLLM bound no process, or left no core free).
    """
    me = psutil.Process()
    allowed = set(os.sched_getaffinity(0))
    bound: set[int] = set()
    unbound = [me]
    for child in me.children(recursive=True):
        try:
            affinity = set(child.cpu_affinity())
        except psutil.NoSuchProcess:
            continue
        if affinity < allowed:
            bound |= affinity  # a model runner, bound by vLLM
        else:
            unbound.append(child)  # the engine core's scheduler, helpers
    free = allowed - bound
    if not bound or not free:
        return None
    for process in unbound:
        try:
            bind(process, free)
        except psutil.NoSuchProcess:
            pass
    log.info("model runner on cores %s; this worker and its engine core on %s", sorted(bound), sorted(free))
    return allowed


def restore(cores: set[int]) -> None:
    """This process's threads back on `cores`, once its engine is shut down."""
    bind(psutil.Process(), cores)
