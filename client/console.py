"""Terminal output of the client commands: rich (colour, tables) on a terminal, plain text in a pipe.

Generated text never goes through rich: it is written as it is, since it may hold anything,
rich markup included.
"""

from __future__ import annotations

from datetime import datetime

from rich.console import Console
from rich.table import Table
from rich.text import Text

from shared.events import JobState
from shared.requests import JobRecord

STATE_STYLES = {
    JobState.queued: "yellow",
    JobState.running: "cyan",
    JobState.completed: "green",
    JobState.cancelled: "magenta",
    JobState.failed: "red",
}


def summary(record: JobRecord) -> str:
    """The line after a job's streamed text: how it ended, its tokens and their rate."""
    ending = record.status.value + (f" ({record.finish_reason})" if record.finish_reason else "")
    parts = [ending, f"{record.output.token_count} tokens"]
    if record.started_at and record.finished_at:
        seconds = (record.finished_at - record.started_at).total_seconds()
        if seconds > 0:
            parts.append(f"{record.output.token_count / seconds:.1f} tokens/s")
    return ", ".join(parts)


def _moment(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def record_table(record: JobRecord) -> Table:
    """The record as label and value, leaving out what the job does not have yet."""
    usage = record.usage
    tokens = f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion" if usage else None
    rows: list[tuple[str, str | None, str]] = [
        ("id", record.id, ""),
        ("status", record.status.value, STATE_STYLES[record.status]),
        ("queue position", None if record.queue_position is None else str(record.queue_position), ""),
        ("model", record.model, ""),
        ("worker", record.worker, ""),
        ("created", _moment(record.created_at), ""),
        ("started", _moment(record.started_at), ""),
        ("finished", _moment(record.finished_at), ""),
        ("finish reason", record.finish_reason, ""),
        ("usage (tokens)", tokens, ""),
        ("error", record.error, "red"),
        ("output", f"{record.output.token_count} tokens", ""),
        ("text", record.output.text, ""),
    ]
    table = Table(show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for label, value, style in rows:
        if value is not None:
            table.add_row(label, Text(value, style=style))
    return table


class Terminal:
    """A command's stdout and stderr; rich finds out by itself whether each is a terminal."""

    def __init__(self) -> None:
        self.out = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        self._line_open = False

    def text(self, chunk: str) -> None:
        """Generated text as it arrives: unformatted, and flushed at once."""
        self.out.file.write(chunk)
        self.out.file.flush()
        if chunk:
            self._line_open = not chunk.endswith("\n")

    def end_text(self) -> None:
        """Ends streamed text with a newline on a terminal, so what follows starts a line; a pipe
        gets the text exactly."""
        if self._line_open and self.out.is_terminal:
            self.text("\n")

    def line(self, message: str) -> None:
        self.out.print(Text(message))

    def note(self, message: str) -> None:
        self.err.print(Text(message, style="dim"))

    def error(self, error_type: str, message: str) -> None:
        self.err.print(Text(f"{error_type}: {message}", style="red"))

    def record(self, record: JobRecord, as_json: bool) -> None:
        """The job record: a table on a terminal, JSON in a pipe or when asked for."""
        if as_json or not self.out.is_terminal:
            self.out.print_json(record.model_dump_json())
        else:
            self.out.print(record_table(record))
