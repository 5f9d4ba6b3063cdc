"""A chat as a job holds it: messages (tool calls and their results among them), the tools offered,
and how the chat template renders them, in the shapes and with the checks of vLLM's chat completions.

The gateway counts a chat's tokens and the worker renders it from the same `template_inputs`, so the
two agree on what the model sees.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.constraint_bounds import schema_problem
from shared.text import Text

MAX_PROMPT_CHARS = 1_000_000
MAX_TOOLS = 128
MAX_TOOL_CALLS = 128
MAX_NAME_CHARS = 256
MAX_SCHEMA_CHARS = 65_536
MAX_DOCUMENTS = 128

Name = Annotated[Text, Field(min_length=1, max_length=MAX_NAME_CHARS)]
Label = Annotated[Text, Field(max_length=MAX_NAME_CHARS)]
"""A message's `name` or `tool_call_id`: any short text, empty too, as vLLM takes them."""
Content = Annotated[Text, Field(max_length=MAX_PROMPT_CHARS)]


class FunctionCall(BaseModel):
    """A call the model made: the function's name and its arguments as JSON text, as OpenAI gives them."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name
    arguments: Content


class ToolCall(BaseModel):
    """An assistant message's tool call, as OpenAI's `message.tool_calls` holds it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: Name
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message of a chat. `tool` messages answer a call (`tool_call_id`); an assistant's may hold
    `tool_calls` and no content, and the `reasoning` it gave, which templates of reasoning models read."""

    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: Content | None = None
    name: Label | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: Label | None = None
    reasoning: Content | None = None

    @model_validator(mode="after")
    def _as_its_role_has_it(self) -> ChatMessage:
        check_role_fields(self.role, self.content, self.tool_calls)
        return self

    @property
    def chars(self) -> int:
        """The characters the template gets from this message, for the gateway's prompt bounds."""
        calls = sum(len(call.function.arguments) for call in self.tool_calls or [])
        return len(self.content or "") + len(self.reasoning or "") + calls

    def template_message(self) -> dict[str, Any]:
        """The message as chat templates read it, as vLLM hands it over: an assistant turn of calls
        alone has empty content, its reasoning goes under both names templates read, and each tool
        call's arguments are an object rather than JSON text (templates iterate over them)."""
        message = self.model_dump(exclude_none=True)
        message.setdefault("content", "")
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        for call in message.get("tool_calls", []):
            call["function"]["arguments"] = _arguments_object(call["function"]["arguments"])
        return message


def check_role_fields(role: str, content: object, tool_calls: list[Any] | None) -> None:
    """`ValueError` for a message whose fields its role has not: tool calls are an assistant's, and
    only an assistant's turn of calls may go without content."""
    if tool_calls is not None and role != "assistant":
        raise ValueError("only an assistant message has tool_calls")
    if content is None and not (role == "assistant" and tool_calls):
        raise ValueError("content is required, save for an assistant message with tool_calls")


def _arguments_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # as vLLM: text that is no JSON goes to the template as it is


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name
    description: Content | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _small_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        """A tool's parameters become a grammar for `required` and named choices: bounded as
        `structured_outputs.json` is."""
        if schema is None:
            return None
        if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
            raise ValueError(f"must be at most {MAX_SCHEMA_CHARS} characters of JSON")
        if (problem := schema_problem(schema)) is not None:
            raise ValueError(f"refused before compiling: {problem}")
        return schema


class Tool(BaseModel):
    """A function the model may call (`tools`), as OpenAI's and vLLM's chat completions take it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name


class NamedToolChoice(BaseModel):
    """`tool_choice` naming the one function to call."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
Document = dict[Name, Content]


class ChatOptions(BaseModel):
    """What a chat's job takes beyond its messages: tools, and the chat template's controls, under
    vLLM's names and with its defaults (`tool_choice` is `auto` when tools are given, else `none`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = Field(
        None, description="functions the model may call; rendered into the prompt by the chat template"
    )
    tool_choice: ToolChoice | None = Field(
        None,
        description="none, auto (the model decides: needs a worker pool with a tool-call parser), "
        "required (at least one call), or a named function; default auto with tools, else none",
    )
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call")
    chat_template: Content | None = Field(
        None, description="a Jinja chat template instead of the model's (where the pool trusts it)"
    )
    chat_template_kwargs: dict[Name, Any] | None = Field(
        None, description="extra variables for the chat template, e.g. enable_thinking"
    )
    add_generation_prompt: bool = Field(True, description="open the assistant's turn after the messages")
    continue_final_message: bool = Field(
        False, description="go on with the last (assistant) message instead of opening a new one"
    )
    documents: Annotated[list[Document], Field(max_length=MAX_DOCUMENTS)] | None = Field(
        None, description="documents for retrieval-augmented templates, each a mapping of text"
    )
    reasoning_effort: ReasoningEffort | None = Field(
        None, description="passed to the chat template; 'none' also sets enable_thinking false"
    )
    include_reasoning: bool = Field(True, description="false: the reasoning is left out of the output")
    thinking_token_budget: int | None = Field(
        None, ge=-1, le=1_000_000, description="the most reasoning tokens (vLLM's; -1: no bound)"
    )

    @model_validator(mode="after")
    def _as_vllm_checks(self) -> ChatOptions:
        """vLLM's checks of the same fields, in its words."""
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        choice = self.tool_choice
        if choice not in (None, "none") and self.tools is None:
            raise ValueError("When using `tool_choice`, `tools` must be set.")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in self.tool_names:
            raise ValueError(
                "The tool specified in `tool_choice` does not match any of the specified `tools`"
            )
        return self

    @property
    def tool_names(self) -> list[str]:
        return [tool.function.name for tool in self.tools or []]

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """The choice the job runs with: vLLM's default where none is given."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @property
    def calls_tools(self) -> bool:
        """The output may hold tool calls: tools are given and the choice is not `none`."""
        return self.tools is not None and self.effective_tool_choice != "none"

    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's variables beside the messages and tools, as vLLM's `build_chat_params`
        sets them (its parsers get the same): `reasoning_effort` also turns thinking on or off where the
        request's kwargs do not say."""
        kwargs: dict[str, Any] = {
            **(self.chat_template_kwargs or {}),
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
        }
        if self.documents is not None:
            kwargs["documents"] = self.documents
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
            if "enable_thinking" not in (self.chat_template_kwargs or {}):
                kwargs["enable_thinking"] = self.reasoning_effort != "none"
        return kwargs

    def template_inputs(self, messages: list[ChatMessage]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The conversation and the keyword arguments of transformers' `apply_chat_template`, as the
        worker calls it and the gateway's count follows it (`chat_template`: the request's own, if any)."""
        kwargs = self.template_kwargs()
        if self.tools is not None:
            kwargs["tools"] = [tool.model_dump(exclude_none=True) for tool in self.tools]
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        return [message.template_message() for message in messages], kwargs
