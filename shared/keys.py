"""Every Redis key name streampool uses, under one configurable prefix."""

from __future__ import annotations

import hashlib
import itertools
import uuid
import zlib
from dataclasses import dataclass, fields
from functools import cached_property

from redis.crc import REDIS_CLUSTER_HASH_SLOTS as SLOTS
from redis.crc import key_slot

from shared.config import RedisSettings
from shared.redis_url import is_cluster

STREAM_SUFFIX = ":events"  # of a job's stream's name, after its id
ANONYMOUS_OWNER = "anonymous"
"""The owner of jobs submitted where no API key is asked for (an owner id is never this word)."""


def share_member(created_at: float, job_id: str) -> str:
    """A job's member in its tenant's share of its model's queue, as `share_member.lua` writes it:
    its submission time in ms (15 digits, so that members of one priority sort by age), and its id."""
    return f"{int(created_at * 1000):015d}:{job_id}"


@dataclass(frozen=True)
class ModelKeys:
    """Every key about one model, under `<prefix>:model:<name>`: its queue, the tenants' shares of
    it, and what serves it."""

    root: str

    @property
    def queue(self) -> str:
        """arq's sorted set of the model's queued jobs (a started job leaves it), scored by submission ms."""
        return f"{self.root}:queue"

    @property
    def wakeup(self) -> str:
        """Pub/sub channel: a job id each time one is put on the model's queue, so that its idle
        workers take it at once."""
        return f"{self.root}:queue:wakeup"

    @property
    def share_tenants(self) -> str:
        """Sorted set: the tenants with jobs in the model's queue, each scored by its pass, the virtual
        time of its next job (`claim.lua`): the lowest pass is served next."""
        return f"{self.root}:share:tenants"

    @property
    def share_state(self) -> str:
        """Hash: the model's virtual clock (`clock`), and per tenant its stride (`stride:<name>`, one
        over its weight) and the pass it had when its last queued job was taken (`pass:<name>`)."""
        return f"{self.root}:share:state"

    @property
    def share_queue_prefix(self) -> str:
        """Followed by a tenant's name: a sorted set of the tenant's jobs in the model's queue,
        members `<submission ms, 15 digits>:<job id>` scored by priority, so that they read in order
        of priority (lower first, as vLLM orders), then of submission (`share_member`). Start and
        cancel take a job's entry out; the claim drops one whose job left the queue otherwise."""
        return f"{self.root}:share:queue:"

    @property
    def batch_share_tenants(self) -> str:
        """Sorted set: as `share_tenants`, for the batch band (`shared.batches`): shares named
        `batch:<tenant>`, served only when no interactive share has a job to give (`claim.lua`)."""
        return f"{self.root}:share:batch-tenants"

    @property
    def deadlines(self) -> str:
        """Sorted set: the model's queued jobs that have a deadline, scored by it (unix seconds; by when
        the job's record expires, if that comes first), written with the job (`submit.lua`); a job
        leaves it as it leaves the queue (`leave_queue.lua`), and the gateways' deadline sweep ends those
        whose score has come (`expire.lua`)."""
        return f"{self.root}:deadlines"

    @property
    def prefix_blocks(self) -> str:
        """Hash: prompt block hash (`shared.scheduling`) -> the worker whose cache took that block last
        (`advertise.lua`), for a submission to find the worker holding its prefix (`prefix_holder.lua`)."""
        return f"{self.root}:prefix-blocks"

    @property
    def preferred_prefix(self) -> str:
        """Prefix of sorted sets, one a worker and tenant share (+ `<worker>:<share>`): the share's
        queued jobs whose prefix that worker held at their submission, the head priority's longest
        first (`submit.lua`); a claim of that worker's takes them first (`claim.lua`), and drops those
        gone."""
        return f"{self.root}:preferred:"

    def worker_blocks(self, worker_id: str) -> str:
        """Sorted set: the blocks one worker advertised, by when it last used them, at most its cache's
        blocks; it expires with the worker's claims (`advertise.lua`)."""
        return f"{self.root}:worker-blocks:{worker_id}"

    @property
    def worker_loads(self) -> str:
        """Hash: worker id -> `<running jobs>:<ms>` as of its last claim, for a claim to leave a job no
        worker holds to the least loaded one (`claim.lua`)."""
        return f"{self.root}:worker-loads"

    @property
    def card(self) -> str:
        """Hash (`digest`, `card`): the model's tokenizer and context, for gateways to count prompt tokens."""
        return f"{self.root}:card"


