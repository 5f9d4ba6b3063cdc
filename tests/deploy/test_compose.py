"""docker-compose.yml: valid against the Compose Specification, scalable workers, persistent Redis,
its Sentinel and Redis Cluster profiles, and only settings that exist."""

from __future__ import annotations

import copy
import re
from typing import Any

from shared.config import RedisSettings
from shared.redis_url import parse_cluster_url
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
WORKERS = ("worker", "worker-cpu", "worker-chat", "worker-cpu-chat")
ENV_FILE_EXAMPLE = REPO / "deploy" / "streampool.env.example"
CLUSTER_NODES = [f"redis-node-{n}" for n in range(1, 7)]


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


def test_redis_has_a_memory_limit_it_never_evicts_under() -> None:
    command = SERVICES["redis"]["command"]
    assert command[command.index("--maxmemory") + 1] == "1gb"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_redis_syncs_every_second_unless_always_is_asked_for() -> None:
    """`always` is offered through REDIS_APPENDFSYNC, for deployments that cannot lose a submission
    already answered 202; the comment above the command says so."""
    command = SERVICES["redis"]["command"]
    fsync = command[command.index("--appendfsync") + 1]
    variable, default = re.fullmatch(r"\$\{(\w+):-(\w+)\}", fsync).groups()  # type: ignore[union-attr]
    assert default == "everysec"
    assert f"{variable}=always docker compose up" in COMPOSE_FILE.read_text()


def test_workers_serve_health_and_metrics_to_the_compose_network() -> None:
    for name in WORKERS:
        assert SERVICES[name]["environment"]["STREAMPOOL_METRICS_HOST"] == "0.0.0.0"


def test_the_sentinel_profile_adds_a_replica_of_redis_and_three_sentinels_watching_it() -> None:
    sentinels = [name for name, service in SERVICES.items() if name.startswith("sentinel-")]
    assert len(sentinels) == 3
    for name in [*sentinels, "redis-replica"]:
        assert SERVICES[name]["profiles"] == ["sentinel"]
    replica = SERVICES["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1 : replica.index("--replicaof") + 3] == ["redis", "6379"]
    for name in sentinels:
        script = SERVICES[name]["command"][-1]
        assert "'sentinel monitor streampool redis 6379 2'" in script
        assert script.endswith("--sentinel")
    # The URL gateways and workers take names the three Sentinels and the master they watch.
    url = "redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/streampool"
    assert f"STREAMPOOL_REDIS_URL={url}" in COMPOSE_FILE.read_text()


def test_two_models_each_with_gpu_and_cpu_workers_the_gateway_declares() -> None:
    """Each worker serves one model (its first served name; the folder's name by default) and
    the gateway declares every one of them, so that their jobs queue before a worker runs."""
    gateway = SERVICES["gateway"]["environment"]
    declared = gateway["STREAMPOOL_MODELS"].split(",")
    served = {
        name: SERVICES[name]["environment"].get("STREAMPOOL_SERVED_MODEL_NAME", "SmolLM2-135M-Instruct")
        for name in WORKERS
    }
    assert sorted(set(served.values())) == sorted(declared) and len(declared) == 2
    assert gateway["STREAMPOOL_DEFAULT_MODEL"] in declared
    assert SERVICES["worker-chat"]["deploy"] == SERVICES["worker"]["deploy"]  # a GPU each
    assert SERVICES["worker-cpu-chat"]["profiles"] == ["cpu"]


def test_the_cluster_profile_adds_six_redis_nodes_in_cluster_mode_reached_by_their_service_names() -> None:
    redis = SERVICES["redis"]["command"]
    for name in CLUSTER_NODES:
        node = SERVICES[name]
        assert node["profiles"] == ["cluster"]
        assert node["hostname"] == name  # what "$(hostname)" announces
        script = node["command"][-1]
        assert "--cluster-enabled yes" in script
        assert '--cluster-announce-hostname "$$(hostname)"' in script
        assert "--cluster-preferred-endpoint-type hostname" in script
        # Persistence and memory limit as the main Redis's.
        for option in ("--appendonly", "--appendfsync", "--maxmemory", "--maxmemory-policy"):
            assert f"{option} {redis[redis.index(option) + 1]} " in f"{script} "
        # Addresses in nodes.conf are looked up again by name before Redis starts.
        assert script.index("getent hosts") < script.index("exec docker-entrypoint.sh redis-server")
        assert node["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    volumes = [volume.split(":") for name in CLUSTER_NODES for volume in SERVICES[name]["volumes"]]
    assert volumes == [[f"{name}-data", "/data"] for name in CLUSTER_NODES]
    assert {f"{name}-data" for name in CLUSTER_NODES} <= set(COMPOSE["volumes"])


def test_the_cluster_is_formed_once_its_nodes_answer_and_only_checked_once_it_exists() -> None:
    create = SERVICES["redis-cluster-create"]
    assert create["profiles"] == ["cluster"]
    assert create["depends_on"] == {name: {"condition": "service_healthy"} for name in CLUSTER_NODES}
    script = create["command"][-1]
    formed = re.search(r"redis-cli --cluster create (.+?) --cluster-replicas 1 --cluster-yes", script)
    assert formed and formed.group(1).split() == [f"{name}:6379" for name in CLUSTER_NODES]
    # A node that knows others is part of a formed cluster: then report on it, create nothing.
    known = script.index("cluster_known_nodes")
    assert known < script.index("redis-cli --cluster check redis-node-1:6379; exit 0") < formed.start()


def test_the_documented_cluster_url_names_the_six_nodes_and_gateway_and_workers_take_it() -> None:
    [url] = re.findall(r"STREAMPOOL_STREAMS_REDIS_URL=(\S+)", COMPOSE_FILE.read_text())
    assert parse_cluster_url(url).nodes == tuple((name, 6379) for name in CLUSTER_NODES)
    assert RedisSettings(streams_redis_url=url).streams_redis_url == url
    assert f"STREAMPOOL_STREAMS_REDIS_URL={url} \\\n#       docker compose --profile cluster up" in (
        COMPOSE_FILE.read_text()
    )
    # Passed from the shell (no value here): unset there, it is unset in the containers too, and
    # the streams stay on `redis`.
    for name in ("gateway", *WORKERS):
        environment = SERVICES[name]["environment"]
        assert "STREAMPOOL_STREAMS_REDIS_URL" in environment
        assert environment["STREAMPOOL_STREAMS_REDIS_URL"] is None
