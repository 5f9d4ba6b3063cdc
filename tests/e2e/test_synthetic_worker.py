"""Workers on the synthetic engine (`STREAMPOOL_ENGINE=synthetic`) serve a deployment end to end:
a gateway and the workers as `streampool` processes, on a real Redis, with no model weights loaded."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from shared.config import DEFAULT_MODEL_DIR
from shared.prompt_tokens import PromptCounter
from tests.conftest import System
from tests.helpers import read_sse, streamed_text, streamed_token_ids, submit
from worker.synthetic_engine import read_model_card


@pytest.fixture(scope="module")
def synthetic_url(synthetic_system: System) -> str:
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (make setup)")
    return synthetic_system.base_url


@pytest.fixture
async def client(synthetic_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=synthetic_url, timeout=60) as http:
        yield http


async def test_a_job_streams_to_its_end_with_exact_usage(client: httpx.AsyncClient) -> None:
    job_id = await submit(client, prompt="The three primary colors are", max_tokens=20, ignore_eos=True)
    events = [event for _, event in await read_sse(client, job_id)]
    record = (await client.get(f"/v1/jobs/{job_id}")).json()
    done = events[-1]
    assert done["type"] == "done" and done["finish_reason"] == "length"
    assert record["status"] == "completed" and record["output"]["text"] == streamed_text(events) != ""
    assert len(streamed_token_ids(events)) == done["usage"]["completion_tokens"] == 20
    card = read_model_card(DEFAULT_MODEL_DIR, "any", 2048)
    prompt_tokens = len(PromptCounter(card).encode("The three primary colors are", add_special_tokens=True))
    assert done["usage"]["prompt_tokens"] == prompt_tokens


async def test_the_openai_client_gets_a_chat_answer(synthetic_url: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{synthetic_url}/v1", api_key="unused") as api:
        answer = await api.chat.completions.create(
            model=DEFAULT_MODEL_DIR.name,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=8,
            seed=4,
            extra_body={"ignore_eos": True},
        )
    assert answer.choices[0].finish_reason == "length" and answer.usage is not None
    assert answer.usage.completion_tokens == 8 and answer.choices[0].message.content
