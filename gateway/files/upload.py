"""`POST /v1/files`'s multipart body, read as it arrives: the `file` part's bytes go on to the storage
chunk by chunk, each of its lines checked as JSON on the way (a batch input file), the whole bounded
in bytes and lines, so that a gateway never holds more than a chunk and one line of it.

Every byte of the body counts: the file part's against `max_file_bytes`, all the rest (the other
fields, each part's headers, the boundaries) against `max_body_bytes`. Of the other fields only those
the route reads are kept, each at most `MAX_FIELD_BYTES`; any other is read past and dropped."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from email.message import Message

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from gateway.files.jsonl import Line, LineError, LineSplitter
from shared.errors import BodyTooLarge, InvalidRequest

FILE_FIELD = "file"
PURPOSE_FIELD = "purpose"
ANCHOR_FIELD = "expires_after[anchor]"  # as the `openai` package sends `expires_after`
SECONDS_FIELD = "expires_after[seconds]"
KEPT_FIELDS = frozenset({PURPOSE_FIELD, ANCHOR_FIELD, SECONDS_FIELD})
MAX_FIELD_BYTES = 1024  # a kept form field
EXPIRES_AFTER_SECONDS = (3600, 2_592_000)  # OpenAI's bounds on `expires_after[seconds]`: 1 hour to 30 days


def boundary_of(content_type: str) -> bytes:
    """The multipart boundary of a `Content-Type`; `InvalidRequest` for a body that is not multipart."""
    kind, params = parse_options_header(content_type)
    if kind != b"multipart/form-data" or b"boundary" not in params:
        raise InvalidRequest("the body must be multipart/form-data, with a file and a purpose", param="file")
    return params[b"boundary"]


def _disposition(raw: bytes) -> tuple[str, str | None]:
    """The form field's name and filename from its `Content-Disposition` header."""
    message = Message()
    message["content-disposition"] = raw.decode("utf-8", "replace")
    return message.get_param("name", "", "content-disposition") or "", message.get_filename()  # type: ignore[return-value]


class Upload:
    """One upload's form: `file_chunks` streams the file part (checked), after which `filename`,
    `purpose` and `expires_after` (seconds, or None) hold what the form said."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        boundary: bytes,
        max_bytes: int,
        max_lines: int,
        max_line_bytes: int,
        max_form_bytes: int,
    ) -> None:
        self.body = body
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self.max_form_bytes = max_form_bytes
        self.filename: str | None = None
        self.purpose: str | None = None
        self.expires_after: int | None = None
        self.fields: dict[str, bytearray] = {}
        self.lines = LineSplitter(max_line_bytes)
        self._header = b""
        self._header_name = b""
        self._current = ""
        self._out: list[bytes] = []
        self._size = 0
        self._received = 0  # the body's bytes, every part's
        self._file_received = 0  # those of the file part's data
        self._parser = MultipartParser(
            boundary,
            {
                "on_header_field": self._on_header_field,
                "on_header_value": self._on_header_value,
                "on_header_end": self._on_header_end,
                "on_headers_finished": self._on_headers_finished,
                "on_part_data": self._on_part_data,
            },
        )

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._header += data[start:end]

    def _on_header_end(self) -> None:
        self._header_name = b""  # a part's headers come in any order: each names itself

    def _on_headers_finished(self) -> None:
        self._current, filename = _disposition(self._header)
        if self._current == FILE_FIELD:
            if self.filename is not None:
                raise InvalidRequest("file: the form holds more than one file", param="file")
            self.filename = filename or "upload.jsonl"
        self._header = b""

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._current == FILE_FIELD:
            self._file_received += end - start
            self._out.append(data[start:end])
            return
        if self._current not in KEPT_FIELDS:
            return
        field = self.fields.setdefault(self._current, bytearray())
        field += data[start:end]
        if len(field) > MAX_FIELD_BYTES:
            raise InvalidRequest(f"{self._current}: longer than {MAX_FIELD_BYTES} bytes", param=self._current)

    def _checked(self, chunk: bytes) -> bytes:
        self._size += len(chunk)
        if self._size > self.max_bytes:
            raise BodyTooLarge(f"the file is larger than {self.max_bytes} bytes (max_file_bytes)")
        self._check(self.lines.feed(chunk))
        return chunk

    def _check(self, lines: Iterable[Line]) -> None:
        """Each line JSON, and no more of them than `max_lines`."""
        try:
            for line in lines:
                if line.number > self.max_lines:
                    raise InvalidRequest(
                        f"the file holds more than {self.max_lines} lines (max_file_lines)", param="file"
                    )
                line.parsed()
        except LineError as exc:
            raise InvalidRequest(
                f"the file is no JSONL batch input: {exc}", param="file", line=exc.line
            ) from None

    async def file_chunks(self) -> AsyncIterator[bytes]:
        """The file part's bytes as they arrive, each line checked; the form's other fields are read
        on the way."""
        async for chunk in self.body:
            self._received += len(chunk)
            self._parse(chunk)
            if self._received - self._file_received > self.max_form_bytes:
                raise BodyTooLarge(
                    f"the form beside the file is larger than {self.max_form_bytes} bytes (max_body_bytes)"
                )
            for part in self._take():
                yield self._checked(part)
        self._parse(None)
        for part in self._take():
            yield self._checked(part)
        self._check(self.lines.finish())
        if self.filename is None:
            raise InvalidRequest("file: a file is required", param="file")
        if self.lines.number == 0:
            raise InvalidRequest("file: the file holds no line", param="file")
        self.purpose = self._field(PURPOSE_FIELD)
        if self.purpose != "batch":
            raise InvalidRequest("purpose: only 'batch' files are served here", param="purpose")
        self.expires_after = self._expires_after()

    def _field(self, name: str) -> str | None:
        value = self.fields.get(name)
        return value.decode("utf-8", "replace") if value is not None else None

    def _expires_after(self) -> int | None:
        """`expires_after[seconds]` after `expires_after[anchor]` (`created_at`, the one anchor), or None
        where the form names no expiry."""
        anchor, seconds = self._field(ANCHOR_FIELD), self._field(SECONDS_FIELD)
        if anchor is None and seconds is None:
            return None
        if anchor != "created_at":
            raise InvalidRequest("expires_after.anchor: must be 'created_at'", param="expires_after.anchor")
        low, high = EXPIRES_AFTER_SECONDS
        if seconds is None or not seconds.strip().isdigit() or not low <= int(seconds) <= high:
            raise InvalidRequest(
                f"expires_after.seconds: must be a whole number of seconds from {low} to {high}",
                param="expires_after.seconds",
            )
        return int(seconds)

    def _parse(self, chunk: bytes | None) -> None:
        """Feed the parser a chunk, or tell it the body has ended (None); a body that is no multipart
        form is the client's error (400), not the gateway's."""
        try:
            if chunk is None:
                self._parser.finalize()
            else:
                self._parser.write(chunk)
        except FormParserError as exc:
            raise InvalidRequest(f"the body is no multipart/form-data: {exc}", param="file") from None

    def _take(self) -> list[bytes]:
        taken, self._out = self._out, []
        return [part for part in taken if part]
