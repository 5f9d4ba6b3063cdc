"""A batch's input lines, checked as OpenAI checks them, and the bodies they hold. Pure, no I/O.

A line is `{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body": {...}}`. What makes
a line no request of the batch (not JSON, no custom_id or one seen before, another url, no model or
an unknown one) fails the whole batch while it is validated, before any job exists; what a request's
body asks that a job cannot do is that request's error, in the error file, as its own route would
have answered it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gateway.compat.openai_bodies import CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, ChatBody, CompletionBody
from gateway.compat.pooling import EMBEDDINGS_PATH, EmbeddingsBody
from gateway.compat.responses_bodies import RESPONSES_PATH, ResponsesBody
from gateway.files.jsonl import Line, LineError
from shared.batches import BatchError
from shared.errors import InvalidRequest

Body = ChatBody | CompletionBody | ResponsesBody | EmbeddingsBody
BODIES: dict[str, type[Body]] = {
    CHAT_COMPLETIONS_PATH: ChatBody,
    COMPLETIONS_PATH: CompletionBody,
    RESPONSES_PATH: ResponsesBody,
    EMBEDDINGS_PATH: EmbeddingsBody,
}
GENERATING = (ChatBody, CompletionBody, ResponsesBody)
"""The bodies whose routes may stream: a line's answers whole (`stream: false`)."""


class LineRefused(Exception):
    """A line that is no request of the batch: the batch fails with `error`."""

    def __init__(self, error: BatchError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch: its line's number, its `custom_id`, its model and its body (as JSON)."""

    number: int
    custom_id: str
    model: str
    body: dict[str, Any]

    def request(self, endpoint: str) -> Body:
        """The body as its endpoint's route takes it; `InvalidRequest` (naming the parameter) when it is
        no valid one."""
        model = BODIES[endpoint]
        whole = {"stream": False} if issubclass(model, GENERATING) else {}
        try:
            body = model.model_validate(self.body | whole)
        except ValidationError as exc:
            error = exc.errors()[0]
            param = ".".join(str(part) for part in error["loc"]) or None
            raise InvalidRequest(f"{param}: {error['msg']}" if param else error["msg"], param=param) from None
        if isinstance(body, ResponsesBody):
            body.refuse_unsupported()
            if body.previous_response_id is not None:
                raise InvalidRequest(
                    "previous_response_id: a batch's requests stand alone", param="previous_response_id"
                )
        return body


def _refused(line: int, code: str, message: str, param: str | None = None) -> LineRefused:
    return LineRefused(BatchError(code=code, message=message, param=param, line=line))


def batch_line(line: Line, endpoint: str) -> BatchLine:
    """The request of `line`; `LineRefused` saying why it is none."""
    try:
        value = line.parsed()
    except LineError as exc:
        raise _refused(line.number, "invalid_json_line", str(exc)) from None
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _refused(
            line.number, "missing_required_parameter", "custom_id: a string is required", "custom_id"
        )
    if value.get("method") != "POST":
        raise _refused(line.number, "invalid_value", "method: must be POST", "method")
    if value.get("url") != endpoint:
        message = f"url: {value.get('url')!r} is not the batch's endpoint {endpoint}"
        raise _refused(line.number, "mismatched_endpoint", message, "url")
    body = value.get("body")
    if not isinstance(body, dict):
        raise _refused(line.number, "missing_required_parameter", "body: an object is required", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _refused(
            line.number, "missing_required_parameter", "body.model: a string is required", "body.model"
        )
    return BatchLine(line.number, custom_id, model, body)
