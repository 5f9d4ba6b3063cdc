"""The default model as an embedding model (`--runner pooling --convert embed`: vLLM pools a causal LM's
last token) on the real engine, side by side with vLLM's own server started with the same flags: the
vectors, scores and rankings streampool answers through the `openai` package (`embeddings.create`, float
and base64, and a batch of embeddings lines through `files` and `batches`) equal vLLM's within float
tolerance, and vLLM's refusals are answered in vLLM's words.

One fixture starts both engines (`engines`): each start costs the suite tens of seconds, so every test
of pooling on the real engine is here (tests/schedule.py keeps the module in one process)."""

from __future__ import annotations

import base64
import math
import warnings
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from bench import vllm_server
from bench.system import START_TIMEOUT_SECONDS, start
from tests.conftest import SYSTEM_START_TIMEOUT, System, make_settings, run_system
from tests.helpers import completed_batch
from tests.processes import free_port

EMBEDDING_FLAGS = ["--runner", "pooling", "--convert", "embed"]
TOLERANCE = 1e-3  # of each coordinate, relative to the vector's largest: both engines run float32 on the CPU
# The engines' start counts against the first test's time limit, whichever test comes first.
pytestmark = pytest.mark.timeout(SYSTEM_START_TIMEOUT + START_TIMEOUT_SECONDS)
TEXTS = [
    "The lighthouse keeper lit the lamp at dusk.",
    "A recipe for bread needs flour, water, salt and yeast.",
    "Ships steer clear of the rocks by the light.",
]
TOKENS = [[1, 504, 2743, 28, 253, 1559], [1, 15691, 314, 2260]]


@dataclass
class Engines:
    """A streampool pool of the embedding model (one worker), and vLLM's server on the same flags."""

    system: System
    vllm_url: str


@pytest.fixture(scope="module")
def engines(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    """Both engines start side by side: one after the other, on a loaded machine, they outlast a test's
    time limit."""
    port = free_port()
    settings = make_settings(redis_url, engine="vllm", engine_args=EMBEDDING_FLAGS)
    with warnings.catch_warnings():  # the flags come from the worker's engine arguments: vLLM's import
        warnings.simplefilter("ignore", DeprecationWarning)
        flags = vllm_server.server_flags(settings, port)
    server = start("vllm-server", ["bench.vllm_server", *flags], settings, tmp_path_factory.mktemp("vllm"))
    try:
        pooled = run_system(
            redis_url, tmp_path_factory, engine="vllm", workers=1, engine_args=EMBEDDING_FLAGS
        )
        system = next(pooled)
        try:
            vllm_server.wait_ready(port, server)
            yield Engines(system, f"http://127.0.0.1:{port}")
        finally:
            pooled.close()
    finally:
        vllm_server.stop(server)


@pytest.fixture(scope="module")
def system(engines: Engines) -> System:
    """The module's streampool: the `openai` clients of tests/e2e/conftest.py talk to it."""
    return engines.system


@pytest.fixture
def vllm_openai(engines: Engines) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{engines.vllm_url}/v1", api_key="none", max_retries=0, timeout=120
    ) as client:
        yield client


def assert_close(ours: list[float], theirs: list[float]) -> None:
    assert len(ours) == len(theirs)
    scale = max(map(abs, theirs))
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) <= TOLERANCE * scale


def decoded(text: str) -> list[float]:
    """A base64 embedding as vLLM encodes it: float32, in the machine's order."""
    return list(array("f", base64.b64decode(text)))


@pytest.mark.parametrize(
    "given", [TEXTS[0], TEXTS, TOKENS[0], TOKENS], ids=["text", "texts", "ids", "id-lists"]
)
def test_embeddings_equal_vllms_server_as_floats(
    sync_openai: openai.OpenAI, vllm_openai: openai.OpenAI, given: Any
) -> None:
    model = sync_openai.models.list().data[0].id
    ours = sync_openai.embeddings.create(model=model, input=given, encoding_format="float")
    theirs = vllm_openai.embeddings.create(model=model, input=given, encoding_format="float")
    assert [item.index for item in ours.data] == [item.index for item in theirs.data]
    assert len(ours.data) == (1 if isinstance(given, str) or isinstance(given[0], int) else len(given))
    for mine, vllms in zip(ours.data, theirs.data, strict=True):
        assert_close(mine.embedding, vllms.embedding)
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens
    assert ours.model == theirs.model


def test_embeddings_equal_vllms_server_in_base64_decoded_or_as_the_client_decodes_it(
    sync_openai: openai.OpenAI, vllm_openai: openai.OpenAI
) -> None:
    model = sync_openai.models.list().data[0].id
    ours = sync_openai.embeddings.create(model=model, input=TEXTS, encoding_format="base64")
    theirs = vllm_openai.embeddings.create(model=model, input=TEXTS, encoding_format="base64")
    for mine, vllms in zip(ours.data, theirs.data, strict=True):
        assert isinstance(mine.embedding, str) and isinstance(vllms.embedding, str)
        assert_close(decoded(mine.embedding), decoded(vllms.embedding))
    # Given no format, the client asks for base64 and decodes it itself.
    default = sync_openai.embeddings.create(model=model, input=TEXTS)
    for mine, vllms in zip(default.data, theirs.data, strict=True):
        assert_close(mine.embedding, decoded(str(vllms.embedding)))


