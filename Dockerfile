# milliserve in a container.
#   docker build -t milliserve .                                  # the server (onnxruntime)
#   docker build -t milliserve --build-arg EXTRAS=openvino .      # + OpenVINO models
#   docker run --stop-timeout 30 -p 8000:8000 -p 8001:8001 -p 8002:8002 \
#       -v $PWD/build/model_repository:/models:ro milliserve
# (--stop-timeout 30: Docker's default 10 s would kill the server before its 20 s drain)
# The model repository is mounted at /models (or baked: FROM milliserve, then COPY repo /models).
# A slim base, a non-root user (10001), probes on the OIP health endpoints, and SIGTERM
# drained within 20 s (MILLISERVE_SHUTDOWN_GRACE_S), inside a pod's default 30 s grace.
# tests/e2e/test_deploy.py runs this file's command, environment and health check as the
# container would (no Docker engine there); docs/deploy.md.
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# tini as PID 1: signals reach the server, zombies are reaped
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/milliserve
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".${EXTRAS:+[$EXTRAS]}" \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin milliserve \
    && mkdir /models && chown 10001:10001 /models

USER 10001
ENV HOME=/tmp \
    MILLISERVE_MODEL_REPOSITORY=/models \
    MILLISERVE_HOST=0.0.0.0 \
    MILLISERVE_WORKERS=1 \
    MILLISERVE_SHUTDOWN_GRACE_S=20 \
    MILLISERVE_LOG_LEVEL=INFO
EXPOSE 8000 8001 8002

HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('MILLISERVE_HTTP__PORT', '8000'); sys.exit(urllib.request.urlopen(f'http://127.0.0.1:{port}/v2/health/ready', timeout=2).status != 200)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "--"]
CMD ["milliserve", "serve"]
