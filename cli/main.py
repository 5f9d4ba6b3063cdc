"""The `streampool` command: run the gateway, a worker, or everything; prepare the default model;
submit, follow, inspect and cancel jobs."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, get_origin

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from client.api import Client, GatewayError
from client.console import Terminal, summary
from shared.config import (
    ENGINE_FLAG_SETTINGS,
    ClientSettings,
    GatewaySettings,
    RedisSettings,
    Settings,
    WorkerSettings,
)
from shared.events import DeltaEvent, ErrorEvent, Event, JobState
from shared.logs import configure_logging
from shared.requests import ChatMessage, JobRequest

SettingsT = TypeVar("SettingsT", bound=BaseSettings)
RoleSettingsT = TypeVar("RoleSettingsT", bound=RedisSettings)

# Exit codes of the client commands. 2 stays argparse's usage error, so a cancelled job gets 3.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 3
EXIT_INTERRUPTED = 130
EXIT_CODES = {JobState.completed: EXIT_OK, JobState.failed: EXIT_FAILED, JobState.cancelled: EXIT_CANCELLED}
SAMPLING_OPTIONS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "ignore_eos",
    "stream_step",
)


def _add_setting_flags(
    parser: argparse.ArgumentParser, settings_class: type[BaseSettings], skipped: frozenset[str] = frozenset()
) -> None:
    """One flag per setting (`--redis-url` for STREAMPOOL_REDIS_URL) but the `skipped`; a flag wins over
    the variable. A list setting's flag may be repeated (`--lora a=/x --lora b=/y`)."""
    group = parser.add_argument_group("settings (each also read from STREAMPOOL_<NAME>)")
    for name, field in settings_class.model_fields.items():
        if name in skipped:
            continue
        action = "append" if get_origin(field.annotation) is list else "store"
        group.add_argument(
            f"--{name.replace('_', '-')}", dest=name, default=None, action=action, help=field.description
        )


def settings_from(args: argparse.Namespace, settings_class: type[SettingsT]) -> SettingsT:
    # A setting without a flag of its own (the worker's under vLLM's names) is None here.
    overrides = {
        name: getattr(args, name)
        for name in settings_class.model_fields
        if getattr(args, name, None) is not None
    }
    return settings_class(**overrides)


def _gateway(settings: GatewaySettings) -> None:
    from gateway.app import run

    run(settings)


def _worker(settings: WorkerSettings) -> None:
    from cli.engines import start_engine
    from worker.app import run

    run(settings, start_engine)


def _with_engine_flags(settings: WorkerSettings) -> WorkerSettings:
    """The worker's settings with what its engine flags set; flags vLLM's parser refuses, or that
    contradict the settings, end the command as a usage error does, with the parser's message."""
    with warnings.catch_warnings():
        # torch's deprecations, raised as vLLM is imported, say nothing to whoever starts a worker.
        warnings.simplefilter("ignore", DeprecationWarning)
        from worker.engine_arguments import EngineFlagsError, with_engine_flags  # imports vLLM

        try:
            return with_engine_flags(settings)
        except EngineFlagsError as exc:
            print(exc, file=sys.stderr)
            sys.exit(EXIT_USAGE)


def _up(settings: Settings) -> None:
    from cli.launcher import run_all

    sys.exit(run_all(settings))


def _prepare_model(settings: WorkerSettings) -> None:
    from cli.model_prep import prepare_model

    print(prepare_model(settings.model))


@dataclass(frozen=True)
class ServerCommand(Generic[RoleSettingsT]):
    """A command that runs part of the system, with the flags of its role's settings only."""

    run: Callable[[RoleSettingsT], None]
    settings_class: type[RoleSettingsT]
    help: str


COMMANDS: dict[str, ServerCommand[Any]] = {
    "gateway": ServerCommand(_gateway, GatewaySettings, "run the HTTP gateway"),
    "worker": ServerCommand(_worker, WorkerSettings, "run one worker (loads the model into vLLM)"),
    "up": ServerCommand(
        _up,
        Settings,
        "run Redis (when none answers), a gateway (on 127.0.0.1 unless --host) and a worker; "
        "Ctrl-C stops them",
    ),
    "prepare-model": ServerCommand(
        _prepare_model, WorkerSettings, "prepare the default model folder (once; cached)"
    ),
}
# The worker's settings whose flags vLLM's parser reads on `streampool worker`'s command line, as
# `vllm serve` takes them (`--enforce-eager` alone, `--served-model-name a b`); `--model` stays the
# worker's own flag, as the positional MODEL is vLLM's.
WORKER_ENGINE_FLAGS = ENGINE_FLAG_SETTINGS - {"model"}


