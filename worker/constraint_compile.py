"""A job's structured-output constraint is compiled first in a child process, killed past a time bound.

vLLM compiles constraints on threads: on its regex timeout (`VLLM_REGEX_COMPILATION_TIMEOUT_S`) it stops
waiting but the thread goes on compiling, holding a core and the engine's grammar executor (one thread
on a 2-core machine, so every later constrained request waits behind it), and a schema's or a grammar's
compile has no bound at all. A thread cannot be stopped; a process can. So the worker compiles each
regex, grammar and schema with xgrammar (vLLM's default backend) against the model's tokenizer in one
child process, one at a time, before the engine sees it: past the bound the child is killed and the job
fails alone, with nothing left running. What passes compiles in the engine in about the same time.
`choice` and `json_object` are not checked: the request's own limits bound them.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from shared.errors import EngineError
from shared.requests import StructuredOutputs

START_SECONDS = 120.0
"""How long the child may take to import xgrammar and load the tokenizer, apart from the bound."""


def _serve(tokenizer_dir: str, conn: Connection) -> None:
    """The child: compile each (kind, text, any whitespace) it is sent; answer None, or the compiler's
    refusal, which is the engine's to judge (vLLM may fall back to another backend)."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(tokenizer_dir))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    conn.send(None)
    while True:
        try:
            kind, text, any_whitespace = conn.recv()
        except EOFError:  # the worker closed its end: it is stopping
            return
        try:
            if kind == "json":
                compiler.compile_json_schema(text, any_whitespace=any_whitespace)
            elif kind == "regex":
                compiler.compile_regex(text)
            else:
                compiler.compile_grammar(text)
            conn.send(None)
        except Exception as exc:  # noqa: BLE001 - any refusal goes back as text
            conn.send(repr(exc))


def _compiled(constraint: StructuredOutputs) -> tuple[str, str, bool] | None:
    """What the child compiles for `constraint`, or None when nothing needs checking."""
    any_whitespace = not constraint.disable_any_whitespace
    if constraint.json_ is not None:
        schema = constraint.json_
        return "json", schema if isinstance(schema, str) else json.dumps(schema), any_whitespace
    if constraint.regex is not None:
        return "regex", constraint.regex, any_whitespace
    if constraint.grammar is not None:
        return "grammar", constraint.grammar, any_whitespace
    return None


class ConstraintCompiler:
    """The child process and the one-at-a-time queue to it; `check` refuses what compiles too slowly."""

    def __init__(self, tokenizer_dir: str, timeout: float) -> None:
        self._tokenizer_dir = tokenizer_dir
        self._timeout = timeout
        self._turn = asyncio.Lock()
        self._child: tuple[BaseProcess, Connection] | None = None
        self._ready = False

    async def check(self, constraint: StructuredOutputs | None) -> None:
        """Return once `constraint` compiled within the bound; `EngineError` when it did not."""
        compiled = None if constraint is None else _compiled(constraint)
        if compiled is None:
            return
        async with self._turn:
            conn = await self._started()
            try:
                conn.send(compiled)
                answered = await _readable(conn, self._timeout)
                if answered:
                    conn.recv()
            except (EOFError, OSError) as exc:
                self.close()
                raise EngineError(
                    f"structured_outputs: the compiler died compiling its {compiled[0]}"
                ) from exc
            except BaseException:  # a cancelled job: the answer it waited for would go to the next one
                self.close()
                raise
            if not answered:
                self.close()
                raise EngineError(
                    f"structured_outputs: its {compiled[0]} took over {self._timeout:g} s to compile; "
                    "give a simpler one (fewer or smaller repetition counts)"
                )

    def start(self) -> None:
        """Start the child, which takes seconds to import xgrammar and load the tokenizer (not counted
        against the bound): at the first constrained job, which waits for it once."""
        if self._child is not None:
            return
        context = multiprocessing.get_context("spawn")  # a fork would copy the engine's threads' locks
        ours, theirs = context.Pipe()
        process = context.Process(
            target=_serve, args=(self._tokenizer_dir, theirs), name="constraint-compile", daemon=True
        )
        process.start()
        theirs.close()
        self._child, self._ready = (process, ours), False

    async def _started(self) -> Connection:
        self.start()
        assert self._child is not None
        conn = self._child[1]
        if not self._ready:
            if not await _readable(conn, START_SECONDS):
                self.close()
                raise EngineError(f"the constraint compiler did not start within {START_SECONDS:g} s")
            conn.recv()
            self._ready = True
        return conn

    def close(self) -> None:
        """Kill the child (mid-compile or idle) and reap it: nothing of it is left running."""
        if self._child is None:
            return
        process, conn = self._child
        self._child = None
        conn.close()
        process.kill()
        process.join()


async def _readable(conn: Connection, timeout: float) -> bool:
    """Wait, on the event loop and without a thread, until `conn` has an answer or `timeout` passes."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def answered() -> None:  # called on every turn of the loop until removed
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(conn.fileno(), answered)
    try:
        await asyncio.wait_for(ready, timeout)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(conn.fileno())
    return True
