"""`POST /v1/files`'s multipart body, read as it arrives: the `file` part's bytes go on to the storage
chunk by chunk, each of its lines checked as JSON on the way (a batch input file), the whole bounded
in bytes and lines, so that a gateway never holds more than a chunk and one line of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from email.message import Message

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from gateway.files.jsonl import Line, LineError, LineSplitter
from shared.errors import BodyTooLarge, InvalidRequest

FILE_FIELD = "file"
PURPOSE_FIELD = "purpose"
MAX_FIELD_BYTES = 1024  # a form field besides the file (`purpose`)


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
    """One upload's form: `file_chunks` streams the file part (checked), after which `filename` and
    `purpose` hold what the form said."""

    def __init__(
        self, body: AsyncIterator[bytes], boundary: bytes, max_bytes: int, max_lines: int, max_line_bytes: int
    ) -> None:
        self.body = body
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self.filename: str | None = None
        self.purpose: str | None = None
        self.fields: dict[str, bytearray] = {}
        self.lines = LineSplitter(max_line_bytes)
        self._header = b""
        self._current = ""
        self._out: list[bytes] = []
        self._size = 0
        self._parser = MultipartParser(
            boundary,
            {
                "on_header_field": self._on_header_field,
                "on_header_value": self._on_header_value,
                "on_headers_finished": self._on_headers_finished,
                "on_part_data": self._on_part_data,
            },
        )
        self._header_name = b""

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._header += data[start:end]

    def _on_headers_finished(self) -> None:
        self._current, filename = _disposition(self._header)
        if self._current == FILE_FIELD:
            self.filename = filename or "upload.jsonl"
        self._header, self._header_name = b"", b""

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._current == FILE_FIELD:
            self._out.append(data[start:end])
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
            self._parse(chunk)
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
        purpose = self.fields.get(PURPOSE_FIELD)
        self.purpose = purpose.decode("utf-8", "replace") if purpose is not None else None
        if self.purpose != "batch":
            raise InvalidRequest("purpose: only 'batch' files are served here", param="purpose")

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
