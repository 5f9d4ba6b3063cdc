"""The lifecycle's Lua scripts, loaded from this package's `.lua` files, and how they are run.

A script (or helper) names the helpers it calls on its first line, `-- uses: tenant_move, end_job`:
each is the file `<name>.lua` here, which may name helpers of its own. The loader prepends every
helper a script uses, directly or through others, once each and after the helpers it uses (a Lua
local function must be defined before the code that calls it).

Every script but the step takes one named table as its only ARGV: a TypedDict of `arguments`, sent
as JSON and read by `cjson.decode(ARGV[1])`. The step keeps positional ARGV, named by
`arguments.StepArgs` (why: `arguments`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any, Generic, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from shared.lifecycle.arguments import (
    AdvertiseArgs,
    BatchCreateArgs,
    BatchMoveArgs,
    CancelArgs,
    ClaimArgs,
    CursorCheckArgs,
    ExpireArgs,
    FinishArgs,
    ReleaseArgs,
    RenewArgs,
    StartArgs,
    StreamEndArgs,
    StreamOpenArgs,
    StreamTakeArgs,
    SubmitArgs,
    TenantUsageArgs,
    UnclaimArgs,
    WriterDropArgs,
    WriterMarkArgs,
)
from shared.redis_client import StreamsRedis

Args = TypeVar("Args")
"""What a script takes as ARGV: a named table (a dict, sent as JSON), or positional values (a list)."""

USES = re.compile(r"-- uses: *(.*)")


def uses(source: str) -> list[str]:
    """The helpers a `.lua` file declares on its first line, in the order it names them."""
    declared = USES.fullmatch(source.partition("\n")[0])
    return [name.strip() for name in declared.group(1).split(",")] if declared else []


def _helpers(body: str, package: Traversable) -> list[str]:
    """The sources of the helpers `body` uses, directly or through other helpers: each once, and each
    after the helpers it uses."""
    ordered: dict[str, str] = {}
    visiting: list[str] = []

    def visit(source: str) -> None:
        for name in uses(source):
            if name in visiting:
                raise ValueError(f"helpers using each other: {' -> '.join([*visiting, name])}")
            if name in ordered:
                continue
            visiting.append(name)
            helper = package.joinpath(f"{name}.lua").read_text()
            visit(helper)
            ordered[name] = helper
            visiting.pop()

    visit(body)
    return list(ordered.values())


def encode(args: Any) -> list[Any]:
    """A script's ARGV: a named table as one JSON ARGV, a list as it is. A None in a table goes as no
    field at all: cjson reads JSON null as `cjson.null`, which Lua takes as true."""
    if isinstance(args, dict):
        table = {name: value for name, value in args.items() if value is not None}
        return [json.dumps(table, ensure_ascii=False, separators=(",", ":"))]
    return list(args)


@dataclass(frozen=True)
class LuaScript(Generic[Args]):
    """One transition's script: its source and SHA1, for EVALSHA alone or inside a pipeline."""

    name: str
    source: str

    @classmethod
    def load(cls, name: str) -> LuaScript[Any]:
        package = files(__package__)
        body = package.joinpath(f"{name}.lua").read_text()
        return cls(name, "".join([*_helpers(body, package), body]))

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()

    def command(self, keys: list[str], args: Args) -> tuple[Any, ...]:
        """EVALSHA, for a pipeline (whose sender loads the script again on NOSCRIPT)."""
        return ("EVALSHA", self.sha, len(keys), *keys, *encode(args))

    def eval_command(self, keys: list[str], args: Args) -> tuple[Any, ...]:
        """EVAL with the source, for a pipeline that must not depend on Redis's script cache."""
        return ("EVAL", self.source, len(keys), *keys, *encode(args))

    async def then_wait(
        self, redis: aioredis.Redis, keys: list[str], args: Args, wait: tuple[tuple[Any, ...], ...]
    ) -> tuple[Any, int]:
        """Run the script, then `wait` (commands ending with a WAIT: `Wait.commands`) in the same round
        trip: the script's answer, and how many replicas hold what it wrote."""
        answer, *waited = await _pipelined(redis, self.command(keys, args), *wait)
        if isinstance(answer, NoScriptError):
            answer, *waited = await _pipelined(redis, self.eval_command(keys, args), *wait)
        for result in (answer, *waited):
            if isinstance(result, Exception):
                raise result
        return answer, int(waited[-1])

    async def __call__(self, redis: StreamsRedis, keys: list[str], args: Args) -> Any:
        """Run the script; a Redis that lost its scripts (restarted, flushed) gets it again by EVAL."""
        argv = encode(args)
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *argv)  # type: ignore[misc]
        except NoScriptError:
            return await redis.eval(self.source, len(keys), *keys, *argv)  # type: ignore[misc]


async def _pipelined(redis: aioredis.Redis, *commands: tuple[Any, ...]) -> list[Any]:
    """Each command's answer (or the error it met), sent in one round trip."""
    pipe = redis.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    answers: list[Any] = await pipe.execute(raise_on_error=False)
    return answers


SUBMIT: LuaScript[SubmitArgs] = LuaScript.load("submit")
ADVERTISE: LuaScript[AdvertiseArgs] = LuaScript.load("advertise")
CLAIM: LuaScript[ClaimArgs] = LuaScript.load("claim")
START: LuaScript[StartArgs] = LuaScript.load("start")
EXPIRE: LuaScript[ExpireArgs] = LuaScript.load("expire")
STEP: LuaScript[list[Any]] = LuaScript.load("step")  # StepArgs, StepJobArgs a job, (id, type, data) an event
RENEW: LuaScript[RenewArgs] = LuaScript.load("renew")
RELEASE: LuaScript[ReleaseArgs] = LuaScript.load("release")
FINISH: LuaScript[FinishArgs] = LuaScript.load("finish")
CANCEL: LuaScript[CancelArgs] = LuaScript.load("cancel")
DELETE: LuaScript[list[Any]] = LuaScript.load("delete")  # no ARGV
TENANT_USAGE: LuaScript[TenantUsageArgs] = LuaScript.load("tenant_usage")
UNCLAIM: LuaScript[UnclaimArgs] = LuaScript.load("unclaim")
BATCH_CREATE: LuaScript[BatchCreateArgs] = LuaScript.load("batch_create")
BATCH_MOVE: LuaScript[BatchMoveArgs] = LuaScript.load("batch_move")
CURSOR_CHECK: LuaScript[CursorCheckArgs] = LuaScript.load("cursor_check")  # a read: the gateway's relay
# The streams' own Redis, when they have one (`planes.StreamsApart`): each transition's part there.
STREAM_OPEN: LuaScript[StreamOpenArgs] = LuaScript.load("stream_open")
STREAM_TAKE: LuaScript[StreamTakeArgs] = LuaScript.load("stream_take")
STREAM_END: LuaScript[StreamEndArgs] = LuaScript.load("stream_end")
WRITER_MARK: LuaScript[WriterMarkArgs] = LuaScript.load("writer_mark")
WRITER_DROP: LuaScript[WriterDropArgs] = LuaScript.load("writer_drop")