def test_truncated_inputs_equal_vllms_and_a_refusal_of_vllms_is_in_its_words(
    sync_openai: openai.OpenAI, vllm_openai: openai.OpenAI
) -> None:
    model = sync_openai.models.list().data[0].id
    truncated: Any = {"truncate_prompt_tokens": 4}
    ours = sync_openai.embeddings.create(
        model=model, input=TEXTS, extra_body=truncated, encoding_format="float"
    )
    theirs = vllm_openai.embeddings.create(
        model=model, input=TEXTS, extra_body=truncated, encoding_format="float"
    )
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens == 4 * len(TEXTS)
    for mine, vllms in zip(ours.data, theirs.data, strict=True):
        assert_close(mine.embedding, vllms.embedding)
    with pytest.raises(openai.BadRequestError) as our_refusal:
        sync_openai.embeddings.create(model=model, input=TEXTS[0], dimensions=8)
    with pytest.raises(openai.BadRequestError) as their_refusal:
        vllm_openai.embeddings.create(model=model, input=TEXTS[0], dimensions=8)
    assert our_refusal.value.body == their_refusal.value.body


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/score", {"queries": "Where is the light?", "documents": TEXTS}),
        ("/v1/score", {"text_1": TEXTS[0], "text_2": TEXTS[2]}),
        ("/rerank", {"query": "Where is the light?", "documents": TEXTS, "top_n": 2}),
        ("/v2/rerank", {"query": "What is in bread?", "documents": TEXTS}),
    ],
)
def test_scores_and_rankings_equal_vllms_server(
    engines: Engines, sync_openai: openai.OpenAI, path: str, body: dict[str, Any]
) -> None:
    model = sync_openai.models.list().data[0].id
    ours = httpx.post(f"{engines.system.base_url}{path}", json={"model": model, **body}, timeout=120)
    theirs = httpx.post(f"{engines.vllm_url}{path}", json={"model": model, **body}, timeout=120)
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    mine, vllms = ours.json(), theirs.json()
    assert mine["usage"] == vllms["usage"]
    if "results" in vllms:
        assert [item["index"] for item in mine["results"]] == [item["index"] for item in vllms["results"]]
        assert [item["document"] for item in mine["results"]] == [
            item["document"] for item in vllms["results"]
        ]
        scored = zip(mine["results"], vllms["results"], strict=True)
        pairs = [(a["relevance_score"], b["relevance_score"]) for a, b in scored]
    else:
        assert [item["index"] for item in mine["data"]] == [item["index"] for item in vllms["data"]]
        pairs = [(a["score"], b["score"]) for a, b in zip(mine["data"], vllms["data"], strict=True)]
    assert all(math.isclose(a, b, abs_tol=TOLERANCE) for a, b in pairs), pairs


def test_the_pooling_route_equals_vllms_server(engines: Engines, sync_openai: openai.OpenAI) -> None:
    """vLLM's `/pooling`, the pooler's output of each input: for an embedding model, its vector."""
    body = {"model": sync_openai.models.list().data[0].id, "input": TEXTS}
    ours = httpx.post(f"{engines.system.base_url}/pooling", json=body, timeout=120)
    theirs = httpx.post(f"{engines.vllm_url}/pooling", json=body, timeout=120)
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    mine, vllms = ours.json(), theirs.json()
    assert mine["usage"] == vllms["usage"]
    assert [item["index"] for item in mine["data"]] == [item["index"] for item in vllms["data"]] == [0, 1, 2]
    for a, b in zip(mine["data"], vllms["data"], strict=True):
        assert_close(a["data"], b["data"])


def test_a_generation_request_to_the_embedding_model_is_400_naming_what_it_serves(
    sync_openai: openai.OpenAI,
) -> None:
    model = sync_openai.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as refused:
        sync_openai.completions.create(model=model, prompt="Once upon a time", max_tokens=4)
    message = refused.value.message
    assert f"model {model} does not generate: it is a pooling model" in message
    assert "embeddings" in message and refused.value.param == "model"


def test_a_batch_of_embeddings_lines_answers_vllms_vectors_in_openais_output_lines(
    sync_openai: openai.OpenAI, vllm_openai: openai.OpenAI
) -> None:
    model = sync_openai.models.list().data[0].id
    bodies = [{"model": model, "input": text, "encoding_format": "float"} for text in TEXTS]
    bodies.append({"model": model, "input": TOKENS, "encoding_format": "base64"})
    lines = [
        {"custom_id": f"e{n}", "method": "POST", "url": "/v1/embeddings", "body": body}
        for n, body in enumerate(bodies)
    ]
    output = completed_batch(sync_openai, lines, "/v1/embeddings")
    assert [line["custom_id"] for line in output] == [line["custom_id"] for line in lines]
    for line, body in zip(output, bodies, strict=True):
        assert line["error"] is None and line["response"]["status_code"] == 200
        answer = line["response"]["body"]
        assert answer["object"] == "list" and answer["model"] == model
        theirs = vllm_openai.embeddings.create(**body)
        for mine, vllms in zip(answer["data"], theirs.data, strict=True):
            assert mine["index"] == vllms.index
            if body["encoding_format"] == "float":
                assert_close(mine["embedding"], vllms.embedding)
            else:
                assert_close(decoded(mine["embedding"]), decoded(str(vllms.embedding)))
