"""Settings read from `STREAMPOOL_*` variables or flags, one class per role.

`RedisSettings` is what every process that touches job keys needs; `GatewaySettings` and
`WorkerSettings` add their own role's knobs to it, and `Settings` composes both for what
runs the whole system (`streampool up`, the tests, the benchmark). `ClientSettings` is the
client commands' own. Each is built once at start-up and passed down; nothing else reads
the environment.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.redis_url import is_cluster, is_sentinel, parse_cluster_url, parse_sentinel_url

DEFAULT_MODEL_DIR = Path.home() / ".cache" / "streampool" / "models" / "SmolLM2-135M-Instruct"
DEFAULT_FILES_DIR = Path.home() / ".cache" / "streampool" / "files"


def _comma_separated(value: object) -> object:
    """A list from a variable's comma-separated text; a list (repeated flags) as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


Names = Annotated[list[str], NoDecode, BeforeValidator(_comma_separated)]
"""A list setting: comma-separated in its variable, a repeated flag on the command line."""


def _flag_words(value: object) -> object:
    """A list of flags from a variable: a JSON list, or a command line's words (quoted as a shell does)."""
    if isinstance(value, str):
        return json.loads(value) if value.lstrip().startswith("[") else shlex.split(value)
    return value


EngineFlags = Annotated[list[str], NoDecode, BeforeValidator(_flag_words)]
"""vLLM's engine flags: a flag string or a JSON list in its variable, the words of a command line."""

ENGINE_FLAG_SETTINGS = frozenset(
    {
        "model",
        "served_model_name",
        "max_model_len",
        "dtype",
        "enforce_eager",
        "gpu_memory_utilization",
        "max_lora_rank",
        "scheduling_policy",
        "reasoning_parser",
    }
)
"""The worker's settings under vLLM's engine flag names: `streampool worker`'s command line gives them as
`vllm serve` does, to vLLM's parser, and the setting takes the flag's value."""

Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]

ENV = SettingsConfigDict(env_prefix="STREAMPOOL_", extra="forbid")


