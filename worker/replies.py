"""A chat's output split as vLLM's server splits it: the answer's content, the model's reasoning and its
tool calls, by vLLM's own parsers (`vllm.parser`), chosen per pool as `vllm serve` chooses them
(`enable_auto_tool_choice`, `tool_call_parser`, `tool_parser_plugin`, `reasoning_parser`).

The parsing happens here, once, as the worker writes the job's stream: every reader (a replay, another
gateway, a batch's output, a webhook) reads the same parts. Imported only by a worker whose pool parses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
)
from vllm.parser.abstract_parser import Parser
from vllm.parser.parser_manager import ParserManager
from vllm.tokenizers import TokenizerLike, get_tokenizer
from vllm.tool_parsers import ToolParserManager

from shared.config import WorkerSettings
from shared.events import FunctionDelta, ToolCallDelta
from shared.requests import JobRequest
from worker.engine import EngineDelta


def vllm_chat_request(request: JobRequest) -> ChatCompletionRequest:
    """The job as vLLM's chat completion request: what its parsers read (tools, tool choice,
    reasoning options) and adjust (the constraint a tool choice sets)."""
    structured = request.structured_outputs
    body: dict[str, Any] = {
        "messages": [message.model_dump(exclude_none=True) for message in request.messages or []],
        "stream": True,
        **request.model_dump(
            include={
                "tools",
                "tool_choice",
                "parallel_tool_calls",
                "chat_template_kwargs",
                "include_reasoning",
                "reasoning_effort",
                "add_generation_prompt",
                "continue_final_message",
            },
            exclude_none=True,
        ),
    }
    if request.tools is not None:
        body["tool_choice"] = _plain(request.effective_tool_choice)
    if structured is not None:
        body["structured_outputs"] = structured.model_dump(exclude_none=True)
    return ChatCompletionRequest.model_validate(body)


def _plain(choice: object) -> object:
    return choice.model_dump() if hasattr(choice, "model_dump") else choice


class ReplyParsing:
    """A pool's parsers: vLLM's `Parser` class composed from the pool's flags, one instance a choice."""

    def __init__(self, settings: WorkerSettings, tokenizer: TokenizerLike | None = None) -> None:
        """`tokenizer`: the engine's, where it has vLLM's; otherwise vLLM loads the model folder's."""
        if tokenizer is None:
            tokenizer = get_tokenizer(str(settings.model))
        if settings.tool_parser_plugin:
            ToolParserManager.import_tool_parser(settings.tool_parser_plugin)
        self.tokenizer = tokenizer
        self.enable_auto_tools = settings.enable_auto_tool_choice
        # vLLM refuses at start a parser the tokenizer cannot serve: so does the worker.
        self.parser_cls = ParserManager.get_parser(
            tool_parser_name=settings.tool_call_parser,
            reasoning_parser_name=settings.reasoning_parser,
            enable_auto_tools=settings.enable_auto_tool_choice,
            model_name=settings.model_name,
            tokenizer=tokenizer,
        )

    def reply(self, request: JobRequest, prompt_token_ids: list[int]) -> Reply | None:
        """The parsing of a chat job's output; None for a prompt's, or where the pool parses nothing."""
        if self.parser_cls is None or request.messages is None:
            return None
        chat = vllm_chat_request(request)
        kwargs = request.template_kwargs()
        # As vLLM's renderer: the request is adjusted (a tool choice's constraint) when it reasons or
        # calls tools; a choice of none leaves hallucinated calls as text.
        if self.parser_cls.reasoning_parser_cls is not None or chat.tool_choice != "none":
            chat = self.parser_for(chat, kwargs).adjust_request(request=chat)  # type: ignore[assignment]
        return Reply(self, chat, kwargs, list(prompt_token_ids))

    def parser_for(self, chat: ChatCompletionRequest, kwargs: dict[str, Any]) -> Parser:
        """A fresh parser of the pool's class for one choice of `chat` (vLLM's parsers keep state)."""
        assert self.parser_cls is not None
        tools: list[Any] | None = list(chat.tools) if chat.tools is not None else None
        return self.parser_cls(self.tokenizer, tools, chat_template_kwargs=kwargs)


@dataclass
class Reply:
    """One chat job's parsing: a parser a choice, fed each engine delta in order."""

    parsing: ReplyParsing
    chat: ChatCompletionRequest
    template_kwargs: dict[str, Any]
    prompt_token_ids: list[int]
    parsers: dict[int, Parser] = field(default_factory=dict)
    called: set[int] = field(default_factory=set)
    """The choices that streamed a tool call."""

    @property
    def engine_options(self) -> dict[str, Any]:
        """What vLLM's chat serving gives its engine beside the sampling options: the constraint the
        tool choice set (it replaces the job's own), and where reasoning ends, for that constraint."""
        parser = self._choice_parser(0)
        options: dict[str, Any] = {
            "reasoning_ended": self.chat.resolve_reasoning_ended(parser, self.prompt_token_ids)
        }
        if self.chat.structured_outputs is not None:
            options["structured_outputs"] = self.chat.structured_outputs
        if parser.reasoning_parser is not None:
            options["reasoning_parser_kwargs"] = {"chat_template_kwargs": self.template_kwargs}
        return options

    def _choice_parser(self, index: int) -> Parser:
        if index not in self.parsers:
            self.parsers[index] = self.parsing.parser_for(self.chat, self.template_kwargs)
        return self.parsers[index]

    def resumed(self, emitted: list[int]) -> None:
        """Bring the first choice's parser to where a run before this one stopped, its parts already in
        the stream: the tokens it emitted go through it once, and what it makes of them is dropped."""
        if emitted:
            text = self.parsing.tokenizer.decode(emitted)
            self._choice_parser(0).parse_delta(
                text, emitted, self.chat, self.prompt_token_ids, finished=False
            )

    def parse(self, delta: EngineDelta) -> EngineDelta:
        """The delta with its text split into content, reasoning and tool-call parts; a choice that
        called tools ends `tool_calls`, as vLLM's server ends it (but for a named choice: `stop`)."""
        message = self._choice_parser(delta.index).parse_delta(
            delta.text, delta.token_ids, self.chat, self.prompt_token_ids, finished=delta.finished
        )
        calls = [] if message is None else message.tool_calls
        if self.chat.parallel_tool_calls is False:
            calls = [call for call in calls if call.index == 0]
        tool_calls = [
            ToolCallDelta(
                index=call.index,
                id=call.id,
                type=call.type,
                function=FunctionDelta(
                    name=call.function.name if call.function else None,
                    arguments=(call.function.arguments or "") if call.function else "",
                ),
            )
            for call in calls
        ]
        if tool_calls:
            self.called.add(delta.index)
        finish_reason = delta.finish_reason
        named = isinstance(self.chat.tool_choice, ChatCompletionNamedToolChoiceParam)
        if delta.finished and finish_reason == "stop" and delta.index in self.called and not named:
            finish_reason = "tool_calls"
        return replace(
            delta,
            text=(message.content or "") if message is not None else "",
            reasoning=(message.reasoning or "") if message is not None else "",
            tool_calls=tool_calls or None,
            finish_reason=finish_reason,
            # As vLLM: with the reasoning hidden, so are the tokens' logprobs, which would show it.
            logprobs=delta.logprobs if self.chat.include_reasoning else None,
        )
