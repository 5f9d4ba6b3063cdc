"""The synthetic engine's embeddings: what vLLM's flags make it serve, and answers in the shape of vLLM's
own `EmbeddingResponse` (validated with vLLM's model), drawn from the inputs' tokens."""

from __future__ import annotations

import asyncio
import base64
import math
from array import array
from typing import Any

import pytest

from shared.config import DEFAULT_MODEL_DIR, WorkerSettings
from shared.errors import EngineError
from shared.pooling import PoolingJob
from tests.vllm_protocol import vllm_protocol
from worker.engine import Serving
from worker.model_card import engine_card
from worker.synthetic_engine import SyntheticEngine, read_model_card
from worker.synthetic_pooling import EMBEDDING_DIMENSIONS, synthetic_serving

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def settings() -> WorkerSettings:
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (make setup)")
    return WorkerSettings(
        engine="synthetic",
        synthetic_step_seconds=0.001,
        max_model_len=MAX_MODEL_LEN,
        engine_args=["--runner", "pooling", "--convert", "embed"],
    )


@pytest.fixture(scope="module")
def engine(settings: WorkerSettings) -> SyntheticEngine:
    return SyntheticEngine(settings, read_model_card(settings.model, settings.model_name, MAX_MODEL_LEN))


async def embed(engine: SyntheticEngine, **body: Any) -> dict[str, Any]:
    inputs = body["input"]
    count = len(inputs) if isinstance(inputs, list) and not isinstance(inputs[0], int) else 1
    answer = await engine.pool("job-1", PoolingJob(route="embeddings", body=body, inputs=count))
    vllm_protocol().EmbeddingResponse.model_validate(answer)  # vLLM's own model of the answer takes it
    return answer


@pytest.mark.parametrize(
    ("flags", "serving"),
    [
        ([], Serving(generates=True)),
        (["--max-num-seqs", "8"], Serving(generates=True)),
        (["--runner", "pooling"], Serving(generates=False, pooling_routes=["embeddings"])),
        (["--convert=embed"], Serving(generates=False, pooling_routes=["embeddings"])),
        (
            ["--runner", "pooling", "--convert", "embed"],
            Serving(generates=False, pooling_routes=["embeddings"]),
        ),
    ],
)
def test_vllms_flags_of_an_embedding_pool_make_the_synthetic_engine_serve_embeddings_alone(
    flags: list[str], serving: Serving
) -> None:
    assert synthetic_serving(flags) == serving


async def test_the_model_card_of_an_embedding_pool_says_it_serves_embeddings_and_does_not_generate(
    settings: WorkerSettings, engine: SyntheticEngine
) -> None:
    card = await engine_card(settings, engine)
    assert card is not None
    assert (card.generates, card.pooling_routes) == (False, ["embeddings"])


def test_a_conversion_the_synthetic_engine_cannot_pool_ends_its_start() -> None:
    with pytest.raises(EngineError, match="--convert classify"):
        synthetic_serving(["--runner", "pooling", "--convert", "classify"])


async def test_each_input_gets_a_unit_vector_in_order_the_same_input_the_same_vector(
    engine: SyntheticEngine,
) -> None:
    answer = await embed(engine, model=engine.model_name, input=["a cat", "a dog", "a cat"])
    assert answer["id"] == "embd-job-1"
    assert answer["model"] == engine.model_name
    assert [item["index"] for item in answer["data"]] == [0, 1, 2]
    cat, dog, cat_again = (item["embedding"] for item in answer["data"])
    assert len(cat) == EMBEDDING_DIMENSIONS
    assert math.isclose(math.fsum(value * value for value in cat), 1.0, rel_tol=1e-5)
    assert cat == cat_again != dog
    tokens = sum(
        len(engine._counter.encode(text, add_special_tokens=True)) for text in ["a cat", "a dog", "a cat"]
    )
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] == tokens


async def test_token_ids_are_embedded_as_the_text_they_encode(engine: SyntheticEngine) -> None:
    ids = engine._counter.encode("a cat", add_special_tokens=True)
    by_text = await embed(engine, input="a cat")
    by_ids = await embed(engine, input=ids)
    by_lists = await embed(engine, input=[ids, ids])
    assert by_ids["data"][0]["embedding"] == by_text["data"][0]["embedding"]
    assert [item["embedding"] for item in by_lists["data"]] == [by_text["data"][0]["embedding"]] * 2


async def test_base64_holds_the_float_vectors_as_little_endian_float32(engine: SyntheticEngine) -> None:
    floats = await embed(engine, input=["one", "two"])
    encoded = await embed(engine, input=["one", "two"], encoding_format="base64")
    for as_float, as_text in zip(floats["data"], encoded["data"], strict=True):
        decoded = array("f", base64.b64decode(as_text["embedding"]))
        assert list(decoded) == as_float["embedding"]


async def test_truncate_prompt_tokens_keeps_the_last_tokens_and_counts_only_those(
    engine: SyntheticEngine,
) -> None:
    ids = engine._counter.encode("one two three four five six", add_special_tokens=True)
    truncated = await embed(engine, input="one two three four five six", truncate_prompt_tokens=3)
    assert truncated["usage"]["prompt_tokens"] == 3
    assert truncated["data"][0]["embedding"] == (await embed(engine, input=ids[-3:]))["data"][0]["embedding"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": "hi", "dimensions": 8}, "does not support Matryoshka embeddings"),
        ({"input": "hi " * MAX_MODEL_LEN}, "maximum context length is 64 tokens"),
        ({"input": [10**9]}, "input"),
        ({"input": []}, "embeds `input`"),
        ({"input": "hi", "encoding_format": "bytes"}, "float or base64"),
    ],
)
async def test_what_vllm_refuses_is_a_bad_request_in_its_words(
    engine: SyntheticEngine, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(EngineError, match=message) as refused:
        await engine.pool("job-1", PoolingJob(route="embeddings", body=body))
    assert refused.value.detail["code"] == "BadRequestError"


async def test_a_route_it_does_not_answer_is_refused_as_vllm_refuses_it(engine: SyntheticEngine) -> None:
    job = PoolingJob(route="score", body={"text_1": "a", "text_2": "b"}, inputs=2)
    with pytest.raises(EngineError) as refused:
        await engine.pool("job-1", job)
    assert refused.value.detail["code"] == "NotImplementedError"


async def test_a_pooling_request_counts_among_the_running_requests_until_answered(
    engine: SyntheticEngine,
) -> None:
    answering = asyncio.ensure_future(
        engine.pool("job-1", PoolingJob(route="embeddings", body={"input": "hi"}))
    )
    await asyncio.sleep(0)
    assert engine.running_requests() == 1
    await answering
    assert engine.running_requests() == 0
