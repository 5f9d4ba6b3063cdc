"""The synthetic engine's pooling: embeddings drawn from the inputs' tokens, in vLLM's answer's shape.

Given vLLM's flags of an embedding pool (`--runner pooling`, `--convert embed`), the synthetic engine
serves `/v1/embeddings` as such a pool does, for load tests and for tests of the queue: each input's
vector is drawn from its tokens (the same input, the same vector), of unit length as vLLM's embedding
pooler leaves it, and the answer has the shape of vLLM's `EmbeddingResponse`. Other pooling routes and
chat inputs need the real engine.
"""

from __future__ import annotations

import base64
import math
import random
import sys
import time
import zlib
from array import array
from typing import Any

from shared.errors import EngineError, InvalidRequest
from shared.prompt_tokens import PromptCounter
from worker.engine import Serving

EMBEDDING_DIMENSIONS = 64
"""The length of the synthetic engine's vectors (a model's hidden size: 576 for SmolLM2-135M)."""

POOLING_RUNNER = "pooling"
EMBED = "embed"
GENERATING_CONVERSIONS = (None, "auto", "none")


def _flag(engine_args: list[str], name: str) -> str | None:
    """The value of `--name` in vLLM's engine flags (`--name value` or `--name=value`), the last one
    given; None when it is not given."""
    value = None
    for number, word in enumerate(engine_args):
        if word == name and number + 1 < len(engine_args):
            value = engine_args[number + 1]
        elif word.startswith(f"{name}="):
            value = word.partition("=")[2]
    return value


def synthetic_serving(engine_args: list[str]) -> Serving:
    """What a synthetic pool serves by vLLM's flags: embeddings where they make an embedding pool of the
    model (`--runner pooling`, `--convert embed`), generation otherwise."""
    runner, convert = _flag(engine_args, "--runner"), _flag(engine_args, "--convert")
    if runner != POOLING_RUNNER and convert in GENERATING_CONVERSIONS:
        return Serving(generates=True)
    if convert not in (*GENERATING_CONVERSIONS, EMBED):
        raise EngineError(
            f"--convert {convert}: the synthetic engine pools embeddings alone (--convert embed)"
        )
    return Serving(generates=False, pooling_routes=["embeddings"])


def _refused(message: str) -> EngineError:
    return EngineError(message, code="BadRequestError")


class SyntheticEmbeddings:
    """Embedding answers of a synthetic pool, its inputs tokenized as the model's tokenizer does."""

    def __init__(self, counter: PromptCounter, model_name: str, max_model_len: int) -> None:
        self._counter = counter
        self._model_name = model_name
        self._max_model_len = max_model_len

    def answer(self, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM's `EmbeddingResponse` to an embeddings request: vectors in `encoding_format` (float or
        base64 of little-endian float32, as vLLM's defaults), usage counting the inputs' tokens."""
        if body.get("dimensions") is not None:  # vLLM's words for a model without Matryoshka embeddings
            raise _refused(
                f"Model {self._model_name!r} does not support Matryoshka embeddings; dimensions must be "
                f"unset (received dimensions={body['dimensions']})."
            )
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise _refused(f"encoding_format {encoding!r}: the synthetic engine answers float or base64")
        inputs = [self._tokens(one, body) for one in _inputs(body)]
        data = [
            {"index": index, "object": "embedding", "embedding": _encoded(_vector(tokens), encoding)}
            for index, tokens in enumerate(inputs)
        ]
        prompt_tokens = sum(map(len, inputs))
        return {
            "id": f"embd-{request_id}",
            "object": "list",
            "created": int(time.time()),
            "model": self._model_name,
            "data": data,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
        }

    def _tokens(self, one: str | list[int], body: dict[str, Any]) -> list[int]:
        """An input's tokens, less what `truncate_prompt_tokens` leaves out (from `truncation_side`)."""
        if isinstance(one, str):
            tokens = self._counter.encode(one, add_special_tokens=bool(body.get("add_special_tokens", True)))
        else:
            try:
                self._counter.check_token_ids(one, "input")
            except InvalidRequest as exc:
                raise _refused(exc.message) from exc
            tokens = one
        keep = body.get("truncate_prompt_tokens")
        if isinstance(keep, int) and keep >= 0 and len(tokens) > keep:
            tokens = tokens[:keep] if body.get("truncation_side") == "right" else tokens[len(tokens) - keep :]
        if len(tokens) > self._max_model_len:
            raise _refused(
                f"This model's maximum context length is {self._max_model_len} tokens. However, your "
                f"request has {len(tokens)} input tokens. Please reduce the length of the input messages."
            )
        return tokens


def _inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """`input` as a list of inputs: a text, texts, token ids, or lists of token ids."""
    given = body.get("input")
    if isinstance(given, str):
        return [given]
    if isinstance(given, list) and given and all(isinstance(item, int) for item in given):
        return [given]
    if isinstance(given, list) and given and all(isinstance(item, str | list) for item in given):
        return list(given)
    raise _refused("the synthetic engine embeds `input`: a text, texts, token ids or lists of token ids")


def _vector(tokens: list[int]) -> list[float]:
    """A unit vector drawn from the tokens: the same tokens, the same vector."""
    draw = random.Random(zlib.crc32(array("q", tokens).tobytes()))
    values = [draw.gauss(0.0, 1.0) for _ in range(EMBEDDING_DIMENSIONS)]
    norm = math.sqrt(sum(value * value for value in values))
    # float32, as a model's outputs are
    return list(array("f", [value / norm for value in values]))


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    packed = array("f", vector)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()
