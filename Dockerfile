# syntax=docker/dockerfile:1
# The ambient-operator image: the operator's wheel and its pinned runtime
# dependencies (requirements.lock) on a slim Python, running as a non-root user.
#
#   docker build -t <registry>/ambient-operator:0.1.0 .
#
# Multi-arch (amd64, arm64) with `docker buildx build --platform ...`: every
# dependency ships wheels for both, so no compiler is needed in either stage.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# -- build: wheels for the operator and every pinned dependency -----------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY requirements.lock ./
RUN pip wheel --wheel-dir /wheels --requirement requirements.lock
# operator/ambient_operator/templates is a symlink to templates/: both are
# copied, and the wheel stores the files it points to.
COPY pyproject.toml README.md ./
COPY templates/ templates/
COPY operator/ operator/
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -c "import glob, sys, zipfile; \
names = zipfile.ZipFile(glob.glob('/wheels/ambient_operator-*.whl')[0]).namelist(); \
sys.exit(0 if any(n.startswith('ambient_operator/templates/') and n.endswith('.j2') for n in names) else 'templates missing from the wheel')"

# -- runtime ------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# Only what was built and pinned, from the build stage's wheels (bind-mounted,
# so they leave no layer behind); no index is consulted. pip and setuptools
# go afterwards: nothing installs packages at run time.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,source=requirements.lock,target=/tmp/requirements.lock \
    pip install --no-index --find-links /wheels --requirement /tmp/requirements.lock \
 && pip install --no-index --no-deps --find-links /wheels ambient-operator \
 && pip uninstall --yes pip setuptools wheel \
 && groupadd --system --gid 65532 operator \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin operator
# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 65532:65532
# webhook, metrics, health
EXPOSE 9443 9090 8080
ENTRYPOINT ["ambient-operator"]
CMD ["run"]
