"""The `streampool` command: run the gateway, a worker, or everything; prepare the default model."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from shared.config import Settings
from shared.logs import configure_logging


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting (`--redis-url` for STREAMPOOL_REDIS_URL); a flag wins over the variable."""
    group = parser.add_argument_group("settings (each also read from STREAMPOOL_<NAME>)")
    for name, field in Settings.model_fields.items():
        group.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None, help=field.description)


def settings_from(args: argparse.Namespace) -> Settings:
    overrides = {
        name: getattr(args, name) for name in Settings.model_fields if getattr(args, name) is not None
    }
    return Settings(**overrides)


def _gateway(settings: Settings) -> None:
    from gateway.app import run

    run(settings)


def _worker(settings: Settings) -> None:
    from worker.app import run

    run(settings)


def _up(settings: Settings) -> None:
    from shared.launcher import run_all

    sys.exit(run_all(settings))


def _prepare_model(settings: Settings) -> None:
    from worker.model_prep import prepare_model

    print(prepare_model(settings.model))


COMMANDS: dict[str, tuple[Callable[[Settings], None], str]] = {
    "gateway": (_gateway, "run the HTTP gateway"),
    "worker": (_worker, "run one worker (loads the model into vLLM)"),
    "up": (_up, "run Redis (when none answers), a gateway and a worker; Ctrl-C stops them"),
    "prepare-model": (_prepare_model, "prepare the default model folder (once; cached)"),
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="streampool", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        _add_setting_flags(commands.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    settings = settings_from(args)
    configure_logging(settings.log_level)
    COMMANDS[args.command][0](settings)


if __name__ == "__main__":
    main()
