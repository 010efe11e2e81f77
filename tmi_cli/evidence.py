"""`tmi evidence`: on a GPU host, which Pod holds which physical GPU, who overlaps, and whether
each granted share is honoured.

This is the I/O half of the evidence: it samples the GPUs' processes (`tmi_cli.gpu_processes`),
finds each process's Pod from its cgroup (`tmi_cli.cgroups`), reads the Pods with their plans
(a `kubectl get pods -o json` file, or the API for this node), classifies finished
memory-pressure Pods, and hands everything to `inference_policy.evidence.judge`. Optionally it
posts the report to the allocation controller, which exports it as metrics.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from inference_policy.evidence import (
    EvidenceError,
    Observation,
    Sample,
    classify_job_pod,
    judge,
)
from inference_policy.tools.detection import DetectionError
from tmi_cli.cgroups import read_owners
from tmi_cli.gpu_processes import GpuReader
from tmi_cli.kubeconfig import kubeconfig_for

__all__ = [
    "EvidenceRequest",
    "collect",
    "gather",
    "load_pods",
    "pods_from_api",
    "post_report",
    "status_of",
]

MAX_SAMPLES = 3600
POST_TIMEOUT_S = 10.0


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def collect(
    reader: GpuReader,
    samples: int = 1,
    interval: float = 0.0,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], str] = _now_text,
    taken_one: Callable[[], None] | None = None,
) -> Observation:
    """Sample the GPUs' processes `samples` times, `interval` seconds apart; `taken_one` is
    called after each sample (the command's progress)."""
    taken: list[Sample] = []
    for index in range(samples):
        if index:
            sleep(interval)
        taken.append(reader.sample(index, clock()))
        if taken_one is not None:
            taken_one()
    return Observation(
        source=reader.source,
        driver=reader.driver,
        devices=reader.devices(),
        samples=tuple(taken),
    )


def load_pods(document: Any) -> list[dict[str, Any]]:
    """Pods from `kubectl get pods -o json` (a List), a PodList, or one Pod object."""
    if isinstance(document, Mapping) and isinstance(document.get("items"), list):
        return [item for item in document["items"] if isinstance(item, dict)]
    if isinstance(document, dict) and document.get("kind") == "Pod":
        return [document]
    raise EvidenceError("the Pods file must be `kubectl get pods -o json` output or a Pod")


def pods_from_api(node: str, kubeconfig: str | None = None) -> list[dict[str, Any]]:
    """The Pods bound to `node`, every namespace, read through the API server (the kubeconfig
    when given, else the in-cluster service account)."""
    import kubernetes.client  # noqa: PLC0415 - only this path needs the client

    from serving.kube import ClientConfigError, load_configuration  # noqa: PLC0415

    try:
        configuration = load_configuration(kubeconfig_for(kubeconfig))
    except ClientConfigError as exc:
        raise DetectionError(str(exc)) from None
    # The official client is only partly typed; it is used through one untyped handle.
    kube: Any = kubernetes.client
    api = kube.CoreV1Api(kube.ApiClient(configuration))
    try:
        response = api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
    except (kube.ApiException, OSError) as exc:
        raise DetectionError(f"cannot list the Pods on node {node}: {exc}") from None
    return load_pods(json.loads(response.data))


@dataclass(frozen=True)
class EvidenceRequest:
    node: str | None
    pods: Sequence[Mapping[str, Any]]
    samples: int = 1
    interval: float = 0.0
    proc: str = "/proc"
    jobs: Sequence[tuple[Mapping[str, Any], str | None]] = ()
    read_gpus: bool = True


def gather(
    request: EvidenceRequest,
    open_reader: Callable[[], GpuReader],
    *,
    read: Callable[[str], str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], str] = _now_text,
    taken_one: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One evidence report: sample, attribute, judge. Raises DetectionError when the GPUs
    cannot be read. `taken_one` is called after each sample."""
    outcomes = [classify_job_pod(pod, log) for pod, log in request.jobs]
    if request.read_gpus:
        reader = open_reader()
        try:
            observation = collect(
                reader,
                request.samples,
                request.interval,
                sleep=sleep,
                clock=clock,
                taken_one=taken_one,
            )
        finally:
            reader.close()
    else:
        observation = Observation(source="none", driver=None, devices=(), samples=())
    pids = {proc.pid for sample in observation.samples for proc in sample.processes}
    owners = read_owners(pids, read=read, proc=request.proc)
    return judge(observation, owners, request.pods, node=request.node, job_outcomes=outcomes)


def status_of(report: Mapping[str, Any]) -> str:
    verdict = report.get("verdict")
    return str(verdict.get("status")) if isinstance(verdict, Mapping) else "inconclusive"


def post_report(url: str, token: str, report: Mapping[str, Any]) -> None:
    """PUT the report to the collector; raises DetectionError when it is not taken."""
    body = json.dumps(report, separators=(",", ":")).encode()
    request = urllib.request.Request(  # noqa: S310 - the owner names the collector's URL
        url,
        data=body,
        method="PUT",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as answer:  # noqa: S310
            if answer.status >= 300:
                raise DetectionError(f"the collector at {url} answered {answer.status}")
    except OSError as err:
        raise DetectionError(f"cannot post the report to {url}: {err}") from err
