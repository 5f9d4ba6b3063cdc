"""Counting a job's prompt tokens from a model card, as the worker's tokenizer will. Pure, no I/O.

Chat messages are rendered the way Hugging Face transformers' `apply_chat_template` renders
them (a sandboxed Jinja environment with `trim_blocks` and `lstrip_blocks`, the special
tokens as variables, the chat's tools, documents and template controls), then encoded without
special tokens; a plain prompt is encoded with them, as the worker does.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple, NoReturn

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from shared.chat import ChatMessage, ChatOptions
from shared.errors import InvalidRequest
from shared.model_card import ModelCard
from shared.requests import JobRequest


class _Generation(Extension):
    """transformers' `{% generation %}` block, which marks assistant text: here it renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # As transformers: unlike Jinja's own filter, no HTML escaping.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def compile_chat_template(source: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment.from_string(source)


@functools.lru_cache(maxsize=16)
def compiled_chat_template(source: str) -> jinja2.Template:
    """A request's own chat template, compiled once for the requests that give the same."""
    return compile_chat_template(source)


def ending_with_final_message(rendered: str, conversation: list[dict[str, Any]]) -> str:
    """The rendering cut after the last message's text, so that the model goes on with it
    (`continue_final_message`), as transformers cuts it; a template that trims it is matched trimmed."""
    final = conversation[-1].get("content") or ""
    if final in rendered:
        return rendered[: rendered.rindex(final) + len(final)]
    if final.strip() in rendered:
        return rendered[: rendered.rindex(final.strip()) + len(final.strip())]
    raise ValueError("continue_final_message is set but the final message does not appear in the chat")


class PromptCounter:
    """The prompt token count of a job on the card's model."""

    def __init__(self, card: ModelCard) -> None:
        self.card = card
        self.digest = card.digest
        self._tokenizer = Tokenizer.from_str(card.tokenizer_json)
        # vLLM's own figure (`max_chars_per_token`): the longest entry of the vocabulary, added tokens too.
        self.max_chars_per_token = max(map(len, self._tokenizer.get_vocab(with_added_tokens=True)), default=1)
        self._template = compile_chat_template(card.chat_template) if card.chat_template else None

    def render_chat(self, request: JobRequest) -> str | None:
        """The chat as the model sees it; None without a chat template (the worker will refuse it)."""
        if request.messages is None:
            return None
        return self.render_messages(request.messages, request)

    def render_messages(self, messages: list[ChatMessage], options: ChatOptions | None = None) -> str | None:
        """Messages through the chat template (the request's own, or the model's; None when it has
        none), with the chat's tools, documents and template controls, as transformers renders them."""
        conversation, kwargs = (options or ChatOptions()).template_inputs(messages)
        source = kwargs.pop("chat_template", None)
        template = self._template if source is None else compiled_chat_template(source)
        if template is None:
            return None
        continue_final_message = kwargs.pop("continue_final_message")
        try:
            rendered = template.render(messages=conversation, **{**self.card.special_tokens, **kwargs})
            return ending_with_final_message(rendered, conversation) if continue_final_message else rendered
        except (jinja2.TemplateError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"messages: the model's chat template refuses them: {exc}") from exc

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def token_ids(self, request: JobRequest) -> list[list[int]]:
        """Each prompt's token ids as the engine gets them, before truncation: a text encoded with the
        special tokens, token ids as given, a chat rendered with its template and encoded without."""
        prompts = request.prompts
        if prompts is None:
            text = self.render_chat(request)
            if text is None:
                raise InvalidRequest("messages: the model has no chat template", param="messages")
            return [self.encode(text, add_special_tokens=False)]
        return [prompt if isinstance(prompt, list) else self.encode(prompt, True) for prompt in prompts]

    @property
    def vocabulary_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def token_id(self, token: str) -> int | None:
        """The id of one token string (a special token, say); None when the vocabulary lacks it."""
        token_id: int | None = self._tokenizer.token_to_id(token)
        return token_id

    def text_stream(self, skip_special_tokens: bool) -> Callable[[int], str]:
        """A decoder of one sequence, token by token: each call gives the text its token adds ("" while
        a character's bytes are incomplete), as vLLM's incremental detokenizer does."""
        stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        return lambda token_id: stream.step(self._tokenizer, token_id) or ""

    def token_strings(self, token_ids: list[int]) -> list[str]:
        """Each token's own string, as transformers' `convert_ids_to_tokens`; "" for an unknown id."""
        return [self._tokenizer.id_to_token(token_id) or "" for token_id in token_ids]

    @property
    def token_id_bound(self) -> int:
        """One past the highest token id the model takes: its tokenizer's, or its embeddings', whichever
        vocabulary is the larger, as vLLM bounds a prompt's ids."""
        return max(self.vocabulary_size, self.card.vocab_size or 0)

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        """`InvalidRequest` naming `param` when an id is none of the model's."""
        bound = self.token_id_bound
        unknown = next((token_id for token_id in token_ids if token_id >= bound), None)
        if unknown is not None:
            reason = f"{unknown} is not a token id of this model (its ids run from 0 to {bound - 1})"
            raise InvalidRequest.of_field(param, reason, param=param)

    @property
    def logits_size(self) -> int:
        """How many logits the model gives a step, by which vLLM bounds `logit_bias` and `stop_token_ids`:
        its embeddings' vocabulary, or its tokenizer's where the card does not say."""
        return self.card.vocab_size or self.vocabulary_size

    def check_sampling_token_ids(self, request: JobRequest) -> None:
        """`InvalidRequest` naming the field, in vLLM's words, for a `logit_bias` or `stop_token_ids` id
        past `logits_size`: the engine would fail the job."""
        size = self.logits_size
        given = {
            "logit_bias": [int(token) for token in request.logit_bias or {}],
            "stop_token_ids": request.stop_token_ids,
        }
        for field, token_ids in given.items():
            unknown = [token_id for token_id in token_ids if token_id >= size]
            if unknown:
                reason = f"token_id(s) {unknown} in {field} contain out-of-vocab token ids"
                raise InvalidRequest.of_field(field, f"{reason}. Vocabulary size: {size}", param=field)

    def decode(self, token_ids: list[int]) -> str:
        """The text of `token_ids`, special tokens kept, as vLLM's `/detokenize` decodes them."""
        self.check_token_ids(token_ids, "tokens")
        return str(self._tokenizer.decode(token_ids, skip_special_tokens=False))

    def count(self, request: JobRequest) -> int | None:
        """How many tokens the prompts are together; None when it cannot be known here."""
        measured = self.measure(request)
        return None if measured is None else sum(measure.tokens for measure in measured)

    def measure(self, request: JobRequest, at_most: int | None = None) -> list[Measure] | None:
        """Each prompt's tokens (a chat is one prompt), where they only matter up to `at_most` tokens: a
        text too long to be that few is not tokenized (as vLLM checks before it tokenizes: a 1 MB prompt
        takes a second of CPU), and is measured by the fewest tokens it can be, which are more than
        `at_most`. Token ids are counted as given. None for a chat the model has no template for."""
        prompts = request.prompts
        if prompts is None:
            rendered = self.render_chat(request)
            return None if rendered is None else [self._measure_text(rendered, False, at_most)]
        return [
            Measure(len(prompt), exact=True, token_ids=prompt)
            if isinstance(prompt, list)
            else self._measure_text(prompt, True, at_most)
            for prompt in prompts
        ]

    def _measure_text(self, text: str, special: bool, at_most: int | None) -> Measure:
        if at_most is not None and len(text) > at_most * self.max_chars_per_token:
            return Measure(least_tokens(len(text), self.max_chars_per_token), exact=False)
        token_ids = self.encode(text, add_special_tokens=special)
        return Measure(len(token_ids), exact=True, token_ids=token_ids)


class Measure(NamedTuple):
    """A prompt's tokens: counted (`exact`, with their ids), or the fewest its text can be."""

    tokens: int
    exact: bool
    token_ids: list[int] | None = None


def least_tokens(chars: int, max_chars_per_token: int | None) -> int:
    """The fewest tokens a text of `chars` characters can be (at least one): no token is longer than
    the longest one of the vocabulary; 1 when that is not known."""
    if not max_chars_per_token:
        return 1
    return max(1, -(-chars // max_chars_per_token))
