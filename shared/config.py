"""Settings read from `STREAMPOOL_*` variables or flags: the servers' knobs, and the client commands' URL."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL_DIR = Path.home() / ".cache" / "streampool" / "models" / "SmolLM2-135M-Instruct"


Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]


class Settings(BaseSettings):
    """Built once at start-up and passed down; nothing else reads the environment."""

    model_config = SettingsConfigDict(env_prefix="STREAMPOOL_", extra="forbid")

    # Redis
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis holding queue, records and streams")
    key_prefix: str = Field("streampool", description="prefix of every key streampool writes")
    retention_seconds: int = Field(3600, ge=1, description="how long a finished job stays readable")
    stream_maxlen: int = Field(100_000, ge=100, description="approximate cap on entries per job stream")
    redis_max_connections: int = Field(
        32,
        ge=1,
        description="most connections a gateway or worker opens for its commands (plus a gateway's reader)",
    )

    # Gateway
    host: str = Field("0.0.0.0", description="gateway listen address")
    port: int = Field(8000, ge=1, le=65535, description="gateway listen port")
    max_queued_jobs: int = Field(
        10_000, ge=0, description="queue length past which submissions get 429 (0: no limit)"
    )
    max_tokens_limit: int = Field(2048, ge=1, description="highest max_tokens a request may ask for")
    poll_wait_max: float = Field(30.0, ge=0, description="longest a long-poll request may wait, seconds")
    sse_ping_seconds: float = Field(15.0, gt=0, description="keep-alive comment interval on idle SSE streams")
    max_body_bytes: int = Field(1_048_576, ge=1024, description="largest request body accepted, bytes")

    # Authentication (gateway)
    api_keys: str = Field("", description="API keys clients send as `Authorization: Bearer`, comma-separated")
    api_keys_file: Path | None = Field(None, description="file of API keys, one per line")
    allow_unauthenticated: bool = Field(
        False, description="run the gateway without API keys (every client may use every job)"
    )

    # Worker
    model: Path = Field(DEFAULT_MODEL_DIR, description="model folder the worker serves")
    served_model_name: str | None = Field(
        None, description="model id shown to clients (default: folder name)"
    )
    max_model_len: int = Field(2048, ge=16, description="context length: prompt plus generated tokens")
    dtype: Dtype = Field(
        "auto", description="weights dtype passed to vLLM; auto is float32 on an x86 CPU without AVX-512"
    )
    enforce_eager: bool | None = Field(
        None, description="disable CUDA graphs / compilation (default: on CPU only)"
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vLLM memory share (default: vLLM's on GPU, 0.3 on CPU)"
    )
    cpu_kvcache_gib: int = Field(1, ge=1, description="KV cache size on the CPU backend, GiB")
    worker_max_jobs: int = Field(256, ge=1, description="jobs one worker runs at once (vLLM batches them)")
    worker_poll_delay: float = Field(
        0.5,
        gt=0,
        description="seconds between queue polls of an idle worker; a wake-up message on every enqueue "
        "makes it poll at once, so this only bounds how late a missed wake-up is made good",
    )
    job_timeout_seconds: int = Field(3600, ge=1, description="longest a job may run")
    heartbeat_seconds: float = Field(2.0, gt=0, description="interval of worker heartbeats")
    heartbeat_ttl_seconds: float = Field(10.0, gt=0, description="a worker silent this long counts as gone")
    metrics_port: int = Field(
        9100, ge=1, le=65535, description="worker port for /health and Prometheus /metrics (on 0.0.0.0)"
    )

    # Recovery (worker)
    lease_seconds: float = Field(
        6.0, gt=0, description="a running job's lease, renewed by heartbeats; once lapsed, others resume it"
    )
    max_attempts: int = Field(3, ge=1, description="runs of one job (first run and resumes) before it fails")
    drain_seconds: float = Field(
        30.0, ge=0, description="how long a stopping worker lets running jobs finish before handing them over"
    )

    log_level: str = Field("INFO", description="logging level")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.name

    @property
    def job_lifetime_seconds(self) -> int:
        """TTL of a job's keys before it ends, so that even an abandoned job cannot live forever."""
        return self.job_timeout_seconds * 2 + self.retention_seconds


class ClientSettings(BaseSettings):
    """The client commands' settings (submit, follow, status, cancel): where the gateway answers."""

    model_config = SettingsConfigDict(env_prefix="STREAMPOOL_", extra="forbid")

    url: str = Field("http://127.0.0.1:8000", description="gateway the client commands talk to")
    api_key: str | None = Field(None, description="API key sent as `Authorization: Bearer`")
