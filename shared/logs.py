"""Logging set-up: every line a job causes carries that job's id."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

current_job: ContextVar[str] = ContextVar("current_job", default="-")

FORMAT = "%(asctime)s %(levelname)s %(name)s [job=%(job_id)s] %(message)s"


class _JobIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "job_id"):
            record.job_id = current_job.get()
        return True


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(_JobIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


@contextmanager
def job_context(job_id: str) -> Iterator[None]:
    """Tag every log line written inside with `job_id` (asyncio tasks inherit it)."""
    token = current_job.set(job_id)
    try:
        yield
    finally:
        current_job.reset(token)
