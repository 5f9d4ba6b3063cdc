"""A worker's engine flags become the engine arguments `vllm serve` makes of the same flags; streampool's
defaults fill in only what no flag gave; flags that contradict the deployment are refused."""

from __future__ import annotations

import dataclasses
import functools
import shlex
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from shared.config import DEFAULT_MODEL_DIR, WorkerSettings
from tests.deploy.manifests import COMPOSE_FILE, REPO, load_yaml

if TYPE_CHECKING:
    from vllm.engine.arg_utils import AsyncEngineArgs


@functools.cache
def vllm() -> SimpleNamespace:
    """vLLM's engine arguments and parser, and the worker's reading of them, imported by the test process
    that runs this module (tests/schedule.py's `engine-libraries`), not by every one as it collects:
    the import takes seconds (it brings torch), and raises torch's own deprecation warnings, which
    pytest would turn into failures."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        from worker.engine_arguments import EngineFlagsError, parse, shown, with_engine_flags
        from worker.vllm_engine import engine_args
    return SimpleNamespace(
        AsyncEngineArgs=AsyncEngineArgs,
        make_arg_parser=make_arg_parser,
        FlexibleArgumentParser=FlexibleArgumentParser,
        EngineFlagsError=EngineFlagsError,
        parse=parse,
        shown=shown,
        with_engine_flags=with_engine_flags,
        engine_args=engine_args,
    )


MODEL = str(DEFAULT_MODEL_DIR)

# One flag or two of each family the CPU backend takes: scheduler, cache, model, generation.
FAMILIES = [
    "--max-num-batched-tokens 1024 --max-num-seqs 8",
    "--enable-prefix-caching --block-size 32",
    "--generation-config vllm --seed 7 --max-logprobs 5",
    '--override-generation-config {"temperature":0.5,"top_k":20}',
    "--kv-cache-dtype auto --no-enable-chunked-prefill",
]


def vllm_serve_args(flags: list[str]) -> AsyncEngineArgs:
    """What `vllm serve MODEL <flags>` builds its engine from: its own subparser, its own conversion."""
    parser = vllm().make_arg_parser(vllm().FlexibleArgumentParser(prog="vllm serve"))
    namespace = parser.parse_args([MODEL, *flags])
    namespace.model = namespace.model_tag
    args: AsyncEngineArgs = vllm().AsyncEngineArgs.from_cli_args(namespace)
    return args


def given_fields(flags: list[str]) -> dict[str, Any]:
    """The engine fields `flags` change from `vllm serve`'s defaults."""
    defaults = dataclasses.asdict(vllm_serve_args([]))
    return {
        name: value
        for name, value in dataclasses.asdict(vllm_serve_args(flags)).items()
        if value != defaults[name]
    }


@pytest.mark.parametrize("flags", FAMILIES)
def test_flags_become_the_fields_vllm_serve_makes_of_them(flags: str) -> None:
    words = flags.split(" ")
    expected = given_fields(words)
    assert expected, "each family's flags change something"
    args = dataclasses.asdict(vllm().engine_args(WorkerSettings(model=DEFAULT_MODEL_DIR, engine_args=words)))
    assert {name: args[name] for name in expected} == expected


def test_streampool_defaults_fill_in_only_what_no_flag_gave() -> None:
    settings = WorkerSettings(model=DEFAULT_MODEL_DIR, worker_max_jobs=12, served_model_name="smol")
    assert vllm().engine_args(settings).max_num_seqs == 12
    flagged = vllm().engine_args(settings.model_copy(update={"engine_args": ["--max-num-seqs", "3"]}))
    assert flagged.max_num_seqs == 3
    assert flagged.served_model_name == ["smol"]  # the pool's names, where no flag names the model


def test_a_model_and_a_config_file_are_read_as_vllm_serve_reads_them(tmp_path: Path) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text("max-num-batched-tokens: 2048\nenable-prefix-caching: true\n")
    settings = WorkerSettings(engine_args=[MODEL, "--config", str(config), "--seed", "3"])
    args = vllm().engine_args(settings)
    assert (args.model, args.max_num_batched_tokens, args.enable_prefix_caching, args.seed) == (
        MODEL,
        2048,
        True,
        3,
    )


def test_a_flag_string_in_the_variable_is_split_as_a_shell_splits_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPOOL_ENGINE_ARGS", "--seed 5 --override-generation-config '{\"top_k\": 3}'")
    assert WorkerSettings().engine_args == ["--seed", "5", "--override-generation-config", '{"top_k": 3}']
    monkeypatch.setenv("STREAMPOOL_ENGINE_ARGS", '["--seed", "5"]')
    assert WorkerSettings().engine_args == ["--seed", "5"]


def test_flags_under_a_settings_name_set_it() -> None:
    settings = vllm().with_engine_flags(
        WorkerSettings(engine_args=["--served-model-name", "smol", "smol-chat", "--max-model-len", "1024"])
    )
    assert settings.model_names == ["smol", "smol-chat"]
    assert settings.max_model_len == 1024


