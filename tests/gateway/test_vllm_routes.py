"""vLLM's routes beside the OpenAI API (`/tokenize`, `/detokenize`, `/version`, `/v1/models/{id}`),
answered from the model card of the real default model, as a worker publishes it; no worker runs
(a heartbeat stands in for one where a route needs a live worker)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import DEFAULT_MODEL_DIR, Settings
from shared.keys import Keys
from shared.model_card import ModelCard
from tests.conftest import make_settings
from tests.gateway.stand_ins import CARD_CONTEXT as CONTEXT
from tests.gateway.stand_ins import CARD_MODEL as MODEL
from tests.gateway.stand_ins import heartbeat
from tests.redis_cleanup import delete_prefix

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PROMPT = "Once upon a time, in a lighthouse by the sea, there lived"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]


@pytest.fixture(scope="module")
def tokenizer(card: ModelCard) -> PreTrainedTokenizerBase:
    """The tokenizer the engine loads, to hold the gateway's answers against. Imported here, not at the
    top: every test process collects this module, and only those that run its tests need transformers."""
    from transformers import AutoTokenizer

    loaded: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL_DIR))
    return loaded


@pytest.fixture
async def settings(redis_url: str) -> AsyncIterator[Settings]:
    settings = make_settings(redis_url, allow_unauthenticated=True)
    yield settings
    delete_prefix(redis_url, settings.key_prefix)


def _chat_tokens(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The chat as vLLM tokenizes it: rendered with the template, then encoded without more special tokens."""
    text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    tokens: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return tokens


async def _post(gateway: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = await gateway.post(path, json=body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


@pytest.mark.parametrize("add_special_tokens", [True, False])
async def test_tokenize_a_prompt_as_the_engine_tokenizer_does(
    gateway: httpx.AsyncClient,
    published: ModelCard,
    tokenizer: PreTrainedTokenizerBase,
    add_special_tokens: bool,
) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "add_special_tokens": add_special_tokens}
    answer = await _post(gateway, "/tokenize", body)
    expected = tokenizer.encode(PROMPT, add_special_tokens=add_special_tokens)
    assert answer == {
        "count": len(expected),
        "max_model_len": CONTEXT,
        "tokens": expected,
        "token_strs": None,
    }


async def test_tokenize_a_chat_through_the_chat_template_with_token_strings(
    gateway: httpx.AsyncClient, published: ModelCard, tokenizer: PreTrainedTokenizerBase
) -> None:
    answer = await _post(gateway, "/tokenize", {"messages": CHAT, "return_token_strs": True})
    expected = _chat_tokens(tokenizer)
    assert answer["tokens"] == expected and answer["count"] == len(expected)
    assert answer["token_strs"] == tokenizer.convert_ids_to_tokens(expected)
    without = await _post(gateway, "/tokenize", {"messages": CHAT, "add_generation_prompt": False})
    assert without["count"] < answer["count"]


async def test_detokenize_gives_the_text_special_tokens_kept(
    gateway: httpx.AsyncClient, published: ModelCard, tokenizer: PreTrainedTokenizerBase
) -> None:
    tokens = _chat_tokens(tokenizer)
    answer = await _post(gateway, "/detokenize", {"model": MODEL, "tokens": tokens})
    assert answer == {"prompt": tokenizer.decode(tokens)}
    assert answer["prompt"].startswith("<|im_start|>system")


async def test_detokenize_refuses_an_id_the_model_does_not_have(
    gateway: httpx.AsyncClient, published: ModelCard, tokenizer: PreTrainedTokenizerBase
) -> None:
    too_large = len(tokenizer)  # ids run from 0; tokenizers would fail on ids past 2**32
    for token_id in (too_large, 2**40):
        answer = await gateway.post("/detokenize", json={"tokens": [1, token_id]})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "tokens"
        assert str(token_id) in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body"), [("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1, 2]})]
)
async def test_tokenizing_without_a_model_card_is_503(
    gateway: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    answer = await gateway.post(path, json=body)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["type"] == "server_error"


@pytest.mark.parametrize(
    ("path", "body"), [("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1, 2]})]
)
async def test_tokenizing_for_another_model_is_404_model_not_found(
    gateway: httpx.AsyncClient, published: ModelCard, path: str, body: dict[str, Any]
) -> None:
    answer = await gateway.post(path, json={**body, "model": "gpt-5"})
    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "hi", "unknown": 1},
        {"tokens": [-1]},
        {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi"},
    ],
)
async def test_bodies_vllm_would_refuse_are_400_in_openai_shape(
    gateway: httpx.AsyncClient, published: ModelCard, body: dict[str, Any]
) -> None:
    path = "/detokenize" if "tokens" in body else "/tokenize"
    answer = await gateway.post(path, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"


async def test_version_is_streampools(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.get("/version")
    assert answer.status_code == 200
    assert answer.json() == {"version": version("streampool")}


async def test_one_model_in_openai_shape_and_404_for_another(
    gateway: httpx.AsyncClient, settings: Settings, redis_client: aioredis.Redis
) -> None:
    await heartbeat(redis_client, Keys.of(settings), "fake-worker", "org/some-model")
    listed = (await gateway.get("/v1/models")).json()["data"]
    one = await gateway.get("/v1/models/org/some-model")
    assert one.status_code == 200, one.text
    assert one.json() == listed[0]
    assert (one.json()["id"], one.json()["object"], one.json()["root"]) == (
        "org/some-model",
        "model",
        "org/some-model",
    )
    for unknown in ("another", "line%0Abreak"):  # a line break too reaches the route, not a bare 404
        other = await gateway.get(f"/v1/models/{unknown}")
        assert other.status_code == 404, other.text
        assert other.json()["error"]["code"] == "model_not_found"
