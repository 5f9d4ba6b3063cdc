"""A job's sampling options reach vLLM's `SamplingParams` under vLLM's names, and vLLM takes them.

Builds the parameters only (vLLM checks them as it builds them); no engine is started.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

from shared.config import WorkerSettings
from shared.errors import InvalidRequest
from shared.requests import JobRequest
from worker.engine import Prompt

ToParams = Callable[[JobRequest], Any]

OPTIONS: dict[str, Any] = {
    "ignore_eos": True,
    "repetition_penalty": 1.3,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "min_p": 0.1,
    "min_tokens": 4,
    "stop_token_ids": [2, 7],
    "include_stop_str_in_output": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
}


@pytest.fixture(scope="module")
def to_params() -> ToParams:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's own, as vllm imports it
        from worker.vllm_engine import VllmEngine
    return VllmEngine.sampling_params


def test_every_sampling_option_reaches_sampling_params(to_params: ToParams) -> None:
    params = to_params(JobRequest(prompt="Once", max_tokens=9, **OPTIONS))
    assert {name: getattr(params, name) for name in OPTIONS} == OPTIONS
    assert params.max_tokens == 9


def test_logit_bias_keys_become_token_ids(to_params: ToParams) -> None:
    params = to_params(JobRequest(prompt="Once", logit_bias={"42": 100, "7": -5.5}))
    assert params.logit_bias == {42: 100.0, 7: -5.5}


def test_defaults_are_vllms_defaults(to_params: ToParams) -> None:
    params = to_params(JobRequest(prompt="Once"))
    defaults = type(params)()
    for name in [*OPTIONS, "logit_bias"]:
        assert getattr(params, name) == getattr(defaults, name), name


@pytest.mark.parametrize(("emitted", "min_tokens_left"), [(3, 1), (4, 0), (6, 0)])
def test_a_resumed_job_needs_only_the_min_tokens_it_has_not_emitted(
    to_params: ToParams, emitted: int, min_tokens_left: int
) -> None:
    prompt = Prompt(token_ids=[1, 2], request=JobRequest(prompt="Once", max_tokens=9, min_tokens=4))
    rest = prompt.continued(list(range(emitted))).request
    assert (rest.max_tokens, rest.min_tokens) == (9 - emitted, min_tokens_left)
    to_params(rest)  # still a valid request for vLLM


@pytest.mark.parametrize(
    "constraint",
    [{"json": {"type": "object"}}, {"regex": "[a-z]+"}, {"choice": ["yes", "no"]}, {"json_object": True}],
)
def test_structured_outputs_reach_sampling_params_under_vllms_names(
    to_params: ToParams, constraint: dict[str, Any]
) -> None:
    params = to_params(JobRequest.model_validate({"prompt": "Once", "structured_outputs": constraint}))
    ((name, value),) = constraint.items()
    assert getattr(params.structured_outputs, name) == value


@pytest.mark.parametrize(
    ("truncate", "max_tokens", "kept"), [(None, 12, 10), (4, 12, 4), (20, 12, 10), (-1, 12, 8), (-1, 20, 1)]
)
def test_truncate_prompt_tokens_keeps_the_last_tokens(
    truncate: int | None, max_tokens: int, kept: int
) -> None:
    request = JobRequest(prompt="Once", max_tokens=max_tokens, truncate_prompt_tokens=truncate)
    assert request.kept_prompt_tokens(10, max_model_len=20) == kept


def test_truncate_prompt_tokens_over_the_context_is_refused_as_vllm_refuses_it() -> None:
    request = JobRequest(prompt="Once", max_tokens=12, truncate_prompt_tokens=21)
    with pytest.raises(InvalidRequest, match="21 cannot be greater than max_model_len = 20") as refused:
        request.kept_prompt_tokens(10, max_model_len=20)
    assert refused.value.field == "truncate_prompt_tokens"


@pytest.mark.parametrize(("policy", "handed"), [("priority", -3), ("fcfs", 0)])
def test_a_jobs_priority_reaches_vllm_where_the_worker_schedules_by_priority(
    policy: str, handed: int
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from worker.vllm_engine import engine_args, engine_priority
    settings = WorkerSettings(scheduling_policy=policy)
    assert engine_args(settings).scheduling_policy == policy
    assert engine_priority(JobRequest(prompt="hi", priority=-3), policy) == handed
