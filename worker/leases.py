"""Leases of running jobs: renewed by their worker's heartbeat, released when the worker goes.

A worker that starts a job holds its lease (a key naming the worker, with a short TTL).
While the worker lives, its heartbeat renews the leases of all its jobs in one round trip.
When a lease lapses (the worker died, froze or lost Redis) or the worker hands a job back
(it is stopping), the job is released: put back into arq's queue, still `running` in its
record, for the next worker to resume from its stream; or failed with `worker_lost` once
it has run `max_attempts` times. Every write to a job checks the lease first, so a worker
that lost one can no longer touch the job.
"""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis
from arq.jobs import serialize_job

from shared.jobstore import ARQ_FUNCTION, EXPIRE_JOB_LUA, JobStore
from shared.redis_client import redis_errors

log = logging.getLogger(__name__)

WORKER_LOST = "worker_lost"
LAPSED = "its worker stopped renewing its lease (it died, froze or lost Redis)"

# KEYS: the leases to renew ; ARGV: worker, lease ms. Answers the positions (from 1) of the
# leases the worker no longer holds: it never brings back a lapsed lease or takes another's.
RENEW_LUA = """
local lost = {}
for i, lease in ipairs(KEYS) do
  if redis.call('GET', lease) == ARGV[1] then
    redis.call('PEXPIRE', lease, ARGV[2])
  else
    lost[#lost + 1] = i
  end
end
return lost
"""

# KEYS: record, stream, cancel, lease, running, queue, arq job, arq in-progress, arq retry
# ARGV: id, worker ('' releases only a lapsed lease), max attempts, arq payload, lifetime, score,
#       now, retention, maxlen, failure message, wake-up channel
# arq's in-progress and retry keys of the lost run go, so that arq runs the job again at once.
# A job out of attempts fails with the output its stream holds, after an `error` event
# numbered after the stream's last event.
RELEASE_LUA = (
    EXPIRE_JOB_LUA
    + """
local holder = redis.call('GET', KEYS[4])
if holder and holder ~= ARGV[2] then return 'held' end
redis.call('SREM', KEYS[5], ARGV[1])
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'running' then return status or 'missing' end
if redis.call('HGET', KEYS[1], 'requeued') then return 'requeued' end
redis.call('DEL', KEYS[4], KEYS[8], KEYS[9])
if tonumber(redis.call('HGET', KEYS[1], 'attempts') or '1') < tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'requeued', '1')
  redis.call('SET', KEYS[7], ARGV[4], 'EX', ARGV[5])
  redis.call('ZADD', KEYS[6], ARGV[6], ARGV[1])
  redis.call('PUBLISH', ARGV[11], ARGV[1])
  return 'requeued'
end
local texts, tokens, seq = {}, 0, -1
for _, entry in ipairs(redis.call('XRANGE', KEYS[2], '-', '+')) do
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'data' then
      local event = cjson.decode(fields[i + 1])
      seq = event['seq']
      if event['type'] == 'delta' then
        texts[#texts + 1] = event['text']
        tokens = tokens + #event['token_ids']
      end
    end
  end
end
local failed = cjson.encode({type = 'error', seq = seq + 1, message = ARGV[10], code = '"""
    + WORKER_LOST
    + """'})
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[9], '*', 'type', 'error', 'data', failed)
redis.call('HSET', KEYS[1], 'status', 'failed', 'finished_at', ARGV[7], 'error', ARGV[10],
           'text', table.concat(texts), 'token_count', tokens)
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('DEL', KEYS[7])
expire_job(ARGV[8])
return 'failed'
"""
)


class Leases:
    """Renews, finds lapsed and releases the leases of running jobs."""

    def __init__(self, store: JobStore) -> None:
        self.redis: aioredis.Redis = store.redis
        self.keys = store.keys
        self.settings = store.settings
        self._renew = self.redis.register_script(RENEW_LUA)
        self._release = self.redis.register_script(RELEASE_LUA)

    async def renew(self, worker_id: str, job_ids: list[str]) -> list[str]:
        """Extend the leases `worker_id` holds on `job_ids`; answers the jobs whose lease it lost."""
        if not job_ids:
            return []
        lease_ms = int(self.settings.lease_seconds * 1000)
        with redis_errors():
            lost = await self._renew(
                keys=[self.keys.lease(job_id) for job_id in job_ids], args=[worker_id, lease_ms]
            )
        return [job_ids[position - 1] for position in lost]

    async def lapsed(self) -> list[str]:
        """Jobs started by some worker, not ended, whose lease has lapsed."""
        with redis_errors():
            job_ids = sorted(await self.redis.smembers(self.keys.running))  # type: ignore[misc]
            if not job_ids:
                return []
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.exists(self.keys.lease(job_id))
                held = await pipe.execute()
        return [job_id for job_id, exists in zip(job_ids, held, strict=True) if not exists]

    async def release(self, job_id: str, reason: str, worker_id: str = "") -> str:
        """Requeue a running job for another worker to resume, or fail it once out of attempts.

        Without `worker_id`, only a lapsed lease is released (a reaper's call); with it, also
        that worker's own (a worker handing its job back). Answers `requeued`, `failed`, `held`
        (another worker holds the lease) or the state of a job that is not running.
        """
        now = time.time()
        keys = [
            *self.keys.job_keys(job_id),
            self.keys.lease(job_id),
            self.keys.running,
            self.keys.queue,
            self.keys.arq_job(job_id),
            self.keys.arq_in_progress(job_id),
            self.keys.arq_retry(job_id),
        ]
        attempts = self.settings.max_attempts
        args: list[str | int | bytes] = [
            job_id,
            worker_id,
            attempts,
            serialize_job(ARQ_FUNCTION, (job_id,), {}, None, int(now * 1000)),
            self.settings.job_lifetime_seconds,
            int(now * 1000),
            repr(now),
            self.settings.retention_seconds,
            self.settings.stream_maxlen,
            f"{reason}; the job has run {attempts} time{'s' if attempts > 1 else ''} (max_attempts)",
            self.keys.queue_wakeup,
        ]
        with redis_errors():
            return str(await self._release(keys=keys, args=args))

    async def reap(self) -> None:
        """Release every running job whose lease lapsed; each worker does this every half lease."""
        for job_id in await self.lapsed():
            answer = await self.release(job_id, LAPSED)
            if answer in ("requeued", "failed"):
                log.warning("job %s: its worker's lease lapsed; %s", job_id, answer)
