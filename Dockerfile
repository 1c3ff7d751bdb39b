# The fedsched image: one image for the hub's SuperLink, SuperExec, registration Job and helm
# test, and for a member's extender (`fedsched serve`), Flower SuperNode and stunnel sidecar
# (charts/fedsched-hub, charts/fedsched-agent).
#
#   docker build -t REGISTRY/fedsched:0.1.0 .   &&   docker push REGISTRY/fedsched:0.1.0
#
# It is not built by this repository's tests or CI: those machines have no container engine.
# The Python install steps are exactly scripts/setup.sh's (a virtualenv, pip, torch==2.13.0
# first, then the project), without the dev extra; tests/charts checks that they stay so.
# PyPI's default torch 2.13.0 build carries the CUDA libraries (several GB of image).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

# stunnel for the member's mutual-TLS sidecar (coordinator/mtls.py renders its config).
RUN apt-get update \
    && apt-get install -y --no-install-recommends stunnel4 \
    && rm -rf /var/lib/apt/lists/*

# A numeric, non-root user: the charts run every container as 10001:10001.
RUN groupadd --system --gid 10001 fedsched \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/fedsched --create-home fedsched

WORKDIR /opt/fedsched
COPY pyproject.toml README.md ./
COPY common common
COPY agent agent
COPY coordinator coordinator
COPY cli cli
COPY experiment experiment

# scripts/setup.sh, step by step.
RUN python -m venv /opt/fedsched/.venv
ENV PATH=/opt/fedsched/.venv/bin:$PATH
RUN python -m pip install --upgrade pip
# torch must be pinned before anything that depends on it: a bare "torch" pulls another build.
RUN python -m pip install "torch==2.13.0"
RUN python -m pip install -e "."

USER 10001:10001
WORKDIR /home/fedsched
CMD ["fedsched", "--help"]
