"""vLLM's engine flags, read by vLLM's own parser: every flag `vllm serve` takes, a worker takes.

The flags come from `STREAMPOOL_ENGINE_ARGS` and the worker's command line (`streampool worker MODEL
--max-num-batched-tokens 1024 ...`, `--config FILE.yaml` as `vllm serve --config`). A flag given counts
where its value differs from the parser's default; streampool's own defaults fill in only the rest.
"""

from __future__ import annotations

import dataclasses
from argparse import SUPPRESS, ArgumentParser, Namespace
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.platforms import current_platform
from vllm.utils.argparse_utils import FlexibleArgumentParser

from shared.config import ENGINE_FLAG_SETTINGS, WorkerSettings

# What the heartbeat carries of the resolved arguments: enough to read, never a large record.
MAX_SHOWN_VALUE_CHARS = 200
MAX_SHOWN_FIELDS = 64
# Arguments whose value is a credential: shown as set, never as what they hold.
SECRET_ARGUMENTS = frozenset({"hf_token"})


class EngineFlagsError(Exception):
    """Engine flags the worker cannot start with: vLLM's parser refused them, or they contradict the
    deployment."""


class _Parser(FlexibleArgumentParser):
    """vLLM's parser, whose usage errors are raised rather than exiting the process."""

    def error(self, message: str) -> NoReturn:
        raise EngineFlagsError(f"{self.prog}: error: {message}")


@dataclass(frozen=True)
class EngineFlags:
    """The engine's arguments as the flags set them, and which of them the flags gave."""

    values: dict[str, Any]
    given: frozenset[str]


def _engine_parser() -> FlexibleArgumentParser:
    parser = _Parser(prog="streampool worker", add_help=False)  # type: ignore[no-untyped-call]
    AsyncEngineArgs.add_cli_args(parser)
    return parser


def engine_help() -> str:
    """vLLM's own help of every engine flag, by its config group, as `vllm serve --help=all` lists them."""
    parser = _engine_parser()
    parser.usage = SUPPRESS
    return ArgumentParser.format_help(parser)  # argparse's whole listing: vLLM's own gives the groups alone


def parse(flags: Sequence[str]) -> EngineFlags:
    """`flags` as `vllm serve` reads them: an optional model first, then engine flags."""
    rest = list(flags)
    model = rest.pop(0) if rest and not rest[0].startswith("-") else None
    parser = _engine_parser()
    try:
        values = vars(parser.parse_args(rest))
    except ValueError as exc:  # vLLM's own checks of `--config` and of JSON values
        raise EngineFlagsError(f"streampool worker: error: {exc}") from exc
    defaults = vars(parser.parse_args([]))
    given = {name for name, value in values.items() if value != defaults.get(name)}
    if model is not None:
        values["model"] = model
        given.add("model")
    return EngineFlags(values, frozenset(given))


def _setting_value(name: str, value: Any) -> Any:
    """A flag's value as the setting of the same name holds it."""
    if name == "served_model_name":
        return ",".join(value)
    if name == "max_model_len" and (not isinstance(value, int) or value < 16):
        raise EngineFlagsError(
            f"--max-model-len {value}: a worker needs its context length as a number of tokens (16 or more), "
            "which the gateway bounds prompts by"
        )
    return value


def _same(name: str, current: Any, value: Any) -> bool:
    """Whether a setting already holds a flag's value (a served name's list as its comma-separated text)."""
    if name == "served_model_name":
        return [part.strip() for part in str(current).split(",")] == str(value).split(",")
    return str(current) == str(value)


def with_engine_flags(settings: WorkerSettings) -> WorkerSettings:
    """`settings` with the values of the engine flags that share a setting's name (`--max-model-len`,
    `--served-model-name`, `--dtype`, ...), so that the worker announces what its engine runs.

    A flag that disagrees with its setting given too (`STREAMPOOL_SERVED_MODEL_NAME`, or the pool's
    `--max-model-len` that the gateway bounds prompts by) is refused, naming both."""
    flags = parse(settings.engine_args)
    update: dict[str, Any] = {}
    for name in sorted(ENGINE_FLAG_SETTINGS & flags.given):
        value = _setting_value(name, flags.values[name])
        current = getattr(settings, name)
        if name in settings.model_fields_set and not _same(name, current, value):
            flag = f"--{name.replace('_', '-')}"
            raise EngineFlagsError(
                f"engine flag {flag} {value} contradicts STREAMPOOL_{name.upper()}={current}: "
                "give one of them"
            )
        update[name] = type(current)(value) if name == "model" else value
    _refuse_parallel_on_cpu(flags.values)
    return settings.model_copy(update=update)


def _refuse_parallel_on_cpu(values: dict[str, Any]) -> None:
    """Several GPUs' parallelism on the CPU backend: refused before any engine process starts."""
    if not current_platform.is_cpu():
        return
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        if values.get(name, 1) > 1:
            raise EngineFlagsError(
                f"--{name.replace('_', '-')} {values[name]} needs as many GPUs; this worker runs vLLM's CPU "
                "backend, which streampool runs on one process"
            )


def engine_args_from(settings: WorkerSettings, defaults: dict[str, Any]) -> AsyncEngineArgs:
    """vLLM's arguments: the flags given, then streampool's `defaults` where no flag was given."""
    flags = parse(with_engine_flags(settings).engine_args)
    values = {**flags.values, **{name: value for name, value in defaults.items() if name not in flags.given}}
    args: AsyncEngineArgs = AsyncEngineArgs.from_cli_args(Namespace(**values))
    return args


def vllm_serve_defaults() -> AsyncEngineArgs:
    """The arguments `vllm serve` builds with no flag: what a worker's are told apart from."""
    baseline: AsyncEngineArgs = AsyncEngineArgs.from_cli_args(_engine_parser().parse_args([]))
    return baseline


def shown(args: AsyncEngineArgs) -> dict[str, str]:
    """The arguments that differ from those `vllm serve` builds with no flag, each as short text: what
    an operator reads of a worker's engine (its log line at start, its heartbeat)."""
    baseline = vllm_serve_defaults()
    result: dict[str, str] = {}
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        if value != getattr(baseline, field.name) and len(result) < MAX_SHOWN_FIELDS:
            text = "<hidden>" if field.name in SECRET_ARGUMENTS else str(value)
            result[field.name] = text[:MAX_SHOWN_VALUE_CHARS]
    return result
