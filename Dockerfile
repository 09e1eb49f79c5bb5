# syntax=docker/dockerfile:1.10.0
# The frontend is pinned to an exact release (not the moving `1` tag), as the base image and the
# build backend (pyproject.toml) are: the same Dockerfile parses the same way on every build.
# One image for the operator (`specdecode operator`), the load Job (`specdecode loadgen`) and the
# simulator arms (`specdecode sim`): the chart passes its own image to the operator, which uses it
# for the load Job and simulator arms.
#
#   docker build -t ghcr.io/specdecode/specdecode-operator:0.1.0 .
#
# Two stages: the builder turns the project and all its dependencies into wheels; the runtime stage
# installs only those wheels (no compiler, no pip cache, no source tree) and runs as uid 10001.
#
# Pinned: the base image by digest, every dependency by version and hash (requirements.lock, from
# `make lock`; pip's hash-checking mode refuses anything else). The digest is python:3.12-slim's
# multi-arch index as pinned publicly elsewhere; it was NOT verified here (no registry access from
# the machine this was written on). Re-resolve it when bumping:
#   docker buildx imagetools inspect python:3.12-slim --format '{{json .Manifest.Digest}}'
ARG PYTHON_IMAGE=python:3.12-slim@sha256:78387bc3881b8273120a12ebe6c1ab22b018ccc2c9adf565ae1ac9b536e184ea

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheels are built from (.dockerignore keeps the rest out of the context).
COPY requirements.lock pyproject.toml README.md ./
COPY operator/ operator/
# The dependencies exactly as locked (hash-checked), then the project alone.
RUN pip wheel --require-hashes --wheel-dir /wheels -r requirements.lock \
    && pip wheel --no-deps --wheel-dir /wheels . \
    && cp requirements.lock /wheels/

FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheels are bind-mounted from the builder, so they never become a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels --require-hashes -r /wheels/requirements.lock \
    && pip install --no-index --no-deps /wheels/specdecode_operator-*.whl \
    && pip check \
    && groupadd --system --gid 10001 specdecode \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/specdecode --create-home \
       --shell /usr/sbin/nologin specdecode
# Numeric, so that the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 10001:10001
WORKDIR /home/specdecode
# The operator's liveness endpoint and its Prometheus metrics (see the chart); the simulator and
# the load generator choose their own ports.
EXPOSE 8080 9090
ENTRYPOINT ["specdecode"]
CMD ["operator", "--standalone"]
