"""vLLM's own additions to the OpenAI API for a text model: `/tokenize` and `/detokenize`, and the
bodies of its runtime adapter routes. Pure, no I/O.

The shapes are vLLM's (`vllm/entrypoints/serve/tokenize/protocol.py`,
`vllm/entrypoints/serve/lora/protocol.py`); the tokenizer and chat template are the model card's, the
ones the workers' engine uses, so the answers equal the engine's own.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gateway.compat.openai_bodies import Message, Name, PromptText
from shared.chat import ChatOptions
from shared.errors import InvalidRequest
from shared.prompt_tokens import PromptCounter
from shared.requests import MAX_MESSAGES

LOAD_LORA_ADAPTER_PATH = "/v1/load_lora_adapter"
UNLOAD_LORA_ADAPTER_PATH = "/v1/unload_lora_adapter"
TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"
MAX_TOKEN_ID = 2**63 - 1  # vLLM's bound
MAX_PATH_CHARS = 4096  # Linux's PATH_MAX


class LoadLoRAAdapterBody(BaseModel):
    """vLLM's `LoadLoRAAdapterRequest`, and the model whose workers load it where the gateway serves
    several (vLLM's server serves one; without it, the default or only model)."""

    lora_name: Name
    lora_path: Annotated[str, Field(max_length=MAX_PATH_CHARS)]
    load_inplace: bool = False
    is_3d_lora_weight: bool = False
    model: Name | None = None


class UnloadLoRAAdapterBody(BaseModel):
    """vLLM's `UnloadLoRAAdapterRequest`; adapters go by name (`lora_int_id` is each engine's own)."""

    lora_name: Name
    lora_int_id: int | None = None


class _TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Name | None = None
    return_token_strs: bool | None = False


class TokenizeCompletionBody(_TokenizeBody):
    """A prompt, encoded as a completion's prompt is: with the special tokens (BOS) unless told not to."""

    prompt: PromptText
    add_special_tokens: bool = True


class TokenizeChatBody(_TokenizeBody):
    """Messages through the model's chat template, as a chat completion renders them."""

    messages: Annotated[list[Message], Field(max_length=MAX_MESSAGES)]
    add_generation_prompt: bool = True
    add_special_tokens: bool = False  # the chat template holds them already


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Name | None = None
    # Strict: a JSON `true` is no token id, though Python would take it for 1.
    tokens: Annotated[
        list[Annotated[int, Field(strict=True, ge=0, le=MAX_TOKEN_ID)]], Field(max_length=1_000_000)
    ]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


def tokenize(counter: PromptCounter, body: TokenizeCompletionBody | TokenizeChatBody) -> TokenizeResponse:
    if isinstance(body, TokenizeChatBody):
        messages = [message.job_message() for message in body.messages]
        options = ChatOptions(add_generation_prompt=body.add_generation_prompt)
        text = counter.render_messages(messages, options)
        if text is None:
            raise InvalidRequest("messages: the model has no chat template", param="messages")
    else:
        text = body.prompt
    tokens = counter.encode(text, body.add_special_tokens)
    return TokenizeResponse(
        count=len(tokens),
        max_model_len=counter.card.max_model_len,
        tokens=tokens,
        token_strs=counter.token_strings(tokens) if body.return_token_strs else None,
    )


def detokenize(counter: PromptCounter, body: DetokenizeBody) -> DetokenizeResponse:
    return DetokenizeResponse(prompt=counter.decode(body.tokens))