class RedisSettings(BaseSettings):
    """Where the jobs live and how long their keys last: the same for every gateway and worker."""

    model_config = ENV

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis holding queue, records and streams: `redis://`, `rediss://`, or "
        "`redis+sentinel://[:password@]host:port[,host:port...]/master_name[/db]` to find the master "
        "through Sentinels (see Redis failover)",
    )
    redis_sentinel_password: str | None = Field(
        None, description="password of the Sentinels themselves (the master's goes in the URL)"
    )
    streams_redis_url: str | None = Field(
        None,
        description="Redis holding the job streams (the data plane: what each step of a job writes and "
        "its readers follow), in the same forms as `redis_url` or a Redis Cluster's, "
        "`redis+cluster://[:password@]host:port[,host:port...]` (`rediss+cluster://` over TLS); unset: "
        "the streams live on `redis_url` "
        "with the rest (see Scaling)",
    )
    stream_partitions: int = Field(
        16,
        ge=1,
        le=16384,
        description="with `streams_redis_url` naming a Redis Cluster: how many partitions the job streams "
        "are spread over (each one hash slot, moved between masters whole); the same for every gateway "
        "and worker, and fixed for the deployment's life",
    )
    notice_partitions: int = Field(
        16,
        ge=1,
        le=1024,
        description="with the job streams on one Redis: how many channels the notices of their new "
        "entries are spread over, a job's by its id; a gateway hears only the channels of the streams "
        "it relays, and the jobs it submits are in its own (`gateway_notice_partition`); the same for "
        "every gateway and worker (on a Redis Cluster the streams' partitions serve instead)",
    )
    # Every acknowledged write (a 202 to a submission, a cancel, a job's terminal event) is one a
    # failover keeps only if a replica has it: Redis's WAIT, in the same round trip as the write.
    min_replicas_to_ack: int | None = Field(
        None,
        ge=0,
        description="replicas that must hold a submission, a cancel or a job's end before it is "
        "acknowledged (`WAIT`); unset: 1 once the master has been seen with a replica, syncing or "
        "online (remembered in Redis), 0 for a Redis that never had one; set it to ask for more or fewer",
    )
    replica_ack_timeout_ms: int = Field(
        1000,
        ge=1,
        description="how long an acknowledgement waits for its replicas; short of them, the request "
        "answers 503 (a submission's job may exist: retry with the same Idempotency-Key)",
    )
    key_prefix: str = Field("streampool", description="prefix of every key streampool writes")
    retention_seconds: int = Field(3600, ge=1, description="how long a finished job stays readable")
    stream_maxlen: int = Field(100_000, ge=100, description="approximate cap on entries per job stream")
    job_index_size: int = Field(
        10_000,
        ge=0,
        description="how many of the newest jobs the console's job list can reach (one sorted-set entry "
        "each, written with the job); 0 keeps no list",
    )
    redis_max_connections: int = Field(
        32,
        ge=1,
        description="most connections a gateway or worker opens for its commands (a gateway's stream reader "
        "adds one); more commands at once wait for a free one",
    )
    # A job's keys are written by the gateway and must outlive any run of it on a worker.
    job_timeout_seconds: int = Field(3600, ge=1, description="longest a job may run")
    log_level: str = Field("INFO", description="logging level")

    @field_validator("redis_url", "streams_redis_url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        """A malformed Sentinel or cluster URL is refused at start-up, saying the form."""
        if url is not None and is_sentinel(url):
            parse_sentinel_url(url)
        if url is not None and is_cluster(url):
            parse_cluster_url(url)
        return url

    @field_validator("redis_url")
    @classmethod
    def _control_plane_is_one_redis(cls, url: str) -> str:
        if is_cluster(url):
            raise ValueError(
                "redis_url names one Redis (or its Sentinels): queues, records and leases are kept by "
                "scripts over many keys; a Redis Cluster can hold the job streams (streams_redis_url)"
            )
        return url

    @property
    def job_lifetime_seconds(self) -> int:
        """TTL of a job's keys before it ends, so that even an abandoned job cannot live forever."""
        return self.job_timeout_seconds * 2 + self.retention_seconds


class GatewaySettings(RedisSettings):
    """The HTTP gateway's knobs, with Redis's."""

    host: str = Field(
        "0.0.0.0",
        description="gateway listen address (`streampool up`, which runs without keys: 127.0.0.1 unless set)",
    )
    port: int = Field(8000, ge=1, le=65535, description="gateway listen port")
    processes: int = Field(
        1,
        ge=1,
        le=256,
        description="gateway processes serving the port, each a whole gateway (its own Redis connections "
        "and stream reader) on one core at most: one a core scales a host's gateway to its cores",
    )
    gateway_notice_partition: int | None = Field(
        None,
        ge=0,
        description="the notice partition (of `notice_partitions`) whose ids this gateway gives the jobs "
        "it submits, so that it hears of them and little else; with `processes` N, the next processes "
        "take the next ones; unset: one drawn at random (on a Redis Cluster job ids stay random, "
        "spreading the streams over its masters)",
    )
    max_queued_jobs: int = Field(
        10_000,
        ge=0,
        description="length of a model's queue past which submissions for it get 429 (0: no limit); "
        "counted in interactive jobs alone, while a batch's line waits until the whole queue is under it",
    )
    default_queue_deadline_seconds: float | None = Field(
        None,
        gt=0,
        description="how long a request that sets no deadline (neither `deadline` nor the "
        "`X-Streampool-Deadline` header) may wait in the queue; still queued then, its job fails "
        "`deadline_exceeded` without running (none: it waits for as long as its job lives; a batch's "
        "lines are never given it)",
    )
    deadline_sweep_seconds: float = Field(
        1.0,
        gt=0,
        description="how often a gateway ends the queued jobs whose deadline has passed (a worker that "
        "meets one ends it too): how late past its deadline a job no worker took may end",
    )
    max_tokens_limit: int = Field(2048, ge=1, description="highest `max_tokens` a request may ask for")
    max_choices: int = Field(
        8, ge=1, description="highest `n` (choices of one prompt, in one job) a request may ask for"
    )
    max_prompts: int = Field(
        64,
        ge=1,
        le=1024,
        description="most prompts one request may give as a list (`/v1/completions`, a job's `prompt` or "
        "`prompt_token_ids`); they run in one job, on one worker, `n` choices each",
    )
    max_pooling_inputs: int = Field(
        2048,
        ge=1,
        description="most inputs one pooling request may give (texts or token lists to embed, documents to "
        "score or rerank): they run in one job, on one worker; more is refused (400) before any job",
    )
    max_pooling_tokens: int = Field(
        300_000,
        ge=1,
        description="most tokens one pooling request's inputs may hold together, counted with the model's "
        "tokenizer (its card's); more is refused (413, or 400 on vLLM's routes) before any job",
    )
    redis_memory_high_water: float = Field(
        0.9,
        gt=0,
        le=1,
        description="share of Redis's `maxmemory` past which submissions get 429 `overloaded`, so that "
        "running jobs stream to their end in the rest (read at most once a second; no effect on a Redis "
        "without `maxmemory`)",
    )
    # A submission writes its request (a conversation's turn: its own input alone) and what its API
    # keeps beside it: the largest body's, with room for those fields.
    max_request_write_bytes: int = Field(
        4 * 1_048_576,
        ge=4096,
        description="most bytes one submission may write to Redis (its request, and what its API keeps "
        "beside it; a conversation's turn writes its own input alone), checked before anything is written: "
        "past it 413 `body_too_large`",
    )
    fair_share_unit: Literal["tokens", "jobs"] = Field(
        "tokens",
        description="what a tenant's share of a model's queue counts: its jobs' prompt and output tokens, "
        "each weighted by the tenant's `prompt_token_weight` and `output_token_weight` (the virtual token "
        "counter), or its jobs, one each",
    )
    poll_wait_max: float = Field(30.0, ge=0, description="longest a long-poll request may wait, seconds")
    sse_ping_seconds: float = Field(15.0, gt=0, description="keep-alive comment interval on idle SSE streams")
    max_body_bytes: int = Field(
        1_048_576, ge=1024, description="largest request body accepted, bytes (413 `body_too_large` past it)"
    )
    # An open stream costs the gateway a socket and a few KB while it keeps up: 10,000 stays within
    # a process's usual 65,536 file descriptors and is five times the most one process relays live
    # (2,000 streams at 10 events/s, bench/RESULTS.md); a tenth of that per key lets no one key fill it.
    max_open_streams: int = Field(
        10_000,
        ge=1,
        description="readers one gateway process serves at once (every request holding its connection "
        "open on a job: SSE streams, waiting long-polls and cursors, OpenAI, TGI and Responses answers, a "
        "Responses cancel waiting); past it 429 `overloaded` with `Retry-After`, before the stream starts",
    )
    max_open_streams_per_key: int = Field(
        1_000,
        ge=1,
        description="of those, the most one API key holds (not applied where no key is required: then the "
        "total bounds every client); past it 429",
    )
    # A plain delta entry is about 150 bytes, so 256 KiB still reads the relay's full batches of 512;
    # one with `logprobs: 20` is about 1.5 KB a token, and a batch of those stops near this size.
    reader_batch_bytes: int = Field(
        262_144,
        ge=4096,
        description="about the bytes of events one reader holds in the gateway at a time: the size of a "
        "catch-up read's batch, and how far the shared reader may run ahead of a slow client before that "
        "client catches up from Redis by itself",
    )
    shutdown_grace_seconds: float = Field(
        30.0,
        ge=0,
        description="how long a stopping gateway lets OpenAI and TGI answers go on (their clients cannot "
        "resume elsewhere) before it cancels their jobs; native event streams end at once",
    )
    keep_alive_seconds: int = Field(
        75,
        ge=1,
        description="how long a gateway keeps an idle HTTP connection open; longer than its clients' and "
        "load balancers' idle timeouts (httpx's 5 s, a cloud load balancer's 60 s), so that the client end "
        "closes first and never sends a request on a connection the gateway is closing",
    )

    # Models
    models: Names = Field(
        [],
        description="models jobs may name before any worker of them has run (a worker announces its own "
        "model), comma-separated canonical names (a flag per name); their jobs queue until a worker starts",
    )
    allow_runtime_lora_updating: bool = Field(
        False,
        description="answer vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING), for admin keys only: every worker of the model loads the adapter",
    )
    adapter_load_wait_seconds: float = Field(
        60.0,
        gt=0,
        description="how long a load of an adapter waits for a worker to hold it before it answers 503 (the "
        "adapter stays loaded for the workers that start later)",
    )
    default_model: str | None = Field(
        None,
        description="the model of a request that names none (native jobs, TGI's routes); without it such a "
        "request is refused with 400 `model_required` once the prefix knows more than one model",
    )

    # Authentication
    api_keys: str = Field("", description="API keys clients send as `Authorization: Bearer`, comma-separated")
    api_keys_file: Path | None = Field(
        None,
        description="file of API keys, one per line (blank lines skipped), or a `.toml` file of `[[keys]]` "
        "with each key's `tenant`, `webhook_secret` and default `webhook_url` (see Webhooks), and "
        "`[[tenants]]` with their limits (see Tenants and their limits)",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="run the gateway without API keys (every client may use every job); without keys and "
        "without this, the gateway refuses to start",
    )
    # A secret of the operator's, not a client's: /metrics answers on the public port, and what it
    # says of a tenant (its name, its jobs, its tokens) is no other tenant's to read.
    metrics_token: str = Field(
        "",
        description="token Prometheus sends as `Authorization: Bearer` to /metrics to get the series that "
        "name a tenant (`streampool_tenant_*`); without it, or unset, /metrics serves only the others",
    )

    # Webhooks
    webhook_allowed_prefixes: Annotated[list[str], NoDecode] = Field(
        [],
        description="URL prefixes a webhook may start with, comma-separated (e.g. "
        "`https://hooks.example.com/`); none: no job may name a webhook",
    )
    webhook_timeout_seconds: float = Field(
        10.0, gt=0, description="longest one webhook delivery attempt may take (connect, send, answer)"
    )
    webhook_first_retry_seconds: float = Field(
        1.0,
        gt=0,
        description="wait before the first retry of a webhook; each next one waits about twice as long",
    )
    webhook_max_retry_gap_seconds: float = Field(
        600.0, gt=0, description="longest wait between two attempts of a webhook"
    )
    webhook_retry_for_seconds: float = Field(
        86_400.0, gt=0, description="how long after its job's end a webhook is retried before it is given up"
    )
    webhook_takeover_seconds: float = Field(
        30.0,
        gt=0,
        description="a webhook its gateway has not touched this long (the gateway is gone) is taken over by "
        "another gateway",
    )
    webhook_max_in_flight: int = Field(
        256,
        ge=1,
        description="webhook POSTs one gateway has under way at once (a delivery waiting for its retry "
        "holds none)",
    )
    webhook_max_in_flight_per_tenant: int = Field(
        8,
        ge=1,
        description="webhook POSTs one gateway has under way at once for one tenant's jobs: a tenant's slow "
        "or failing receiver delays only that tenant's deliveries",
    )
    webhook_max_pending_per_tenant: int = Field(
        10_000,
        ge=1,
        description="one tenant's webhook deliveries under way (to send, or waiting to retry) across all "
        "gateways: beyond it that tenant's oldest are given up (`failed`), never another tenant's",
    )

    # Files and batches
    files_dir: Path = Field(
        DEFAULT_FILES_DIR,
        description="folder holding uploaded and written files (batch input, output and error files) when "
        "`files_url` is unset; every gateway of a deployment mounts the same one",
    )
    files_url: str = Field(
        "",
        description="S3-compatible object storage for the files instead of `files_dir`: `s3://bucket` or "
        "`s3://bucket/prefix`, with `files_s3_*` below",
    )
    files_s3_endpoint: str | None = Field(
        None, description="the object storage's endpoint URL (unset: AWS's for `files_s3_region`)"
    )
    files_s3_region: str = Field("us-east-1", description="the object storage's region")
    files_s3_access_key_id: str | None = Field(None, description="access key id for the object storage")
    files_s3_secret_access_key: str | None = Field(
        None, description="secret access key for the object storage"
    )
    max_file_bytes: int = Field(
        200 * 1_048_576,
        ge=1024,
        description="largest file `POST /v1/files` accepts, bytes (OpenAI's: 200 MB)",
    )
    max_file_lines: int = Field(
        50_000, ge=1, description="most lines (requests) a batch input file may hold (OpenAI's: 50,000)"
    )
    files_max_per_key: int = Field(
        1_000,
        ge=0,
        description="most files one API key holds (uploaded, and batches' output and error files): an "
        "upload past it is refused with 429 `rate_limited`, nothing kept, until one is deleted or "
        "expires (0: no bound)",
    )
    files_max_bytes_per_key: int = Field(
        20 * 1024**3,
        ge=0,
        description="most bytes one API key's files hold together, bounded as `files_max_per_key` "
        "bounds their number (0: no bound)",
    )
    files_max_per_tenant: int = Field(
        10_000,
        ge=0,
        description="most files the keys of one tenant (the tenants file's) hold together, as "
        "`files_max_per_key` bounds one key's (0: no bound)",
    )
    files_max_bytes_per_tenant: int = Field(
        200 * 1024**3,
        ge=0,
        description="most bytes the files of one tenant's keys hold together, as "
        "`files_max_bytes_per_key` bounds one key's (0: no bound)",
    )
    files_batch_output_expire_seconds: int = Field(
        30 * 86_400,
        ge=0,
        description="how long a batch's output and error files live, from their writing (OpenAI's: 30 "
        "days; 0: until deleted)",
    )
    files_sweep_seconds: float = Field(
        60.0,
        gt=0,
        description="how often a gateway removes the files past their `expires_at` that no one read "
        "since (a read of one removes it at once)",
    )
    batch_window_seconds: int = Field(
        86_400,
        ge=1,
        description="how long the completion window `24h` lasts: a batch not done by then expires with "
        "what it has finished",
    )
    batch_in_flight: int = Field(
        512,
        ge=1,
        description="most jobs of one batch queued or running at once: the next lines are submitted as "
        "these end, so a batch of any size holds this many jobs in Redis",
    )
    batch_max_running_per_key: int = Field(
        16,
        ge=0,
        description="most batches one API key has validating, in progress or finalizing at once: "
        "another is refused with 429 until one ends (0: no bound)",
    )
    batch_max_running_per_tenant: int = Field(
        64,
        ge=0,
        description="most batches the keys of one tenant (the tenants file's) run at once, as "
        "`batch_max_running_per_key` bounds one key's (0: no bound)",
    )
    batch_lease_seconds: float = Field(
        10.0,
        gt=0,
        description="a batch's lease on the gateway that drives it, renewed while it lives; once it lapses "
        "(the gateway is gone) another gateway takes the batch over",
    )

    @field_validator("webhook_allowed_prefixes", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """A flag or variable gives one string; a list is taken as it is."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


class WorkerSettings(RedisSettings):
    """A worker's knobs (its engine, its queue intake, its recovery), with Redis's."""

    model: Path = Field(DEFAULT_MODEL_DIR, description="model folder the worker serves")
    engine: Literal["vllm", "synthetic"] = Field(
        "vllm",
        description="what generates: `vllm` runs the model; `synthetic` draws tokens from the model's "
        "vocabulary at `synthetic_step_seconds` a step, with no torch and no weights (see Load tests "
        "without a GPU)",
    )
    synthetic_step_seconds: float = Field(
        0.03, gt=0, le=10, description="the synthetic engine's time between steps (0.03: a GPU's pace)"
    )
    synthetic_mean_tokens: int = Field(
        256,
        ge=0,
        description="the synthetic engine's mean answer length: each token ends its choice with the "
        "end-of-sequence token with a chance of one in this many (unless `ignore_eos`); 0: a choice "
        "ends only at `max_tokens`, a stop string or a stop token",
    )
    synthetic_script: str | None = Field(
        None,
        description="text every choice of the synthetic engine writes, token by token, instead of drawn "
        "tokens, then the end of sequence: a parser's syntax (`<tool_call>`, `<think>`) on any model; "
        "`A|||B`: a chat whose last message is a tool's result gets B, any other request A (an agent's "
        "call, then its answer) (see Agents and tool calling)",
    )
    engine_args: EngineFlags = Field(
        [],
        description="vLLM's engine flags, as `vllm serve` takes them (`--max-num-batched-tokens 1024 "
        "--enable-prefix-caching`, `--config engine.yaml`): a flag string or a JSON list; the worker's "
        "command line adds its own after them (see From vllm serve to streampool)",
    )
    served_model_name: str | None = Field(
        None,
        description="the model's names, comma-separated: the first is its canonical name, which names its "
        "queue; the others are aliases (default: the folder's name)",
    )
    lora: Names = Field(
        [],
        description="a LoRA adapter of the model to serve, as name=path (repeat the flag, or comma-separate)",
    )
    max_lora_rank: int = Field(16, ge=1, description="highest rank of the LoRA adapters the engine takes")
    max_model_len: int = Field(2048, ge=16, description="context length: prompt plus generated tokens")
    dtype: Dtype = Field(
        "auto",
        description="weights dtype passed to vLLM; `auto` is the model's own, but float32 on an x86 CPU "
        "without AVX-512 (bf16 has no fast matmul there: prefill runs about 6 times slower)",
    )
    enforce_eager: bool | None = Field(
        None, description="disable CUDA graphs / compilation (default: on CPU only)"
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vLLM memory share (default: vLLM's on GPU, 0.3 on CPU)"
    )
    cpu_kvcache_gib: int = Field(1, ge=1, description="KV cache size on the CPU backend, GiB")
    constraint_compile_seconds: float = Field(
        3.0,
        gt=0,
        description="longest a job's regex, grammar or JSON schema may take to compile in the worker's "
        "compiling process before it is killed and the job fails; below vLLM's own 5 s, which stops "
        "waiting but not compiling",
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        "fcfs",
        description="vLLM's scheduling policy: priority runs the jobs of one batch in order of their "
        "priority (lower first) and may preempt a running job for a more urgent one",
    )
    worker_max_jobs: int = Field(256, ge=1, description="jobs one worker runs at once (vLLM batches them)")
    # The chat front end's flags of `vllm serve`, under its names: how a pool's output is parsed.
    enable_auto_tool_choice: bool = Field(
        False,
        description="let the model decide when to call tools (`tool_choice` auto); needs tool_call_parser",
    )
    tool_call_parser: str | None = Field(
        None,
        description="vLLM's tool-call parser for the model's format (hermes, llama3_json, mistral, pythonic, "
        "qwen3_xml, ...): needed by every tool_choice but none",
    )
    tool_parser_plugin: str | None = Field(
        None, description="a Python file that registers a tool-call parser of one's own (vLLM's plugin)"
    )
    reasoning_parser: str | None = Field(
        None,
        description="vLLM's reasoning parser (deepseek_r1, qwen3, openai_gptoss, granite, ...): the model's "
        "thinking goes to `reasoning`, apart from the answer",
    )
    trust_request_chat_template: bool = Field(
        False, description="take a chat template given in a request (`chat_template`) instead of refusing it"
    )
    chat_template: str | None = Field(
        None,
        description="the chat template to render chats with instead of the tokenizer's, as vllm serve's "
        "--chat-template takes it: a file, the name of one of vLLM's built-in templates, or the template",
    )

    @property
    def auto_tool_parser(self) -> str | None:
        """The tool-call parser, where auto tool choice is on: as in vLLM, no tool choice works without."""
        return self.tool_call_parser if self.enable_auto_tool_choice else None

    batch_reserved_share: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="share of a worker's `worker_max_jobs` slots (at least one, when above 0) that jobs of "
        "batches never take, so that an interactive job starts at once however many batch jobs wait; a "
        "batch alone uses the rest",
    )
    worker_poll_delay: float = Field(
        0.5,
        gt=0,
        description="seconds between queue polls of an idle worker; a wake-up message on every enqueue "
        "makes it poll at once, so this only bounds how late a missed wake-up is made good",
    )
    prefix_aware_claiming: bool = Field(
        True,
        description="a worker claims first the queued jobs whose prompt prefix its cache holds, and a job "
        "whose prefix another live worker holds is left to that one for `prefix_wait_seconds`",
    )
    prefix_wait_seconds: float | None = Field(
        None,
        ge=0,
        description="longest a job waits for the worker holding its prefix (or, held nowhere, for the "
        "least loaded worker) before any worker takes it (default: `worker_poll_delay`)",
    )
    heartbeat_seconds: float = Field(2.0, gt=0, description="interval of worker heartbeats")
    heartbeat_ttl_seconds: float = Field(10.0, gt=0, description="a worker silent this long counts as gone")
    metrics_port: int = Field(
        9100, ge=1, le=65535, description="worker port for /health and Prometheus /metrics"
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="address of the worker's /health and /metrics server; containers set 0.0.0.0, where "
        "probes and Prometheus reach it from outside",
    )

    # Recovery
    lease_seconds: float = Field(
        6.0,
        gt=0,
        description="a running job's lease, renewed by heartbeats (at least twice `heartbeat_seconds`); once "
        "it lapses, another worker resumes the job",
    )
    max_attempts: int = Field(
        3, ge=1, description="runs of one job (its first and its resumes) before it fails with `worker_lost`"
    )
    drain_seconds: float = Field(
        30.0,
        ge=0,
        description="how long a stopping worker lets running jobs finish before handing them over (rounded "
        "up to whole seconds)",
    )
    # For ever by default, as a pod or container waits for what it depends on: how long a worker may
    # take to start is its supervisor's to bound (a startup probe), and a worker that gave up would
    # only be started again, to load its engine once more.
    redis_startup_timeout_seconds: float = Field(
        0,
        ge=0,
        description="how long a starting worker, its engine loaded, waits for Redis to take its first "
        "heartbeat before it exits with status 1; 0 waits for ever, as a container waits for what it depends "
        "on: bound the whole start with the supervisor instead (Kubernetes' startup probe allows 15 minutes)",
    )

    @field_validator("lora")
    @classmethod
    def _name_equals_path(cls, entries: list[str]) -> list[str]:
        names = [entry.partition("=")[0].strip() for entry in entries]
        if any(
            "=" not in entry or not name or ":" in name for entry, name in zip(entries, names, strict=True)
        ):
            raise ValueError("each adapter is name=path, its name without ':'")
        if len(set(names)) != len(names):
            raise ValueError("two adapters have the same name")
        return entries

    @property
    def model_names(self) -> list[str]:
        """The model's names: the canonical one (its queue's) first, then its aliases."""
        names = [name.strip() for name in (self.served_model_name or "").split(",") if name.strip()]
        return list(dict.fromkeys(names)) or [self.model.name]

    @property
    def model_name(self) -> str:
        """The model's canonical name, which names its queue."""
        return self.model_names[0]

    @property
    def adapters(self) -> dict[str, Path]:
        """The LoRA adapters to serve, by name."""
        pairs = [entry.partition("=") for entry in self.lora]
        return {name.strip(): Path(path.strip()) for name, _, path in pairs}


class Settings(GatewaySettings, WorkerSettings):
    """Both roles' settings, for what runs a whole system in one go (`streampool up`, tests, benchmark)."""


class ClientSettings(BaseSettings):
    """The client commands' settings (submit, follow, status, cancel): where the gateway answers."""

    model_config = ENV

    url: str = Field("http://127.0.0.1:8000", description="gateway the client commands talk to")
    api_key: str | None = Field(None, description="API key sent as `Authorization: Bearer`")