def job_request(args: argparse.Namespace) -> JobRequest:
    """The job the submit options describe; `--system` implies `--chat`."""
    options: dict[str, Any] = {
        name: getattr(args, name) for name in SAMPLING_OPTIONS if getattr(args, name) is not None
    }
    if args.chat or args.system is not None:
        system = [] if args.system is None else [ChatMessage(role="system", content=args.system)]
        options["messages"] = [*system, ChatMessage(role="user", content=args.prompt)]
    else:
        options["prompt"] = args.prompt
    return JobRequest(**options)


def _problem(exc: ValidationError) -> str:
    # The deepest error is the most specific: a union (`stop`) reports one error per member.
    error = max(exc.errors(), key=lambda error: len(error["loc"]))
    return f"{error['loc'][0]}: {error['msg']}" if error["loc"] else error["msg"]


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Holds Ctrl-C back while a chunk is printed and its cursor noted, so that the detach hint
    resumes exactly after the printed text (the command is single-threaded)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _stream(
    client: Client, terminal: Terminal, args: argparse.Namespace, job_id: str, after: str | None
) -> int:
    """Prints a job's text as it comes; Ctrl-C detaches from the job (or cancels it)."""
    cursor = after
    last: Event | None = None
    try:
        for job_event in client.follow(job_id, after):
            with _sigint_deferred():
                if isinstance(job_event.event, DeltaEvent):
                    terminal.text(job_event.event.text)
                cursor, last = job_event.id, job_event.event
    except KeyboardInterrupt:
        terminal.end_text()
        return _detach(client, terminal, args, job_id, cursor)
    terminal.end_text()
    record = client.record(job_id)
    if record.status is JobState.failed:
        terminal.error(last.code if isinstance(last, ErrorEvent) else "failed", record.error or "")
    else:
        terminal.note(summary(record))
    return EXIT_CODES[record.status]


def _detach(
    client: Client, terminal: Terminal, args: argparse.Namespace, job_id: str, cursor: str | None
) -> int:
    """Ctrl-C while streaming: cancel the job if asked to, else leave it running and say how to return."""
    if args.cancel_on_exit:
        terminal.note(f"job {job_id}: {client.cancel(job_id).message}")
    else:
        url = f" --url {shlex.quote(args.url)}" if args.url else ""
        after = f" --after {cursor}" if cursor else ""
        terminal.note(
            f"detached; job {job_id} keeps running\n"
            f"  follow it: streampool follow {job_id}{after}{url}\n"
            f"  cancel it: streampool cancel {job_id}{url}"
        )
    return EXIT_INTERRUPTED


def _submit(client: Client, terminal: Terminal, args: argparse.Namespace) -> int:
    if args.cancel_on_exit and not args.stream:
        terminal.error("usage", "--cancel-on-exit goes with --stream")
        return EXIT_USAGE
    try:
        request = job_request(args)
    except ValidationError as exc:
        terminal.error("validation", _problem(exc))
        return EXIT_USAGE
    job_id = client.submit(request, args.idempotency_key).id
    if not args.stream:
        terminal.line(job_id)
        return EXIT_OK
    terminal.note(f"job {job_id}")
    return _stream(client, terminal, args, job_id, None)


def _follow(client: Client, terminal: Terminal, args: argparse.Namespace) -> int:
    return _stream(client, terminal, args, args.job_id, args.after)


def _status(client: Client, terminal: Terminal, args: argparse.Namespace) -> int:
    terminal.record(client.record(args.job_id), args.json)
    return EXIT_OK


def _cancel(client: Client, terminal: Terminal, args: argparse.Namespace) -> int:
    answer = client.cancel(args.job_id)
    terminal.line(f"{answer.status.value}: {answer.message}")
    return EXIT_OK


ClientCommand = Callable[[Client, Terminal, argparse.Namespace], int]
CLIENT_COMMANDS: dict[str, ClientCommand] = {
    "submit": _submit,
    "follow": _follow,
    "status": _status,
    "cancel": _cancel,
}
STREAM_EPILOG = (
    "While the text streams, Ctrl-C detaches and prints how to follow or cancel the job. Exit codes: "
    "0 completed (or submitted, without --stream), 1 failed or a gateway error, 2 usage error, "
    "3 cancelled, 130 interrupted."
)


