"""docker-compose.yml: valid against the Compose Specification, scalable workers, persistent Redis,
and only settings that exist."""

from __future__ import annotations

import copy
import re
from typing import Any

from tests.deploy.manifests import (
    COMPOSE_FILE,
    ENV_PREFIX,
    REPO,
    compose_validator,
    load_yaml,
    settings_env_names,
)

COMPOSE: dict[str, Any] = load_yaml(COMPOSE_FILE)
SERVICES: dict[str, Any] = COMPOSE["services"]
WORKERS = ("worker", "worker-cpu")
ENV_FILE_EXAMPLE = REPO / "deploy" / "streampool.env.example"


def seconds(duration: str) -> int:
    """A Compose duration such as `45s` or `1m30s`."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert duration and parts, duration
    minutes, rest = (int(part or 0) for part in parts.groups())
    return minutes * 60 + rest


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    compose_validator().validate(COMPOSE)


def test_compose_spec_refuses_an_unknown_service_key() -> None:
    broken = copy.deepcopy(COMPOSE)
    broken["services"]["worker"]["gpus_reserved"] = 1
    assert not compose_validator().is_valid(broken)


def test_workers_scale_without_fixed_names_or_host_ports() -> None:
    for name in WORKERS:
        assert "container_name" not in SERVICES[name]
        assert "ports" not in SERVICES[name]


def test_worker_reserves_a_gpu_and_the_cpu_worker_is_a_profile() -> None:
    [device] = SERVICES["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    assert device["count"] == 1
    assert "profiles" not in SERVICES["worker"]
    assert SERVICES["worker-cpu"]["profiles"] == ["cpu"]
    assert "deploy" not in SERVICES["worker-cpu"]


def test_redis_keeps_its_data_in_a_volume() -> None:
    redis = SERVICES["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    [volume] = redis["volumes"]
    name, path = volume.split(":")
    assert path == "/data"
    assert name in COMPOSE["volumes"]
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_gateway_and_workers_wait_for_a_healthy_redis() -> None:
    for name in ("gateway", *WORKERS):
        assert SERVICES[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert SERVICES["gateway"]["ports"] == ["8000:8000"]


def test_workers_get_time_to_drain() -> None:
    for name in WORKERS:
        service = SERVICES[name]
        drain = float(service["environment"]["STREAMPOOL_DRAIN_SECONDS"])
        assert seconds(service["stop_grace_period"]) >= drain + 10


def test_services_build_from_the_dockerfiles_here() -> None:
    for name in ("gateway", *WORKERS):
        build = SERVICES[name]["build"]
        assert (REPO / build["context"] / build["dockerfile"]).is_file()


def test_gateway_reads_its_keys_from_the_env_file_of_the_example() -> None:
    [env_file] = SERVICES["gateway"]["env_file"]
    assert env_file == {"path": "deploy/streampool.env", "required": False}
    assert REPO / f"{env_file['path']}.example" == ENV_FILE_EXAMPLE
    example = ENV_FILE_EXAMPLE.read_text()
    assert re.search(r"^STREAMPOOL_API_KEYS=", example, re.MULTILINE)
    assert re.search(r"^# STREAMPOOL_ALLOW_UNAUTHENTICATED=true$", example, re.MULTILINE)


def test_every_streampool_variable_is_a_setting() -> None:
    names = {name for service in SERVICES.values() for name in service.get("environment", {})}
    names |= set(re.findall(r"^(?:# )?(STREAMPOOL_[A-Z_]+)=", ENV_FILE_EXAMPLE.read_text(), re.MULTILINE))
    streampool_names = {name for name in names if name.startswith(ENV_PREFIX)}
    assert "STREAMPOOL_REDIS_URL" in streampool_names
    assert streampool_names - settings_env_names() == set()
