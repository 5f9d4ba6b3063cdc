"""The lifecycle's Lua scripts, loaded from this package's `.lua` files, and how they are run."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

HELPERS = {
    "clock_ms": "clock_ms.lua",
    "expire_job": "expire_job.lua",
    "announce_end": "announce_end.lua",
    "tenant_admit": "tenant_admit.lua",
    "tenant_running_jobs": "tenant_admit.lua",
    "tenant_move": "tenant_move.lua",
    "share_enqueue": "share_enqueue.lua",
    "share_leave": "share_leave.lua",
    "last_seq": "append_event.lua",
    "append_event": "append_event.lua",
    "is_behind": "append_event.lua",
    "end_unrun": "end_unrun.lua",
}
"""Lua functions a script may call, by the file that defines them; the loader prepends each file the
script uses, and the files those use, each once and before its callers."""


def _helper_files(body: str, package: Traversable) -> list[str]:
    """The helper files `body` calls, directly or through other helpers: each once, and each after
    the files it calls (a Lua local function must be defined before the code that calls it)."""
    ordered: list[str] = []
    seen: set[str] = set()

    def visit(text: str) -> None:
        for helper, path in HELPERS.items():
            if path not in seen and f"{helper}(" in text:
                seen.add(path)
                visit(package.joinpath(path).read_text())
                ordered.append(path)

    visit(body)
    return ordered


@dataclass(frozen=True)
class LuaScript:
    """One transition's script: its source and SHA1, for EVALSHA alone or inside a pipeline."""

    name: str
    source: str

    @classmethod
    def load(cls, name: str) -> LuaScript:
        package = files(__package__)
        body = package.joinpath(f"{name}.lua").read_text()
        helpers = [package.joinpath(path).read_text() for path in _helper_files(body, package)]
        return cls(name, "".join([*helpers, body]))

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()

    def command(self, keys: list[str], args: list[Any]) -> tuple[Any, ...]:
        """EVALSHA, for a pipeline (whose sender loads the script again on NOSCRIPT)."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def eval_command(self, keys: list[str], args: list[Any]) -> tuple[Any, ...]:
        """EVAL with the source, for a pipeline that must not depend on Redis's script cache."""
        return ("EVAL", self.source, len(keys), *keys, *args)

    async def then_wait(
        self, redis: aioredis.Redis, keys: list[str], args: list[Any], wait: tuple[tuple[Any, ...], ...]
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

    async def __call__(self, redis: aioredis.Redis, keys: list[str], args: list[Any]) -> Any:
        """Run the script; a Redis that lost its scripts (restarted, flushed) gets it again by EVAL."""
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[misc]
        except NoScriptError:
            return await redis.eval(self.source, len(keys), *keys, *args)  # type: ignore[misc]


async def _pipelined(redis: aioredis.Redis, *commands: tuple[Any, ...]) -> list[Any]:
    """Each command's answer (or the error it met), sent in one round trip."""
    pipe = redis.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    answers: list[Any] = await pipe.execute(raise_on_error=False)
    return answers


SUBMIT = LuaScript.load("submit")
CLAIM = LuaScript.load("claim")
START = LuaScript.load("start")
STEP = LuaScript.load("step")
RENEW = LuaScript.load("renew")
RELEASE = LuaScript.load("release")
FINISH = LuaScript.load("finish")
CANCEL = LuaScript.load("cancel")
DELETE = LuaScript.load("delete")
TENANT_USAGE = LuaScript.load("tenant_usage")