def _add_client_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def add(name: str, help_text: str, epilog: str | None = None) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_text, description=help_text, epilog=epilog)
        _add_setting_flags(parser, ClientSettings)
        return parser

    submit = add("submit", "submit a generation job and print its id", STREAM_EPILOG)
    follow = add("follow", "print a job's text from a cursor to its end", STREAM_EPILOG)
    status = add("status", "print a job's record")
    cancel = add("cancel", "cancel a job (idempotent) and print what it did")
    for parser in (follow, status, cancel):
        parser.add_argument("job_id", metavar="ID")
    submit.add_argument("prompt")
    submit.add_argument("--max-tokens", type=int, help="tokens to generate (default 256)")
    submit.add_argument("--temperature", type=float, help="0-2; 0 is greedy (default 1)")
    submit.add_argument("--top-p", type=float, help="nucleus sampling (default 1)")
    submit.add_argument("--top-k", type=int, help="top-k sampling")
    submit.add_argument("--seed", type=int, help="for reproducible sampling")
    submit.add_argument("--stop", action="append", help="a string that ends generation (repeatable)")
    submit.add_argument(
        "--ignore-eos", action="store_true", default=None, help="generate max_tokens tokens, past end of text"
    )
    submit.add_argument("--stream-step", type=int, help="tokens per delta event (default 1)")
    submit.add_argument("--chat", action="store_true", help="send the prompt as one user message")
    submit.add_argument("--system", help="a system message before the prompt (implies --chat)")
    submit.add_argument("--idempotency-key", help="the same key returns the same job")
    submit.add_argument("--stream", action="store_true", help="print the text as it comes, then a summary")
    follow.add_argument("--after", help="the stream id to resume after (default: the start)")
    for parser in (submit, follow):
        parser.add_argument("--cancel-on-exit", action="store_true", help="Ctrl-C cancels the job")
    status.add_argument("--json", action="store_true", help="JSON even on a terminal")


def _run_client(args: argparse.Namespace) -> int:
    terminal = Terminal()
    try:
        settings = settings_from(args, ClientSettings)
        with Client(settings.url, api_key=settings.api_key) as client:
            return CLIENT_COMMANDS[args.command](client, terminal, args)
    except GatewayError as exc:
        terminal.error(exc.error_type, exc.message)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`| head`): point stdout at nothing so the exit flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


class _WorkerHelp(argparse.Action):
    """`streampool worker --help`: the worker's own flags, then vLLM's engine flags, from vLLM's parser
    (imported only then: it takes seconds)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **_: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help="show this help")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser.print_help()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch's, as vLLM is imported
            from worker.engine_arguments import engine_help

            flags = engine_help()
        print("\nvLLM's engine flags, as `vllm serve` takes them (after MODEL, or in --config's file):")
        print(flags)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streampool", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        # No abbreviations: the gateway's `--models` must not take the worker's `--model` for itself.
        subparser = commands.add_parser(
            name, help=command.help, description=command.help, allow_abbrev=False, add_help=name != "worker"
        )
        if name == "worker":
            subparser.add_argument("-h", "--help", action=_WorkerHelp)
        _add_setting_flags(
            subparser, command.settings_class, WORKER_ENGINE_FLAGS if name == "worker" else frozenset()
        )
    commands.choices[
        "worker"
    ].usage = "streampool worker [MODEL] [vLLM engine flags, as `vllm serve` takes them]"
    _add_client_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    # What the worker's own flags leave, its model and vLLM's engine flags, is vLLM's parser's to read.
    args, engine_flags = parser.parse_known_args(argv)
    if engine_flags and args.command != "worker":
        parser.error(f"unrecognized arguments: {' '.join(engine_flags)}")
    if args.command in CLIENT_COMMANDS:
        sys.exit(_run_client(args))
    command = COMMANDS[args.command]
    settings = settings_from(args, command.settings_class)
    if engine_flags:
        # The command line's after the variable's, so that they win; its MODEL first, as vLLM reads it.
        model = engine_flags[:1] if not engine_flags[0].startswith("-") else []
        flags = [*model, *settings.engine_args, *engine_flags[len(model) :]]
        settings = settings.model_copy(update={"engine_args": flags})
    if isinstance(settings, WorkerSettings) and args.command == "worker" and settings.engine_args:
        settings = _with_engine_flags(settings)
    configure_logging(settings.log_level)
    command.run(settings)
