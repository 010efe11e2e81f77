# One image for every tmi component: the owner CLI (`tmi`), the admission webhook
# (`tmi-webhook`), the scheduler extender (`tmi-extender`) and the allocation controller
# (`tmi-controller`). The Deployments in manifests/ choose the component with `command`.
#
# Dependencies come from uv.lock, so the image holds exactly what the tests ran with.

FROM python:3.11-slim-bookworm AS build
RUN pip install --no-cache-dir uv==0.13.9
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
RUN uv venv /opt/tmi && VIRTUAL_ENV=/opt/tmi uv sync --frozen --no-dev --no-install-project --active
COPY inference_policy ./inference_policy
COPY policy_io ./policy_io
COPY serving ./serving
COPY webhook ./webhook
COPY extender ./extender
COPY allocation_controller ./allocation_controller
COPY tmi_cli ./tmi_cli
COPY localcluster ./localcluster
RUN VIRTUAL_ENV=/opt/tmi uv pip install --no-deps --python /opt/tmi/bin/python .

FROM python:3.11-slim-bookworm
COPY --from=build /opt/tmi /opt/tmi
ENV PATH=/opt/tmi/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Matches the Deployments' runAsUser; the root filesystem can stay read-only.
USER 65532:65532
ENTRYPOINT []
CMD ["tmi", "--help"]
