"""The chat template a pool renders chats with, where its `--chat-template` names one instead of the
tokenizer's: read as `vllm serve` reads it, by vLLM's own `load_chat_template` (a file, the name of one
of vLLM's built-in templates, or the template's text)."""

from __future__ import annotations

import warnings

from shared.errors import EngineError


def load(chat_template: str | None) -> str | None:
    """The template's text, None where the setting names none; `EngineError` with vLLM's message for a
    file that cannot be read, which ends the worker's start."""
    if chat_template is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's, as vLLM is imported
        from vllm.exceptions import VLLMValidationError
        from vllm.renderers.chat_utils import load_chat_template  # imports vLLM: only where one is given

    try:
        return load_chat_template(chat_template)
    except (OSError, VLLMValidationError) as exc:
        raise EngineError(f"--chat-template: {exc}") from exc
