"""JSON Lines read from chunks as they come: no file is ever held whole. Pure, no I/O."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shared import json_text


class LineError(Exception):
    """A line that cannot be: too long, not JSON, not an object. `line` counts from 1."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass
class Line:
    """One line of a file: its number (from 1), its bytes without the newline, and the byte offset just
    past it (where the next line begins)."""

    number: int
    data: bytes
    end: int

    def parsed(self) -> dict[str, Any]:
        """The line's JSON object; `LineError` when it is none (JSON as a request body must be: nested
        no deeper than `json_text.MAX_JSON_DEPTH`, numbers finite)."""
        try:
            value = json_text.loads(self.data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise LineError(self.number, f"not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise LineError(self.number, "not a JSON object")
        return value


class LineSplitter:
    """Cuts chunks into lines; blank lines are skipped but counted in the byte offsets. Holds at most
    one unfinished line, of at most `max_line_bytes`."""

    def __init__(self, max_line_bytes: int, offset: int = 0, first_line: int = 1) -> None:
        self.max_line_bytes = max_line_bytes
        self.offset = offset  # of the start of `_pending`
        self.number = first_line - 1
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> Iterator[Line]:
        start = 0
        while (newline := chunk.find(b"\n", start)) >= 0:
            self._pending += chunk[start:newline]
            yield from self._line(len(self._pending) + 1)
            start = newline + 1
        self._pending += chunk[start:]
        if len(self._pending) > self.max_line_bytes:
            raise LineError(self.number + 1, f"longer than {self.max_line_bytes} bytes")

    def finish(self) -> Iterator[Line]:
        """The last line, when the file does not end with a newline."""
        if self._pending:
            yield from self._line(len(self._pending))

    def _line(self, length: int) -> Iterator[Line]:
        data = bytes(self._pending).strip()
        self._pending.clear()
        self.offset += length
        if len(data) > self.max_line_bytes:
            raise LineError(self.number + 1, f"longer than {self.max_line_bytes} bytes")
        if data:
            self.number += 1
            yield Line(self.number, data, self.offset)
