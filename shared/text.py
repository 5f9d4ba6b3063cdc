"""Text as every part of the system takes it: tokenizers, chat templates and Redis."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


def _plain_text(value: str) -> str:
    """Text that tokenizers, templates and Redis all take as it is. NUL is text like any other
    character (vLLM takes it, and its benchmark's random prompts hold it at some seeds)."""
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode text (it holds a lone surrogate)") from None
    return value


Text = Annotated[str, AfterValidator(_plain_text)]
"""A string that holds no lone surrogate (which JSON's `\\ud800` escapes can make)."""
