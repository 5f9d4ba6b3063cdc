"""The notice of what a script appended to job streams, as the gateways' stream readers hear it.

Every script that appends to job streams publishes one message on `Keys.notices`: a line per
entry, either the entry itself (`notice_line`) or only its stream's name, which has the readers
read the stream. A worker's step makes its message itself, for all of its jobs at once
(`step.lua`): the entry's fields cannot hold a line break or the separator, since an event's data
is JSON, which escapes every control character, and its type, id and time are words and numbers.
"""

from __future__ import annotations

LINE = "\n"
UNIT = "\x1f"  # the ASCII unit separator, between an entry's fields


def notice_line(stream: str, entry_id: str, kind: str, at: str, data: str) -> str:
    """One entry as a notice carries it; `gateway.relay.hub` reads it back."""
    return f"{stream}{UNIT}{entry_id}{UNIT}{kind}{UNIT}{at}{UNIT}{data}"
