# syntax=docker/dockerfile:1
# kelvin: one image for every entry point (kelvin extender | exporter | operator | simulate | demo).
# Build:  docker build -t ghcr.io/kelvin-sched/kelvin:0.1.0 .
# CI lints this file with hadolint (tests/deploy/test_dockerfile.py); it cannot build it (no base image can be pulled).

ARG PYTHON_VERSION=3.11

# ---- builder: compile wheels for kelvin and all its dependencies (compilers live only here)
FROM python:${PYTHON_VERSION}-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential=12.* \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduler_plugin/ scheduler_plugin/
COPY operator/ operator/
RUN pip wheel --wheel-dir /wheels .

# ---- runtime: slim Python, the wheels only, a non-root user, no compilers
FROM python:${PYTHON_VERSION}-slim AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kelvin" \
      org.opencontainers.image.description="GPU-aware scheduling for Kubernetes: scheduler extender, NVML exporter, operator, simulator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kelvin-sched/kelvin" \
      org.opencontainers.image.url="https://github.com/kelvin-sched/kelvin" \
      org.opencontainers.image.documentation="https://github.com/kelvin-sched/kelvin/blob/main/docs/install.md" \
      org.opencontainers.image.vendor="kelvin contributors"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# --no-index: only the wheels built above, nothing fetched at this stage; then the wheels are gone again
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels "kelvin==${VERSION}" \
 && groupadd --system --gid 10001 kelvin \
 && useradd --system --uid 10001 --gid kelvin --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kelvin \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/kelvin
# The chart mounts the policy file at /etc/kelvin/policy.yaml and runs with a read-only root filesystem (/tmp is an
# emptyDir); /var/lib/kelvin is the working directory for `docker run` use (simulator output, fleet files).
WORKDIR /var/lib/kelvin
USER 10001:10001
# extender verbs 8888 (on 127.0.0.1 unless --host says otherwise: the scheduler is its sidecar) and metrics/health
# 8889, exporter 9400, operator metrics 8080 / health 8081 / webhook 9443
EXPOSE 8888 8889 9400 8080 8081 9443
# Every component serves /healthz: extender :8889 (its metrics port), exporter :9400, operator :8081. Kubernetes uses
# its own probes (the chart sets them); for `docker run`, point HEALTHCHECK_URL at the component started (default: the
# extender).
ENV HEALTHCHECK_URL=http://127.0.0.1:8889/healthz
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['HEALTHCHECK_URL'], timeout=4)"]
ENTRYPOINT ["kelvin"]
CMD ["--help"]
