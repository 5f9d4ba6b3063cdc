# syntax=docker/dockerfile:1
# The gateway image: the base install only (FastAPI, redis, arq; no torch, no vLLM).
# Build from the repository root:
#   docker build -f docker/gateway.Dockerfile -t streampool-gateway:0.1.0 .
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
COPY . /src
RUN /opt/venv/bin/pip install /src

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 streampool \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/streampool streampool \
    && install -d -o 10001 -g 10001 /home/streampool/files
COPY --from=build /opt/venv /opt/venv
COPY docker/healthcheck.py /opt/streampool/healthcheck.py
WORKDIR /home/streampool
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
EXPOSE 8000
# /health is 200 once Redis answers and a worker is live or a model is known.
HEALTHCHECK --interval=15s --timeout=6s --start-period=20s --retries=3 \
    CMD ["python3", "/opt/streampool/healthcheck.py", "port"]
ENTRYPOINT ["streampool"]
CMD ["gateway"]
