"""k8s/redis-sentinel/: a Sentinel-managed Redis (master and replica, three Sentinels) valid against the
Kubernetes schemas, with its names, ports and password consistent, and the URL it documents one
that streampool takes."""

from __future__ import annotations

import re

import pytest
import yaml

from shared.redis_url import parse_sentinel_url
from tests.deploy.manifests import K8S, Manifest, containers, find, kubernetes_validator, load_yaml, selects

FOLDER = K8S / "redis-sentinel"
KUSTOMIZATION = load_yaml(FOLDER / "kustomization.yaml")
OBJECTS: list[Manifest] = [
    doc
    for resource in KUSTOMIZATION["resources"]
    for doc in yaml.safe_load_all((FOLDER / resource).read_text())
    if doc
]
REDIS = find(OBJECTS, "StatefulSet", "streampool-redis")
SENTINELS = find(OBJECTS, "StatefulSet", "streampool-redis-sentinel")


def label(manifest: Manifest) -> str:
    return f"{manifest['kind']}/{manifest['metadata']['name']}"


def test_kustomization_lists_every_manifest_in_the_folder() -> None:
    on_disk = sorted(p.name for p in FOLDER.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(KUSTOMIZATION["resources"]) == on_disk


@pytest.mark.parametrize("manifest", OBJECTS, ids=label)
def test_manifest_is_valid_against_the_kubernetes_schema(manifest: Manifest) -> None:
    kubernetes_validator(manifest).validate(manifest)


def test_a_master_and_a_replica_and_three_sentinels_with_a_quorum_of_two() -> None:
    assert REDIS["spec"]["replicas"] == 2
    assert SENTINELS["spec"]["replicas"] == 3
    [sentinel] = containers(SENTINELS)
    script = sentinel["command"][-1]
    assert '"sentinel monitor streampool $master 6379 2"' in script
    assert "--sentinel" in script


def test_each_statefulset_has_its_headless_service_selecting_its_pods() -> None:
    for workload in (REDIS, SENTINELS):
        service = find(OBJECTS, "Service", workload["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None"
        assert selects(service["spec"]["selector"], workload)
        [container] = containers(workload)
        assert {port["targetPort"] for port in service["spec"]["ports"]} == {
            port["name"] for port in container["ports"]
        }


def test_redis_and_sentinels_share_the_password_of_the_streampool_redis_secret() -> None:
    for workload in (REDIS, SENTINELS):
        [container] = containers(workload)
        [auth] = [env for env in container["env"] if env["name"] == "REDISCLI_AUTH"]
        assert auth["valueFrom"]["secretKeyRef"] == {"name": "streampool-redis", "key": "password"}
    [redis] = containers(REDIS)
    assert '--masterauth "$REDISCLI_AUTH"' in redis["command"][2]


def test_the_documented_url_names_the_three_sentinel_pods_and_the_monitored_master() -> None:
    text = (FOLDER / "kustomization.yaml").read_text()
    [url] = re.findall(r"STREAMPOOL_REDIS_URL: (\S+)", text)
    parsed = parse_sentinel_url(url)
    service = SENTINELS["spec"]["serviceName"]
    assert parsed.sentinels == tuple((f"{service}-{n}.{service}", 26379) for n in range(3))
    assert parsed.master == "streampool"
