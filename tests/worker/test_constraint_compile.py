"""The worker's bound on compiling a constraint: past it the compiling child is killed and reaped, and
nothing of it (process or thread) is left running. xgrammar and the real default model's tokenizer; no
engine."""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Iterator

import pytest

from shared.config import DEFAULT_MODEL_DIR
from shared.errors import EngineError
from shared.requests import StructuredOutputs
from worker.constraint_compile import ConstraintCompiler

TIMEOUT = 0.5
SLOW = StructuredOutputs(json={"type": "string", "maxLength": 10_000, "pattern": "[^x]{1,10000}"})
"""Within the gateway's bounds, and still about 2 s for xgrammar against SmolLM2's vocabulary."""
QUICK = StructuredOutputs(regex=r"[0-9]{3}-[0-9]{4}")


@pytest.fixture(scope="module")
def compiler() -> Iterator[ConstraintCompiler]:
    """One for the module, as a worker keeps one: a child takes seconds to start (xgrammar imports torch),
    and the one the first test leaves running serves the next."""
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip(f"the default model is not prepared in {DEFAULT_MODEL_DIR} (streampool prepare-model)")
    compiler = ConstraintCompiler(str(DEFAULT_MODEL_DIR), TIMEOUT)
    yield compiler
    compiler.close()


async def test_a_constraint_past_the_bound_fails_and_leaves_nothing_compiling(
    compiler: ConstraintCompiler,
) -> None:
    await compiler.check(QUICK)  # the child is up: what follows times its compile only
    (child,) = multiprocessing.active_children()
    threads = threading.active_count()
    with pytest.raises(EngineError, match="took over 0.5 s to compile"):
        await compiler.check(SLOW)
    assert multiprocessing.active_children() == []
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid or 0, 0)  # killed and reaped, not compiling on
    assert threading.active_count() == threads
    await compiler.check(QUICK)  # a new child takes the next constraint


async def test_a_constraint_the_compiler_refuses_is_the_engines_to_judge(
    compiler: ConstraintCompiler,
) -> None:
    await compiler.check(StructuredOutputs(grammar="start: NUMBER\n%import common.NUMBER"))  # Lark
    await compiler.check(StructuredOutputs(choice=["yes", "no"]))  # nothing to compile
    await compiler.check(None)
