"""vLLM's own protocol models, the parser a client of vLLM's server uses, imported the first time a test
asks for them: importing vLLM takes seconds (it brings torch), and raises torch's own deprecation
warnings, which pytest (`filterwarnings = error`) would otherwise turn into failures."""

from __future__ import annotations

import functools
import warnings
from types import SimpleNamespace


@functools.cache
def vllm_protocol() -> SimpleNamespace:
    """`GenerateRequest`, the tokens-in/tokens-out answers and chunks (`GenerateTokensResponse`,
    `GenerateTextResponse`, `GenerateTokensStreamResponse`, `GenerateTextStreamResponse`),
    `ErrorResponse`, `CompletionRequest`, `ChatCompletionRequest` and `SamplingParams`; the chat
    completions' and completions' answers and chunks (`ChatCompletionResponse`,
    `ChatCompletionStreamResponse`, `CompletionResponse`, `CompletionStreamResponse`); the runtime
    adapter routes' bodies (`LoadLoRAAdapterRequest`, `UnloadLoRAAdapterRequest`); the embeddings
    answer (`EmbeddingResponse`); the error its request models raise (`VLLMValidationError`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest,
            ChatCompletionResponse,
            ChatCompletionStreamResponse,
        )
        from vllm.entrypoints.openai.completion.protocol import (
            CompletionRequest,
            CompletionResponse,
            CompletionStreamResponse,
        )
        from vllm.entrypoints.pooling.embed.protocol import EmbeddingResponse
        from vllm.entrypoints.scale_out.token_in_token_out import protocol
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import SamplingParams
    return SimpleNamespace(
        GenerateRequest=protocol.GenerateRequest,
        GenerateTokensResponse=protocol.GenerateTokensResponse,
        GenerateTextResponse=protocol.GenerateTextResponse,
        GenerateTokensStreamResponse=protocol.GenerateTokensStreamResponse,
        GenerateTextStreamResponse=protocol.GenerateTextStreamResponse,
        ErrorResponse=ErrorResponse,
        CompletionRequest=CompletionRequest,
        ChatCompletionRequest=ChatCompletionRequest,
        ChatCompletionResponse=ChatCompletionResponse,
        ChatCompletionStreamResponse=ChatCompletionStreamResponse,
        CompletionResponse=CompletionResponse,
        CompletionStreamResponse=CompletionStreamResponse,
        SamplingParams=SamplingParams,
        LoadLoRAAdapterRequest=LoadLoRAAdapterRequest,
        UnloadLoRAAdapterRequest=UnloadLoRAAdapterRequest,
        EmbeddingResponse=EmbeddingResponse,
        VLLMValidationError=VLLMValidationError,
    )
