"""How long a request may wait in the queue, as every generation route takes it beside its body.

A body's `deadline` is an instant (RFC 3339 or unix seconds), the native API's meaning on every API.
The `X-Streampool-Deadline` header gives the wait in seconds from the request's arrival instead: a
client sets a header once for all its requests (`OpenAI(default_headers=...)`,
`InferenceClient(headers=...)`), where an instant would go stale, and seconds need no clock shared
with the gateway. The body's deadline comes first, then the header's, then the gateway's
`default_queue_deadline_seconds` (admission's: `Admission.admit`). A job still queued at its deadline
fails `deadline_exceeded` without running (`gateway.deadline_sweep`).
"""

from __future__ import annotations

import math
import time

from starlette.datastructures import Headers

from shared.config import GatewaySettings
from shared.errors import InvalidRequest

DEADLINE_HEADER = "X-Streampool-Deadline"


def header_deadline(headers: Headers, settings: GatewaySettings) -> float | None:
    """The deadline (unix seconds) the request's header sets, if it sets one; `InvalidRequest` for a
    value that is no number of seconds above 0 and within a job's lifetime (past it, the job's keys
    expire first: the header is likely an instant given by mistake)."""
    value = headers.get(DEADLINE_HEADER)
    if value is None:
        return None
    most = settings.job_lifetime_seconds
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= most:  # NaN fails too
        raise InvalidRequest(
            f"{DEADLINE_HEADER}: seconds the request may wait in the queue, above 0 and at most {most} "
            f"(a job's lifetime), not {value[:64]!r}; an instant goes in the body's `deadline`",
            param=DEADLINE_HEADER,
        )
    return time.time() + seconds
