# syntax=docker/dockerfile:1
# One image for the operator (`specdecode operator`), the load Job (`specdecode loadgen`) and the
# simulator arms (`specdecode sim`): the chart passes its own image to the operator, which uses it
# for the load Job and simulator arms.
#
#   docker build -t ghcr.io/specdecode/specdecode-operator:0.1.0 .
#
# Two stages: the builder turns the project and all its dependencies into wheels; the runtime stage
# installs only those wheels (no compiler, no pip cache, no source tree) and runs as uid 10001.
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps the rest out of the context).
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheels are bind-mounted from the builder, so they never become a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels /wheels/specdecode_operator-*.whl \
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