@dataclass(frozen=True)
class JobKeys:
    """The keys of one job and of its model, in the one order every lifecycle script that touches a job
    takes them first (`job_keys.lua` reads them; a script's own keys follow): the job's record, stream
    ('' where the streams have a Redis of their own), cancel key, lease, the started jobs (`running`),
    the webhooks stream and the job's delivery record; its model's queue, deadlines and share keys, and
    the count of expired jobs. A script uses those it needs."""

    record: str
    stream: str
    cancel: str
    lease: str
    running: str
    webhooks: str
    webhook: str
    queue: str
    deadlines: str
    share_tenants: str
    share_state: str
    batch_share_tenants: str
    expired: str

    def listed(self) -> list[str]:
        """As the scripts' first KEYS: in the order of the fields above."""
        return [getattr(self, field.name) for field in fields(self)]


@dataclass(frozen=True)
class Keys:
    """Key names for one deployment, arq's queues among them (`ModelKeys.queue`)."""

    prefix: str
    partitions: int = 0
    """With the job streams on a Redis Cluster: how many partitions they are spread over, a job's by
    its id (`partition`). The data-plane keys of a partition carry its hash tag (`partition_tag`), so
    that they share one slot: a script, or an XREAD, may name several keys only of one slot, and a
    partition moves between masters whole. 0: no partitions, the names as one Redis has them."""
    notice_partitions: int = 1
    """How many channels the notices of new stream entries are spread over, a job's by its id
    (`notice_partition`), so that a gateway hears only of the streams it relays: on one Redis the
    setting's, on a Redis Cluster the streams' partitions (each its shard channel)."""

    @classmethod
    def of(cls, settings: RedisSettings) -> Keys:
        """The keys of the deployment `settings` name: partitioned when its streams are on a cluster."""
        url = settings.streams_redis_url
        if url is not None and is_cluster(url):
            return cls(settings.key_prefix, settings.stream_partitions, settings.stream_partitions)
        return cls(settings.key_prefix, 0, settings.notice_partitions)

    def partition(self, job_id: str) -> int:
        """The partition of a job's data-plane keys (with `partitions`)."""
        return zlib.crc32(job_id.encode()) % self.partitions

    @cached_property
    def _partition_tags(self) -> tuple[str, ...]:
        """Each partition's hash tag, `{p<n>-<k>}` with the first k whose slot is in the n-th of
        `partitions` equal ranges of the slots: a cluster's masters hold equal ranges as
        `redis-cli --cluster create` makes them, and so hold as many partitions as the partitions
        and masters allow (`{p<n>}` alone would fall where CRC16 puts it: 16 partitions on three
        masters 4, 5 and 7)."""
        tags = []
        for partition in range(self.partitions):
            low, high = partition * SLOTS // self.partitions, (partition + 1) * SLOTS // self.partitions
            tag = next(
                tag
                for k in itertools.count()
                if low <= key_slot((tag := f"p{partition}-{k}").encode()) < high
            )
            tags.append(f"{{{tag}}}")
        return tuple(tags)

    def partition_tag(self, partition: int) -> str:
        """The hash tag, braces included, of a partition's data-plane keys and notices."""
        return self._partition_tags[partition]

    def _job_data(self, job_id: str) -> str:
        """What a job's data-plane keys start with: its partition's hash tag when there are partitions."""
        if not self.partitions:
            return f"{self.prefix}:job:{job_id}"
        return f"{self.prefix}:{self.partition_tag(self.partition(job_id))}:job:{job_id}"

    def model(self, name: str) -> ModelKeys:
        """The keys of the model `name` (its canonical name): its queue, wake-ups and card."""
        return ModelKeys(f"{self.prefix}:model:{name}")

    @property
    def models(self) -> str:
        """Hash: canonical model name -> its registry entry (JSON, `shared.models.ModelEntry`), written
        by the workers' heartbeats; a model stays known after its last worker is gone."""
        return f"{self.prefix}:models"

    @property
    def jobs_expired(self) -> str:
        """Hash, no TTL: canonical model name -> how many of its jobs failed unrun past their deadline
        (`expire_unrun.lua`), for `streampool_jobs_expired_total` (a field per model: bounded)."""
        return f"{self.prefix}:jobs-expired"

    @property
    def runtime_adapters(self) -> str:
        """Hash: adapter name -> the LoRA adapter loaded at run time (JSON, `shared.adapters.RuntimeAdapter`),
        which every worker of its model loads; written by the gateway's `/v1/load_lora_adapter`."""
        return f"{self.prefix}:runtime-adapters"

    def of_job(self, job_id: str, model: str) -> JobKeys:
        """The keys of the job `job_id` of the model `model` (its canonical name), in the scripts' order."""
        queue = self.model(model)
        return JobKeys(
            record=self.job(job_id),
            stream=self.stream(job_id),
            cancel=self.cancel(job_id),
            lease=self.lease(job_id),
            running=self.running,
            webhooks=self.webhooks,
            webhook=self.webhook(job_id),
            queue=queue.queue,
            deadlines=queue.deadlines,
            share_tenants=queue.share_tenants,
            share_state=queue.share_state,
            batch_share_tenants=queue.batch_share_tenants,
            expired=self.jobs_expired,
        )

    def job(self, job_id: str) -> str:
        """Hash: the job record."""
        return f"{self.prefix}:job:{job_id}"

    def stream(self, job_id: str) -> str:
        """Stream: the job's events, one entry each."""
        return f"{self._job_data(job_id)}{STREAM_SUFFIX}"

    def cancel(self, job_id: str) -> str:
        """String: present once a cancel of the running job was asked for."""
        return f"{self.prefix}:job:{job_id}:cancel"

    def webhook(self, job_id: str) -> str:
        """Hash: the delivery record of the job's webhook (attempts, last answer, when delivered), written
        when the job ends, updated by the sender; it outlives its last change by the retention period."""
        prefix, suffix = self.webhook_affixes
        return f"{prefix}{job_id}{suffix}"

    @cached_property
    def webhook_affixes(self) -> tuple[str, str]:
        """What comes before and after the job id in a delivery record's name, for the script that gives
        up a tenant's oldest deliveries, which it finds by their entries (`gateway/webhooks/hold.lua`)."""
        return f"{self.prefix}:job:", ":webhook"

    @property
    def webhooks(self) -> str:
        """Stream: one entry per ended job with a webhook, read by the gateways' senders through a
        consumer group; an entry is deleted once delivered or given up, so the stream holds only the
        deliveries under way."""
        return f"{self.prefix}:webhooks"

    def tenant_webhooks(self, tenant: str) -> str:
        """Sorted set: the webhooks stream's entry ids of one tenant's deliveries under way, scored by
        the entry's time (ms), added by the sender that holds one and removed where the entry leaves the
        stream: what `webhook_max_pending_per_tenant` bounds (`gateway/webhooks/hold.lua`)."""
        return f"{self.prefix}:tenant:{tenant}:webhooks"

    def lease(self, job_id: str) -> str:
        """String with a TTL: the id of the worker running the job, renewed by its heartbeat, followed
        by `@<when>` once a cancel of the job is asked for (`shared/lifecycle/lease.lua` reads it); or
        `claim:<worker id>` from a worker's claim of the queued job until its start."""
        prefix, suffix = self.lease_affixes
        return f"{prefix}{job_id}{suffix}"

    def writer(self, job_id: str) -> str:
        """String with a TTL, on the streams' own Redis (`streams_redis_url`): the worker whose steps
        the job's stream takes, as its lease names it there (`<worker>[@<when a cancel was asked>]`),
        written after the lease at each start and ended before any other hand takes the job, so that a
        worker that lost the job appends nothing. With the streams beside the lease, the lease itself."""
        return f"{self._job_data(job_id)}:writer"

    @cached_property
    def lease_affixes(self) -> tuple[str, str]:
        """What comes before and after the job id in a lease's name, for the claim script, which
        names the leases of the jobs it picks (kept: a step names every job's lease)."""
        return f"{self.prefix}:job:", ":lease"

    @property
    def replication_fence(self) -> str:
        """String: written before every WAIT, so that the WAIT covers every earlier write on any
        connection (`shared.replication`)."""
        return f"{self.prefix}:replication-fence"

    @property
    def replicas_seen(self) -> str:
        """Sorted set, no TTL: its one member `replicas` scored by the most replicas the master has been
        seen with: above 0, a write waits for a replica by default (`shared.replication`); it only grows."""
        return f"{self.prefix}:replicas-seen"

    @property
    def running(self) -> str:
        """Set: ids of jobs a worker has started and not yet ended or handed back, for the reapers."""
        return f"{self.prefix}:running"

    @property
    def job_index(self) -> str:
        """Sorted set: the newest jobs' ids (`job_index_size` at most), scored by submission ms, written with
        each job (`submit.lua`), for the console's job list; an id whose record expired is dropped where
        the list is read."""
        return f"{self.prefix}:job-index"

    @property
    def reaper_turn(self) -> str:
        """String: the worker whose turn it is to look for lapsed leases, until it expires."""
        return f"{self.prefix}:reaper-turn"

    def idempotency(self, key: str, owner: str = ANONYMOUS_OWNER) -> str:
        """String: job id one owner submitted under an `Idempotency-Key` (hashed, so any value fits)."""
        return f"{self.prefix}:idempotency:{owner}:{hashlib.sha256(key.encode()).hexdigest()}"

    def tenant_queued(self, tenant: str) -> str:
        """Sorted set: ids of the tenant's queued jobs, scored by when each one's record expires (ms)."""
        return f"{self.prefix}:tenant:{tenant}:queued"

    def tenant_running(self, tenant: str) -> str:
        """Set: ids of the tenant's running jobs (a handed-back job waits among its queued ones); an id
        whose record is gone or no longer running is dropped where the set is counted."""
        return f"{self.prefix}:tenant:{tenant}:running"

    def tenant_requests(self, tenant: str) -> str:
        """Sorted set with a TTL: ids of the tenant's jobs admitted in the last minute, by when (ms)."""
        return f"{self.prefix}:tenant:{tenant}:requests"

    def tenant_tokens(self, tenant: str) -> str:
        """Sorted set with a TTL: `<job id>:<tokens>` of the tenant's jobs ended in the last minute,
        scored by when (ms); tokens are the usage's prompt plus generated tokens."""
        return f"{self.prefix}:tenant:{tenant}:tokens"

    @property
    def tenant_totals(self) -> str:
        """Hash: `<tenant>:tokens` and `<tenant>:jobs` ended since it began, for the metrics (one
        field pair per tenant: bounded by the keys and the tenants file)."""
        return f"{self.prefix}:tenants:totals"

    def tenant_record_fields(self, tenant: str) -> dict[str, str]:
        """What a job's record keeps of its tenant: the name, and the keys of its counters, which the
        lifecycle scripts that move the job read from the record (`tenant_move.lua`)."""
        return {
            "tenant": tenant,
            "tenant_queued": self.tenant_queued(tenant),
            "tenant_running": self.tenant_running(tenant),
            "tenant_tokens": self.tenant_tokens(tenant),
            "tenant_totals": self.tenant_totals,
        }

    def worker(self, worker_id: str) -> str:
        """String with a TTL: a worker's heartbeat."""
        return f"{self.prefix}:worker:{worker_id}"

    @property
    def worker_pattern(self) -> str:
        return f"{self.prefix}:worker:*"

    @property
    def workers(self) -> str:
        """Sorted set: the ids of workers that sent a heartbeat, scored by when it expires (epoch ms),
        so that the live ones are read in O(workers) instead of by scanning the keyspace."""
        return f"{self.prefix}:workers"

    def client_name(self, role: str) -> str:
        """CLIENT SETNAME of a process's command connections: `gateway`, or `worker:<id>`."""
        return f"{self.prefix}:{role}"

    @property
    def notices(self) -> str:
        """Pub/sub channel: what a script has just appended to job streams (`shared.notices`; a worker's
        step tells of all its jobs' in one message), for the gateways' stream readers; with more than
        one notice partition, the channel of each is this and its number (`notice_channel`)."""
        return f"{self.prefix}:streams-advanced"

    def partition_notices(self, partition: int) -> str:
        """Shard channel (SPUBLISH), with the streams on a Redis Cluster: `notices` of one partition's
        streams, on the master that holds them."""
        return f"{self.prefix}:{self.partition_tag(partition)}:streams-advanced"

    def notice_partition(self, job_id: str) -> int:
        """The notice partition of a job: on a Redis Cluster its streams' partition (`partition`)."""
        return zlib.crc32(job_id.encode()) % self.notice_partitions

    def notice_channel(self, partition: int) -> str:
        """Where the notices of a partition's streams go: a shard channel on a Redis Cluster
        (`partition_notices`), else `notices` alone or with the partition's number."""
        return self._notice_channels[partition]

    @cached_property
    def _notice_channels(self) -> tuple[str, ...]:
        if self.partitions:
            return tuple(self.partition_notices(partition) for partition in range(self.partitions))
        if self.notice_partitions == 1:
            return (self.notices,)
        return tuple(f"{self.notices}:{partition}" for partition in range(self.notice_partitions))

    def notices_of(self, job_id: str) -> str:
        """The channel of the notices of the job's stream (a step asks it of every job it carries)."""
        return self._notice_channels[self.notice_partition(job_id)]

    def job_id_in(self, partition: int) -> str:
        """A new job id (a uuid4's 32 hex digits) whose notices are in `partition`: uuid4s drawn until
        one falls there, `notice_partitions` draws on average."""
        while True:
            job_id = uuid.uuid4().hex
            if self.notice_partition(job_id) == partition:
                return job_id

    def stream_job(self, stream: str) -> str:
        """The id of the job whose stream (`stream`) this is."""
        return stream[: -len(STREAM_SUFFIX)].rpartition(":")[2]

    @property
    def stream_reader_name(self) -> str:
        """CLIENT SETNAME of a gateway's one stream reader connection."""
        return f"{self.prefix}:stream-reader"

    def file(self, file_id: str) -> str:
        """Hash: an uploaded or written file's metadata (`gateway.files.store`); its bytes live in
        the file storage, outside Redis."""
        return f"{self.prefix}:file:{file_id}"

    def files(self, owner: str) -> str:
        """Sorted set: the ids of an owner's files, scored by creation (ms)."""
        return f"{self.prefix}:files:{owner}"

    def files_of_purpose(self, owner: str, purpose: str) -> str:
        """Sorted set: the ids of an owner's files of one purpose, scored by creation (ms): a listing
        filtered by purpose reads a page of it, as an unfiltered one reads `files`."""
        return f"{self.prefix}:files-of-purpose:{owner}:{purpose}"

    def files_usage(self, scope: str) -> str:
        """Hash: `count` and `bytes` of the files of one API key (`key:<owner>`) or one tenant
        (`tenant:<name>`), which bound its uploads (`gateway.files.records`)."""
        return f"{self.prefix}:files-usage:{scope}"

    @property
    def files_expiring(self) -> str:
        """Sorted set: the ids of the files that expire, scored by when (s): what the gateways' file
        sweeper removes once due (`gateway.files.expiry`)."""
        return f"{self.prefix}:files-expiring"

    def stored_chat_completions(self, owner: str) -> str:
        """Sorted set: the job ids of an owner's stored chat completions (`store: true`), scored by
        submission (s); trimmed of jobs past their lifetime as it is listed, and gone a job lifetime
        after the last was added."""
        return f"{self.prefix}:stored-chat-completions:{owner}"

    def batch(self, batch_id: str) -> str:
        """Hash: a batch's record (`gateway.batches.store`), which its jobs' ends count (`batch_end.lua`)."""
        return f"{self.prefix}:batch:{batch_id}"

    def batches(self, owner: str) -> str:
        """Sorted set: the ids of an owner's batches, scored by creation (ms)."""
        return f"{self.prefix}:batches:{owner}"

    def batch_lease(self, batch_id: str) -> str:
        """String with a TTL: the gateway driving the batch (validating, feeding, writing its files),
        renewed while it does; once it lapses another gateway takes the batch over."""
        return f"{self.prefix}:batch:{batch_id}:lease"

    def batch_refusals(self, batch_id: str) -> str:
        """Hash: input line number -> the error (JSON) of a line admission refused: its error file entry."""
        return f"{self.prefix}:batch:{batch_id}:refusals"

    def batch_ended(self, batch_id: str) -> str:
        """List: ids of the batch's jobs that ended and whose keys its driver has not yet kept until the
        batch's output is written (`batch_end.lua` pushes, `gateway.batch_driver` keeps and trims)."""
        return f"{self.prefix}:batch:{batch_id}:ended"

    def batches_running(self, scope: str) -> str:
        """Sorted set: the batches not yet ended of one API key (`key:<owner>`) or one tenant
        (`tenant:<name>`), scored by creation (ms): what bounds how many each runs at once
        (`batch_create.lua`)."""
        return f"{self.prefix}:batches-active:{scope}"

    @property
    def batches_active(self) -> str:
        """Sorted set: the batches not yet ended, scored by creation (ms): what the gateways' batch
        drivers look after."""
        return f"{self.prefix}:batches-active"
