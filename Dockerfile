# One image for every tmi component: the owner CLI (`tmi`), the admission webhook
# (`tmi-webhook`), the scheduler extender (`tmi-extender`) and the allocation controller
# (`tmi-controller`). The chart's Deployments choose the component with `command`.
#
# Dependencies come from uv.lock, so the image holds exactly what the tests ran with; the lock
# file and a CycloneDX SBOM exported from it are in /opt/tmi/share/tmi. The test harness
# (localcluster) is not copied in. The base is pinned by digest; to move it, look the digest up
#   docker buildx imagetools inspect python:3.11-slim-bookworm
# and pass it with --build-arg PYTHON_BASE=python:3.11-slim-bookworm@sha256:<digest>.
# tests/unit/test_image.py holds this file to those rules.

ARG PYTHON_BASE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

FROM ${PYTHON_BASE} AS build
ARG UV_VERSION=0.13.9
RUN pip install --no-cache-dir "uv==${UV_VERSION}"
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
# The dependencies first, in their own layer, so a source change rebuilds only what follows.
RUN uv venv /opt/tmi \
    && VIRTUAL_ENV=/opt/tmi uv sync --frozen --no-dev --no-install-project --active
COPY inference_policy ./inference_policy
COPY policy_io ./policy_io
COPY serving ./serving
COPY webhook ./webhook
COPY extender ./extender
COPY allocation_controller ./allocation_controller
COPY tmi_cli ./tmi_cli
RUN uv build --wheel -o /wheels \
    && uv pip install --no-deps --python /opt/tmi/bin/python /wheels/tmi-*.whl \
    && mkdir -p /opt/tmi/share/tmi \
    && cp uv.lock /opt/tmi/share/tmi/uv.lock \
    && uv export --frozen --no-dev --format cyclonedx1.5 --preview-features sbom-export \
       --output-file /opt/tmi/share/tmi/sbom.cdx.json \
    && /opt/tmi/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('localcluster') is not None)"

FROM ${PYTHON_BASE}
LABEL org.opencontainers.image.title="tmi" \
      org.opencontainers.image.description="Tenant-mode inference admission for Kubernetes"
COPY --from=build /opt/tmi /opt/tmi
ENV PATH=/opt/tmi/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Matches the Deployments' runAsUser; the root filesystem can stay read-only.
USER 65532:65532
ENTRYPOINT []
CMD ["tmi", "--help"]
