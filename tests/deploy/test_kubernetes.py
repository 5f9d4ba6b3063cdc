"""k8s/: every manifest valid against the Kubernetes (and KEDA) schemas, and the references between
them (selectors, ports, probes, settings, the worker's drain) consistent."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from tests.deploy.manifests import (
    ENV_PREFIX,
    K8S,
    METRICS,
    Manifest,
    config_value,
    container_ports,
    containers,
    find,
    k8s_manifests,
    kubernetes_validator,
    load_yaml,
    metrics_in,
    scaledobject_validator,
    selects,
    settings_env_names,
    workloads,
)

OBJECTS = k8s_manifests()
GATEWAY = find(OBJECTS, "Deployment", "streampool-gateway")
WORKER = find(OBJECTS, "Deployment", "streampool-worker")
SCALED_OBJECT = find(OBJECTS, "ScaledObject", "streampool-worker")
KUBERNETES_OBJECTS = [o for o in OBJECTS if o["kind"] != "ScaledObject"]


def label(manifest: Manifest) -> str:
    return f"{manifest['kind']}/{manifest['metadata']['name']}"


def test_kustomization_lists_every_manifest_in_the_folder() -> None:
    listed = load_yaml(K8S / "kustomization.yaml")["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk


@pytest.mark.parametrize("manifest", KUBERNETES_OBJECTS, ids=label)
def test_manifest_is_valid_against_the_kubernetes_schema(manifest: Manifest) -> None:
    kubernetes_validator(manifest).validate(manifest)


def test_kubernetes_schema_refuses_an_unknown_field() -> None:
    """The vendored schemas are the strict variant: a misspelt field fails instead of being dropped."""
    broken = copy.deepcopy(WORKER)
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    assert not kubernetes_validator(broken).is_valid(broken)


def test_scaledobject_is_valid_against_the_keda_crd() -> None:
    scaledobject_validator().validate(SCALED_OBJECT)
    misspelt = copy.deepcopy(SCALED_OBJECT)
    misspelt["spec"]["maxReplicas"] = 8
    assert not scaledobject_validator().is_valid(misspelt)


def test_manifests_name_no_namespace() -> None:
    assert [label(o) for o in OBJECTS if "namespace" in o["metadata"]] == []


@pytest.mark.parametrize("workload", list(workloads(OBJECTS)), ids=label)
def test_workload_selector_matches_its_pod_labels(workload: Manifest) -> None:
    assert selects(workload["spec"]["selector"]["matchLabels"], workload)


@pytest.mark.parametrize("workload", list(workloads(OBJECTS)), ids=label)
def test_pods_get_no_service_links_and_run_as_non_root(workload: Manifest) -> None:
    """Service links would put variables such as STREAMPOOL_GATEWAY_PORT=tcp://... into the
    environment, where the STREAMPOOL_ prefix belongs to the settings."""
    pod = workload["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0


@pytest.mark.parametrize("service", [o for o in OBJECTS if o["kind"] == "Service"], ids=label)
def test_service_selects_one_workload_and_targets_its_ports(service: Manifest) -> None:
    [workload] = [w for w in workloads(OBJECTS) if selects(service["spec"]["selector"], w)]
    ports = container_ports(workload)
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports, (service["metadata"]["name"], port)


def test_statefulset_governing_service_is_headless() -> None:
    redis = find(OBJECTS, "StatefulSet", "streampool-redis")
    service = find(OBJECTS, "Service", redis["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert selects(service["spec"]["selector"], redis)


def test_redis_persists_to_a_volume_claim() -> None:
    redis = find(OBJECTS, "StatefulSet", "streampool-redis")
    [container] = containers(redis)
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    [claim] = redis["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in container["volumeMounts"]


@pytest.mark.parametrize("workload", list(workloads(OBJECTS)), ids=label)
def test_probes_and_scrape_annotations_use_container_ports(workload: Manifest) -> None:
    ports = container_ports(workload)
    for container in containers(workload):
        for probe_kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(probe_kind, {})
            for action in ("httpGet", "tcpSocket"):
                if action in probe:
                    assert probe[action]["port"] in ports, (container["name"], probe_kind)
    annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") == "true":
        assert int(annotations["prometheus.io/port"]) in ports


def test_gateway_listens_where_settings_say_and_is_ready_on_health() -> None:
    port = int(config_value(OBJECTS, "STREAMPOOL_PORT"))
    [container] = containers(GATEWAY)
    assert container_ports(GATEWAY)[container["readinessProbe"]["httpGet"]["port"]] == port
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_worker_probes_health_on_its_metrics_port() -> None:
    metrics_port = int(config_value(OBJECTS, "STREAMPOOL_METRICS_PORT"))
    [container] = containers(WORKER)
    ports = container_ports(WORKER)
    for probe_kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[probe_kind]["httpGet"]
        assert probe["path"] == "/health"
        assert ports[probe["port"]] == metrics_port


def test_worker_grace_period_covers_the_drain() -> None:
    drain = float(config_value(OBJECTS, "STREAMPOOL_DRAIN_SECONDS"))
    grace = WORKER["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= drain + 10, "the worker needs time after the drain to hand jobs over and stop"


def test_worker_requests_one_gpu() -> None:
    [container] = containers(WORKER)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_gateway_autoscaler_keeps_several_replicas_on_cpu() -> None:
    hpa = find(OBJECTS, "HorizontalPodAutoscaler", "streampool-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": GATEWAY["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] >= 2
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert "replicas" not in GATEWAY["spec"], "the autoscaler owns the replica count"


@pytest.mark.parametrize("budget", [o for o in OBJECTS if o["kind"] == "PodDisruptionBudget"], ids=label)
def test_disruption_budget_selects_one_workload(budget: Manifest) -> None:
    assert len([w for w in workloads(OBJECTS) if selects(budget["spec"]["selector"]["matchLabels"], w)]) == 1


def test_scaledobject_scales_the_worker_on_contract_metrics() -> None:
    spec = SCALED_OBJECT["spec"]
    assert spec["scaleTargetRef"]["name"] == WORKER["metadata"]["name"]
    assert spec["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
    assert "replicas" not in WORKER["spec"], "KEDA owns the replica count"
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus"
    queried = metrics_in(trigger["metadata"]["query"])
    assert "streampool_queue_depth" in queried
    assert queried <= METRICS
    max_jobs = int(config_value(OBJECTS, "STREAMPOOL_WORKER_MAX_JOBS"))
    assert 0 < float(trigger["metadata"]["threshold"]) < max_jobs


def test_pods_read_config_and_secret_that_exist() -> None:
    for workload in workloads(OBJECTS):
        for container in containers(workload):
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    find(OBJECTS, "ConfigMap", source["configMapRef"]["name"])
                if "secretRef" in source:
                    find(OBJECTS, "Secret", source["secretRef"]["name"])
    [gateway] = containers(GATEWAY)
    assert {"secretRef": {"name": "streampool-api-keys"}} in gateway["envFrom"]


def test_every_streampool_variable_is_a_setting() -> None:
    names = set(find(OBJECTS, "ConfigMap", "streampool-config")["data"])
    names |= set(find(OBJECTS, "Secret", "streampool-api-keys")["stringData"])
    for workload in workloads(OBJECTS):
        for container in containers(workload):
            names |= {env["name"] for env in container.get("env", [])}
    streampool_names = {name for name in names if name.startswith(ENV_PREFIX)}
    assert "STREAMPOOL_API_KEYS" in streampool_names
    assert streampool_names - settings_env_names() == set()


REDIS = find(OBJECTS, "StatefulSet", "streampool-redis")
REDIS_PASSWORD = {"secretKeyRef": {"name": "streampool-redis", "key": "password"}}


def test_redis_requires_the_password_of_its_secret_and_never_starts_without_one() -> None:
    [container] = containers(REDIS)
    assert {"name": "REDISCLI_AUTH", "valueFrom": REDIS_PASSWORD} in container["env"]
    shell, flag, script, *_ = container["command"]
    assert (shell, flag) == ("sh", "-c")
    assert script.startswith('test -n "$REDISCLI_AUTH" || {')
    assert script.endswith('exec redis-server "$@" --requirepass "$REDISCLI_AUTH"')
    secret = find(OBJECTS, "Secret", REDIS_PASSWORD["secretKeyRef"]["name"])
    assert secret["stringData"][REDIS_PASSWORD["secretKeyRef"]["key"]] == "", "filled in at deployment"


@pytest.mark.parametrize("workload", [GATEWAY, WORKER], ids=label)
def test_gateways_and_workers_reach_redis_with_its_password(workload: Manifest) -> None:
    [container] = containers(workload)
    env = [variable["name"] for variable in container["env"]]
    by_name = {variable["name"]: variable for variable in container["env"]}
    assert by_name["REDIS_PASSWORD"]["valueFrom"] == REDIS_PASSWORD
    assert by_name["STREAMPOOL_REDIS_URL"]["value"] == "redis://:$(REDIS_PASSWORD)@streampool-redis:6379/0"
    # Kubernetes puts in $(NAME) only from variables defined before it.
    assert env.index("REDIS_PASSWORD") < env.index("STREAMPOOL_REDIS_URL")


def test_redis_memory_is_bounded_and_never_evicted() -> None:
    [container] = containers(REDIS)
    args = container["args"]
    assert args[args.index("--maxmemory") + 1] == "1gb"
    assert container["resources"]["limits"]["memory"] == "2Gi", "twice maxmemory: the rewrite forks"


def test_only_gateways_and_workers_may_reach_redis() -> None:
    policy = find(OBJECTS, "NetworkPolicy", "streampool-redis")
    spec = policy["spec"]
    assert [w for w in workloads(OBJECTS) if selects(spec["podSelector"]["matchLabels"], w)] == [REDIS]
    assert spec["policyTypes"] == ["Ingress"]
    [rule] = spec["ingress"]
    allowed = [
        w
        for w in workloads(OBJECTS)
        for peer in rule["from"]
        if selects(peer["podSelector"]["matchLabels"], w)
    ]
    assert sorted(label(w) for w in allowed) == sorted(label(w) for w in (GATEWAY, WORKER))
    assert all(set(peer) == {"podSelector"} for peer in rule["from"]), (
        "no namespace or address opens it wider"
    )
    [port] = rule["ports"]
    assert container_ports(REDIS)[port["port"]] == 6379


def test_worker_serves_its_probes_and_scrapes_beyond_the_pod() -> None:
    """The worker's /health and /metrics listen on 127.0.0.1 unless told otherwise; the kubelet's
    probes and Prometheus come from outside the pod."""
    assert config_value(OBJECTS, "STREAMPOOL_METRICS_HOST") == "0.0.0.0"


def test_scaledobject_scales_its_model_on_that_models_queue_alone() -> None:
    """One Deployment and ScaledObject per model: the query reads the metrics of the model the
    Deployment's workers serve, and the Deployment selects its model's pods only."""
    [container] = containers(WORKER)
    served = next(env["value"] for env in container["env"] if env["name"] == "STREAMPOOL_SERVED_MODEL_NAME")
    model = served.split(",")[0]
    query = SCALED_OBJECT["spec"]["triggers"][0]["metadata"]["query"]
    selectors = re.findall(r"\b(streampool_[a-z_]+)(\{[^}]*\})?", query)
    assert selectors and all(labels == f'{{model="{model}"}}' for _, labels in selectors), query
    label = WORKER["spec"]["selector"]["matchLabels"]["streampool.io/model"]
    assert WORKER["spec"]["template"]["metadata"]["labels"]["streampool.io/model"] == label
    assert model in config_value(OBJECTS, "STREAMPOOL_MODELS").split(",")


def test_the_tensor_parallel_example_is_a_valid_worker_on_two_gpus_with_shared_memory() -> None:
    [example] = [
        doc for doc in yaml.safe_load_all((K8S / "examples" / "worker-tensor-parallel.yaml").read_text())
    ]
    kubernetes_validator(example).validate(example)
    assert selects(example["spec"]["selector"]["matchLabels"], example)
    [container] = containers(example)
    args = container["args"]
    assert args[0] == "worker" and args[args.index("--tensor-parallel-size") + 1] == "2"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 2
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    [shm] = [volume for volume in example["spec"]["template"]["spec"]["volumes"] if volume["name"] == "dshm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert example["metadata"]["name"] != WORKER["metadata"]["name"]
