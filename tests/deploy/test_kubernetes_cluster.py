"""k8s/redis-cluster/: a Redis Cluster for the job streams (six nodes, a Job that forms it) valid
against the Kubernetes schemas, with its names, ports and password consistent, and the patch it
applies giving every gateway and worker a URL that streampool takes."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.config import RedisSettings
from shared.redis_url import parse_cluster_url
from tests.deploy.manifests import (
    K8S,
    Manifest,
    containers,
    find,
    k8s_manifests,
    kubernetes_validator,
    load_yaml,
    selects,
    settings_env_names,
)

FOLDER = K8S / "redis-cluster"
KUSTOMIZATION = load_yaml(FOLDER / "kustomization.yaml")
OBJECTS: list[Manifest] = [
    doc
    for resource in KUSTOMIZATION["resources"]
    for doc in yaml.safe_load_all((FOLDER / resource).read_text())
    if doc
]
NODES = find(OBJECTS, "StatefulSet", "streampool-redis-cluster")
JOB = find(OBJECTS, "Job", "streampool-redis-cluster-create")
SERVICE = NODES["spec"]["serviceName"]
NODE_NAMES = [f"{NODES['metadata']['name']}-{n}.{SERVICE}" for n in range(NODES["spec"]["replicas"])]
STREAMS_URL = "STREAMPOOL_STREAMS_REDIS_URL"


def label(manifest: Manifest) -> str:
    return f"{manifest['kind']}/{manifest['metadata']['name']}"


def job_script() -> str:
    [container] = JOB["spec"]["template"]["spec"]["containers"]
    script: str = container["command"][-1]
    return script


def with_the_patch(objects: list[Manifest]) -> list[Manifest]:
    """The objects after the component's patch: its JSON patch (appends only) applied to every
    Deployment its label selector (one set-based requirement) picks."""
    [patch] = KUSTOMIZATION["patches"]
    target = patch["target"]
    requirement = re.fullmatch(r"([\w./-]+) in \(([^)]*)\)", target["labelSelector"])
    assert requirement, target["labelSelector"]
    key, values = requirement.group(1), requirement.group(2).split(",")
    patched = copy.deepcopy(objects)
    for manifest in patched:
        if manifest["kind"] == target["kind"] and manifest["metadata"]["labels"].get(key) in values:
            for operation in yaml.safe_load(patch["patch"]):
                assert operation["op"] == "add" and operation["path"].endswith("/-")
                node: Any = manifest
                for part in operation["path"].strip("/").split("/")[:-1]:
                    node = node[int(part)] if isinstance(node, list) else node[part]
                node.append(operation["value"])
    return patched


def test_kustomization_is_a_component_listing_every_manifest_in_the_folder() -> None:
    assert KUSTOMIZATION["kind"] == "Component"
    on_disk = sorted(p.name for p in FOLDER.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(KUSTOMIZATION["resources"]) == on_disk


@pytest.mark.parametrize("manifest", OBJECTS, ids=label)
def test_manifest_is_valid_against_the_kubernetes_schema(manifest: Manifest) -> None:
    kubernetes_validator(manifest).validate(manifest)


def test_kubernetes_schema_of_a_job_refuses_an_unknown_field() -> None:
    broken = copy.deepcopy(JOB)
    broken["spec"]["backoffLimits"] = 6
    assert not kubernetes_validator(broken).is_valid(broken)


def test_six_nodes_in_cluster_mode_that_announce_their_stable_names() -> None:
    assert NODES["spec"]["replicas"] == 6
    assert NODES["spec"]["podManagementPolicy"] == "Parallel"
    [container] = containers(NODES)
    args = container["args"]
    assert args[args.index("--cluster-enabled") + 1] == "yes"
    assert args[args.index("--cluster-preferred-endpoint-type") + 1] == "hostname"
    script = container["command"][2]
    assert f'--cluster-announce-hostname "$(hostname).{SERVICE}"' in script
    # Addresses in nodes.conf are looked up again by name before Redis starts.
    assert script.index("getent hosts") < script.index('exec redis-server "$@"')
    # Persistence and memory limit as ../redis.yaml's.
    [redis] = containers(find(k8s_manifests(), "StatefulSet", "streampool-redis"))
    for option in ("--appendonly", "--appendfsync", "--maxmemory", "--maxmemory-policy"):
        assert args[args.index(option) + 1] == redis["args"][redis["args"].index(option) + 1]
    [claim] = NODES["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in container["volumeMounts"]


def test_the_headless_service_publishes_every_node_and_targets_its_ports() -> None:
    service = find(OBJECTS, "Service", SERVICE)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert selects(service["spec"]["selector"], NODES)
    [container] = containers(NODES)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"redis": 6379, "bus": 16379}
    assert {port["targetPort"] for port in service["spec"]["ports"]} == set(ports)


def test_nodes_and_job_share_the_password_of_the_streampool_redis_secret() -> None:
    for pod in (NODES["spec"]["template"]["spec"], JOB["spec"]["template"]["spec"]):
        [container] = pod["containers"]
        [auth] = [env for env in container["env"] if env["name"] == "REDISCLI_AUTH"]
        assert auth["valueFrom"]["secretKeyRef"] == {"name": "streampool-redis", "key": "password"}
        assert pod["enableServiceLinks"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
    [node] = containers(NODES)
    assert '--requirepass "$REDISCLI_AUTH" --masterauth "$REDISCLI_AUTH"' in node["command"][2]


def test_the_job_waits_for_the_six_nodes_then_forms_the_cluster_unless_it_is_formed() -> None:
    script = job_script()
    nodes = re.search(r'nodes="([^"]+)"', script)
    assert nodes and nodes.group(1).split() == [f"{name}:6379" for name in NODE_NAMES]
    waited = script.index("until redis-cli -h")
    known = script.index("cluster_known_nodes")
    reported = script.index('redis-cli --cluster check "$first"; exit 0')
    formed = script.index("exec redis-cli --cluster create $nodes --cluster-replicas 1 --cluster-yes")
    assert waited < known < reported < formed
    assert JOB["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"


def test_clients_and_the_job_reach_the_nodes_and_only_the_nodes_their_bus() -> None:
    policy = find(OBJECTS, "NetworkPolicy", "streampool-redis-cluster")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], NODES)
    by_port = {rule["ports"][0]["port"]: rule["from"][0]["podSelector"] for rule in policy["spec"]["ingress"]}
    [components] = by_port[6379]["matchExpressions"]
    job_component = JOB["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
    assert set(components["values"]) == {"gateway", "worker", "redis-cluster", job_component}
    assert selects(by_port[16379]["matchLabels"], NODES)


def test_the_patch_gives_every_gateway_and_worker_the_url_of_the_six_nodes() -> None:
    assert STREAMS_URL in settings_env_names()
    patched = with_the_patch(k8s_manifests())
    changed = [label(o) for o, before in zip(patched, k8s_manifests(), strict=True) if o != before]
    assert changed == ["Deployment/streampool-gateway", "Deployment/streampool-worker"]
    for name in ("streampool-gateway", "streampool-worker"):
        [container, *_] = containers(find(patched, "Deployment", name))
        env = [variable["name"] for variable in container["env"]]
        # Kubernetes puts in $(REDIS_PASSWORD) only when it is defined before the URL.
        assert env.index("REDIS_PASSWORD") < env.index(STREAMS_URL)
        [url] = [variable["value"] for variable in container["env"] if variable["name"] == STREAMS_URL]
        url = url.replace("$(REDIS_PASSWORD)", "secret")
        parsed = parse_cluster_url(url)
        assert parsed.nodes == tuple((node, 6379) for node in NODE_NAMES)
        assert parsed.password == "secret"
        assert RedisSettings(streams_redis_url=url).streams_redis_url == url


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its kustomize) is not installed")
def test_kustomize_builds_the_base_with_the_component(tmp_path: Path) -> None:
    """What the patch helper above stands in for, where kubectl is at hand: kustomize itself."""
    base = tmp_path / "k8s"
    shutil.copytree(K8S, base)
    with (base / "kustomization.yaml").open("a") as kustomization:
        kustomization.write("components:\n  - redis-cluster\n")
    built = subprocess.run(["kubectl", "kustomize", str(base)], capture_output=True, text=True, check=True)
    objects = [doc for doc in yaml.safe_load_all(built.stdout) if doc]
    assert label(find(objects, "Job", JOB["metadata"]["name"])) == label(JOB)
    expected = with_the_patch(k8s_manifests())
    for name in ("streampool-gateway", "streampool-worker"):
        assert (
            containers(find(objects, "Deployment", name))[0]["env"]
            == (containers(find(expected, "Deployment", name))[0]["env"])
        )
