"""A pool that plays a Qwen model which thinks and calls tools: the flags `vllm serve` takes for such a
model, and the script its synthetic workers write in that model's stead (the default model cannot write
the hermes parser's `<tool_call>` nor qwen3's `<think>`), so that vLLM's own parsers run on it through
the whole path. A chat whose last message is a tool's result gets the script's second part."""

from __future__ import annotations

from typing import Any

from worker.synthetic_engine import SCRIPT_AFTER_TOOL

REASONING = "I should look it up."
ARGUMENTS = {"city": "Paris"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is sunny in Paris."
AFTER_TOOL = f"<think>The tool says sunny.</think>{ANSWER}"
"""The script's second part: qwen3's parser reads a turn as reasoning until `</think>`."""

SCRIPTED_POOL: dict[str, Any] = {
    "engine": "synthetic",
    "enable_auto_tool_choice": True,
    "tool_call_parser": "hermes",
    "reasoning_parser": "qwen3",
    "synthetic_script": f"<think>{REASONING}</think>{CALL}{SCRIPT_AFTER_TOOL}{AFTER_TOOL}",
}