def test_a_served_name_other_than_the_pools_is_refused_naming_both() -> None:
    settings = WorkerSettings(served_model_name="smol", engine_args=["--served-model-name", "other"])
    with pytest.raises(
        vllm().EngineFlagsError,
        match="--served-model-name other contradicts STREAMPOOL_SERVED_MODEL_NAME=smol",
    ):
        vllm().with_engine_flags(settings)


def test_a_context_other_than_the_pools_is_refused_naming_both() -> None:
    settings = WorkerSettings(max_model_len=512, engine_args=["--max-model-len", "4096"])
    with pytest.raises(vllm().EngineFlagsError, match="--max-model-len 4096.*STREAMPOOL_MAX_MODEL_LEN=512"):
        vllm().with_engine_flags(settings)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--max-num-seqs", "many"], "argument --max-num-seqs: invalid"),
    ],
)
def test_an_unknown_or_malformed_flag_is_refused_with_vllms_message(flags: list[str], message: str) -> None:
    with pytest.raises(vllm().EngineFlagsError, match=message):
        vllm().with_engine_flags(WorkerSettings(engine_args=flags))


def test_tensor_parallelism_on_the_cpu_is_refused_before_any_engine_starts() -> None:
    with pytest.raises(vllm().EngineFlagsError, match="--tensor-parallel-size 2 needs as many GPUs"):
        vllm().with_engine_flags(WorkerSettings(engine_args=["--tensor-parallel-size", "2"]))


def test_what_is_shown_is_what_differs_from_vllms_defaults_and_bounded() -> None:
    args = vllm().AsyncEngineArgs(model=MODEL, seed=9, tokenizer="x" * 1000, hf_token="hf_secret")
    assert vllm().shown(args)["seed"] == "9"
    assert len(vllm().shown(args)["tokenizer"]) == 200
    assert vllm().shown(args)["hf_token"] == "<hidden>"
    assert "block_size" not in vllm().shown(args)


# One flag of each family, and the resolved configuration's fields they set, by the config that holds them.
EVERY_FAMILY = (
    "--max-num-batched-tokens 1024 --max-num-seqs 8 --enable-prefix-caching --block-size 32 "
    "--kv-cache-dtype fp8 "
    '--generation-config vllm --seed 7 --max-logprobs 5 --override-generation-config {"temperature":0.5}'
).split(" ")
RESOLVED = {
    "scheduler_config": ("max_num_batched_tokens", "max_num_seqs"),
    "cache_config": ("enable_prefix_caching", "block_size", "cache_dtype"),
    "model_config": ("generation_config", "seed", "max_logprobs", "override_generation_config"),
}


def resolved(args: AsyncEngineArgs) -> dict[str, Any]:
    """The engine configuration vLLM resolves from `args` (no weights loaded), in the fields above."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        config = args.create_engine_config()
    return {
        f"{part}.{name}": getattr(getattr(config, part), name)
        for part, names in RESOLVED.items()
        for name in names
    }


def test_the_resolved_configuration_is_the_one_vllm_serve_resolves_from_the_same_flags() -> None:
    ours = resolved(vllm().engine_args(WorkerSettings(model=DEFAULT_MODEL_DIR, engine_args=EVERY_FAMILY)))
    assert ours == resolved(vllm_serve_args(EVERY_FAMILY))
    assert ours["scheduler_config.max_num_batched_tokens"] == 1024  # the flags did reach it
    assert ours["model_config.override_generation_config"] == {"temperature": 0.5}
    assert ours["cache_config.cache_dtype"] == "fp8"


def deployed_engine_flags() -> dict[str, list[str]]:
    """The engine flags of every worker the deployment files start, by where: compose's
    `STREAMPOOL_ENGINE_ARGS` and the worker containers' `args` in k8s/ (examples included)."""
    found = {
        f"docker-compose.yml {name}": shlex.split(service["environment"]["STREAMPOOL_ENGINE_ARGS"])
        for name, service in load_yaml(COMPOSE_FILE)["services"].items()
        if "STREAMPOOL_ENGINE_ARGS" in (service.get("environment") or {})
    }
    for path in sorted((REPO / "k8s").rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "Deployment":
                for container in document["spec"]["template"]["spec"]["containers"]:
                    args = container.get("args", [])
                    if args[:1] == ["worker"] and args[1:]:
                        where = f"{path.relative_to(REPO)} {container['name']}"
                        found[where] = [str(arg) for arg in args[1:]]
    return found


def test_every_deployed_pools_engine_flags_are_vllms() -> None:
    flags = deployed_engine_flags()
    assert any("tensor-parallel" in where for where in flags)  # the multi-GPU example is among them
    for where, words in flags.items():
        assert vllm().parse(words).given, where  # vLLM's parser refuses what it does not take
