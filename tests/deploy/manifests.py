"""The deployment files as data, the vendored schemas that validate them, and the settings they name."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource

from shared.config import Settings

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = Path(__file__).resolve().parent / "schemas"
KUBERNETES_SCHEMAS = SCHEMAS / "kubernetes-v1.34.0-local-strict"
K8S = REPO / "k8s"
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKER = REPO / "docker"

ENV_PREFIX = "STREAMPOOL_"
# Histograms are queried through their series; the metric's name is what precedes the suffix.
HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")
METRIC = re.compile(r"\bstreampool_[a-z0-9_]+")

Manifest = dict[str, Any]

# The contract: every metric that gateways and workers export. Dashboards and autoscalers may
# query these names and no others.
METRICS = frozenset(
    {
        # gateway
        "streampool_jobs_submitted_total",
        "streampool_jobs_rejected_total",
        "streampool_queue_depth",
        "streampool_jobs",
        "streampool_sse_streams_open",
        "streampool_relay_lag_seconds",
        "streampool_http_requests_total",
        # worker, on its metrics_port
        "streampool_worker_jobs_running",
        "streampool_worker_jobs_finished_total",
        "streampool_time_to_first_token_seconds",
        "streampool_inter_token_latency_seconds",
        "streampool_e2e_latency_seconds",
        "streampool_generated_tokens_total",
        "streampool_cancels_total",
        "streampool_cancel_latency_seconds",
        "streampool_resumes_total",
    }
)


def settings_env_names() -> set[str]:
    """Every variable `Settings` reads: STREAMPOOL_<FIELD>."""
    return {ENV_PREFIX + name.upper() for name in Settings.model_fields}


def metrics_in(expr: str) -> set[str]:
    """The streampool metric names a PromQL expression reads (histogram series folded to their metric)."""
    return {HISTOGRAM_SERIES.sub("", name) for name in METRIC.findall(expr)}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def k8s_manifests() -> list[Manifest]:
    """Every object that k8s/kustomization.yaml lists, in order."""
    kustomization = load_yaml(K8S / "kustomization.yaml")
    objects: list[Manifest] = []
    for resource in kustomization["resources"]:
        objects.extend(doc for doc in yaml.safe_load_all((K8S / resource).read_text()) if doc)
    return objects


def find(objects: list[Manifest], kind: str, name: str) -> Manifest:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def workloads(objects: list[Manifest]) -> Iterator[Manifest]:
    return (o for o in objects if o["kind"] in ("Deployment", "StatefulSet"))


def containers(workload: Manifest) -> list[Manifest]:
    containers: list[Manifest] = workload["spec"]["template"]["spec"]["containers"]
    return containers


def container_ports(workload: Manifest) -> dict[str | int, int]:
    """A workload's container ports by name and by number, each to its number."""
    ports: dict[str | int, int] = {}
    for container in containers(workload):
        for port in container.get("ports", []):
            ports[port["containerPort"]] = port["containerPort"]
            if "name" in port:
                ports[port["name"]] = port["containerPort"]
    return ports


def selects(selector: dict[str, str], workload: Manifest) -> bool:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return selector.items() <= labels.items()


def config_value(objects: list[Manifest], env_name: str) -> Any:
    """A setting as the ConfigMap gives it, else its default in `Settings`."""
    data = find(objects, "ConfigMap", "streampool-config")["data"]
    if env_name in data:
        return data[env_name]
    return Settings.model_fields[env_name.removeprefix(ENV_PREFIX).lower()].default


@cache
def _kubernetes_registry() -> Registry:
    definitions = json.loads((KUBERNETES_SCHEMAS / "_definitions.json").read_text())
    return Resource.from_contents(definitions) @ Registry()


def kubernetes_validator(manifest: Manifest) -> jsonschema.protocols.Validator:
    """The strict schema of the manifest's kind and apiVersion (e.g. deployment-apps-v1.json)."""
    # apps/v1 -> apps-v1, policy/v1 -> policy-v1, v1 -> v1 (the schema files' naming)
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", manifest["apiVersion"])
    schema_file = KUBERNETES_SCHEMAS / f"{manifest['kind'].lower()}-{group_version}.json"
    schema = json.loads(schema_file.read_text())
    return jsonschema.Draft202012Validator(schema, registry=_kubernetes_registry())


def _strict(schema: Any) -> Any:
    """Refuses unknown fields wherever the schema lists the known ones, as the API server's
    strict field validation (kubectl's default) does for a custom resource."""
    if isinstance(schema, dict):
        strict = {key: _strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            strict["additionalProperties"] = False
        return strict
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def scaledobject_validator() -> jsonschema.protocols.Validator:
    crd = load_yaml(SCHEMAS / "keda-scaledobjects-crd.yaml")
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def compose_validator() -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMAS / "compose-spec.json").read_text()))
