"""What the outside clients make of the gateway's refusals: the `openai` package and `huggingface_hub`'s
`InferenceClient` against a real gateway process with no worker, the default model's card published as a
worker publishes it. Every request here is refused before a job is made, so no engine is needed; what
the engine makes of the requests that pass is in tests/e2e.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError, ValidationError
from openai.types.chat import ChatCompletionMessageParam

from shared.model_card import ModelCard, publish_model_card
from tests.gateway.keyed_gateway import KeyedGateway, run_gateway
from tests.gateway.stand_ins import CARD_CONTEXT, CARD_MODEL

TOO_LONG = "word " * 3000  # about 3,000 tokens, past CARD_CONTEXT
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France? Answer in one word."}
]
JOB_ID_HEADER = "X-Streampool-Job-Id"


@pytest.fixture(scope="module")
def process(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    """A real gateway process of this module's own: the clients speak HTTP to a socket."""
    yield from run_gateway(redis_url, tmp_path_factory.mktemp("client-refusals"), allow_unauthenticated=True)


@pytest.fixture
async def carded(card: ModelCard, redis_client: aioredis.Redis, process: KeyedGateway) -> ModelCard:
    """The default model's card, published under the gateway's prefix: the gateway counts prompts."""
    await publish_model_card(redis_client, process.keys, card)
    return card


@pytest.fixture
def sync_openai(process: KeyedGateway) -> Iterator[openai.OpenAI]:
    # No retries: a failure must show as it happened, not as the third attempt.
    with openai.OpenAI(base_url=f"{process.base_url}/v1", api_key="none", max_retries=0) as client:
        yield client


@pytest.fixture
def hf(process: KeyedGateway) -> Iterator[InferenceClient]:
    with InferenceClient(process.base_url) as client:
        yield client


async def _jobs(redis_client: aioredis.Redis, process: KeyedGateway) -> set[str]:
    return {key async for key in redis_client.scan_iter(match=process.keys.job("*"), count=1000)}


@pytest.mark.parametrize(
    ("option", "param"),
    [
        ({"n": 9}, "n"),  # past max_choices (8)
        # tools choose `auto` by default, which the card's pool (no tool-call parser) cannot serve
        (
            {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]},
            "tool_choice",
        ),
        ({"tools": []}, "tools"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "no_schema"}}},
            "response_format",
        ),
        ({"tool_choice": "auto"}, "tool_choice"),
    ],
)
def test_openai_unsupported_option_raises_bad_request_naming_it(
    sync_openai: openai.OpenAI, carded: ModelCard, option: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sync_openai.chat.completions.create(model=CARD_MODEL, messages=QUESTION, max_tokens=4, **option)
    assert caught.value.param == param


def test_openai_unknown_model_raises_not_found(sync_openai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        sync_openai.completions.create(model="gpt-4o", prompt="Hi", max_tokens=4)
    assert caught.value.code == "model_not_found"


@pytest.mark.parametrize("route", ["completion", "chat-stream"])
async def test_openai_prompt_over_the_context_raises_context_length_exceeded_and_makes_no_job(
    sync_openai: openai.OpenAI,
    carded: ModelCard,
    redis_client: aioredis.Redis,
    process: KeyedGateway,
    route: str,
) -> None:
    before = await _jobs(redis_client, process)
    with pytest.raises(openai.BadRequestError) as caught:
        if route == "completion":
            sync_openai.completions.create(model=carded.model, prompt=TOO_LONG, max_tokens=16)
        else:
            sync_openai.chat.completions.create(
                model=carded.model,
                messages=[{"role": "user", "content": TOO_LONG}],
                max_tokens=16,
                stream=True,
            )
    assert caught.value.code == "context_length_exceeded"
    assert str(CARD_CONTEXT) in caught.value.message
    assert caught.value.response.headers.get(JOB_ID_HEADER) is None  # no job was made
    assert await _jobs(redis_client, process) == before


@pytest.mark.parametrize(
    ("parameters", "name"),
    [
        ({"repetition_penalty": 1.3}, "repetition_penalty"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"truncate": 8}, "truncate"),
        ({"details": True, "decoder_input_details": True}, "decoder_input_details"),
        ({"watermark": True}, "watermark"),
        ({"best_of": 2, "do_sample": True}, "best_of"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"top_n_tokens": 3}, "top_n_tokens"),
        ({"grammar": {"type": "regex", "value": "[0-9]+"}}, "grammar"),
    ],
)
def test_tgi_unsupported_parameters_raise_the_client_validation_error(
    hf: InferenceClient, parameters: dict[str, Any], name: str
) -> None:
    with pytest.raises(ValidationError, match=f"parameters.{name}:") as refused:
        hf.text_generation("The capital of France is", max_new_tokens=4, **parameters)
    cause = refused.value.__cause__
    assert isinstance(cause, HfHubHTTPError) and cause.response.status_code == 422


async def test_tgi_prompt_over_the_context_is_a_validation_error_whole_and_streamed(
    hf: InferenceClient, carded: ModelCard, redis_client: aioredis.Redis, process: KeyedGateway
) -> None:
    before = await _jobs(redis_client, process)
    with pytest.raises(ValidationError, match=str(CARD_CONTEXT)) as refused:
        hf.text_generation(TOO_LONG, max_new_tokens=4)
    cause = refused.value.__cause__
    assert isinstance(cause, HfHubHTTPError) and cause.response.status_code == 422
    with pytest.raises(ValidationError, match=str(CARD_CONTEXT)):
        list(hf.text_generation(TOO_LONG, max_new_tokens=4, stream=True))
    assert await _jobs(redis_client, process) == before
