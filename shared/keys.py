"""Every Redis key name streampool uses, under one configurable prefix."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix

ANONYMOUS_OWNER = "anonymous"
"""The owner of jobs submitted where no API key is asked for (an owner id is never this word)."""


@dataclass(frozen=True)
class Keys:
    """Key names for one deployment; arq's job keys keep arq's own prefix."""

    prefix: str

    @property
    def queue(self) -> str:
        """arq's sorted set of queued and running jobs."""
        return f"{self.prefix}:queue"

    @property
    def queue_wakeup(self) -> str:
        """Pub/sub channel: a job id each time one is put on the queue, so idle workers take it at once."""
        return f"{self.prefix}:queue:wakeup"

    def job(self, job_id: str) -> str:
        """Hash: the job record."""
        return f"{self.prefix}:job:{job_id}"

    def stream(self, job_id: str) -> str:
        """Stream: the job's events, one entry each."""
        return f"{self.prefix}:job:{job_id}:events"

    def cancel(self, job_id: str) -> str:
        """String: present once a cancel of the running job was asked for."""
        return f"{self.prefix}:job:{job_id}:cancel"

    def lease(self, job_id: str) -> str:
        """String with a TTL: the id of the worker running the job, renewed by its heartbeat."""
        return f"{self.prefix}:job:{job_id}:lease"

    @property
    def running(self) -> str:
        """Set: ids of jobs a worker has started and not yet ended or handed back, for the reapers."""
        return f"{self.prefix}:running"

    def idempotency(self, key: str, owner: str = ANONYMOUS_OWNER) -> str:
        """String: job id one owner submitted under an `Idempotency-Key` (hashed, so any value fits)."""
        return f"{self.prefix}:idempotency:{owner}:{hashlib.sha256(key.encode()).hexdigest()}"

    def worker(self, worker_id: str) -> str:
        """String with a TTL: a worker's heartbeat."""
        return f"{self.prefix}:worker:{worker_id}"

    @property
    def worker_pattern(self) -> str:
        return f"{self.prefix}:worker:*"

    @property
    def model_card(self) -> str:
        """Hash (`digest`, `card`): what the workers serve, for gateways to count prompt tokens."""
        return f"{self.prefix}:model-card"

    def client_name(self, role: str) -> str:
        """CLIENT SETNAME of a process's command connections: `gateway`, or `worker:<id>`."""
        return f"{self.prefix}:{role}"

    @property
    def stream_reader_name(self) -> str:
        """CLIENT SETNAME of a gateway's one stream reader connection."""
        return f"{self.prefix}:stream-reader"

    def job_keys(self, job_id: str) -> list[str]:
        """Keys that live and expire with a job."""
        return [self.job(job_id), self.stream(job_id), self.cancel(job_id)]

    def arq_jobs_among(self, names: list[str]) -> list[str]:
        """arq's job keys of the jobs whose keys are among `names`: what deleting a prefix must add."""
        job_ids = {name.split(":")[2] for name in names if name.startswith(f"{self.prefix}:job:")}
        return [self.arq_job(job_id) for job_id in sorted(job_ids)]

    @staticmethod
    def arq_job(job_id: str) -> str:
        """arq's serialized job, written at submission so that enqueueing costs no extra round trip."""
        return job_key_prefix + job_id

    @staticmethod
    def arq_in_progress(job_id: str) -> str:
        """arq's marker of a job some worker has picked up; it keeps other workers from picking it too."""
        return in_progress_key_prefix + job_id

    @staticmethod
    def arq_retry(job_id: str) -> str:
        """arq's count of a job's tries."""
        return retry_key_prefix + job_id
