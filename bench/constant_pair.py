"""The constant-answer webhook (`constant_webhook.py`) as a process of the benchmarks, with the
configuration that sends it a namespace's Pods, and the namespaces the Pod-create benchmarks
compare: `tmi`'s tenant namespace, one the constant webhook serves, and one no webhook serves.

`bench_pod_create.py` and `bench_peer.py` both measure a webhook that decides nothing beside
`tmi`'s; it is started, configured and asked for `tmi`'s own answers here, once, so both
measure the same floor.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from kits.profilekit import NAMESPACE, request
from kits.webhookkit import engine_pod, plain_pod, review
from localcluster import ControlPlane, Kube, wait_until
from localcluster.plane.controlplane import HOST
from localcluster.plane.metrics import metric, parse_metrics
from localcluster.plane.process import free_port
from localcluster.servers.webhook import (
    OPT_IN_LABEL,
    LocalWebhook,
    is_planned,
    webhook_configuration,
)

ROOT = Path(__file__).resolve().parent.parent

CONSTANT_NAMESPACE = "bench-constant-webhook"
NONE_NAMESPACE = "bench-no-webhook"
NAMESPACES = {
    "without_webhook": NONE_NAMESPACE,
    "constant_webhook": CONSTANT_NAMESPACE,
    "with_webhook": NAMESPACE,
}
# The constant webhook's configuration selects namespaces whose opt-in label has this value.
CONSTANT_OPT_IN = "bench-constant-answer"
CONSTANT_CONFIGURATION = "bench-constant-answer"


def engine(name: str) -> dict[str, Any]:
    return engine_pod(request(), name=name)


def tenant(name: str) -> dict[str, Any]:
    pod = plain_pod()
    pod["metadata"]["name"] = name
    return pod


def in_namespace(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    pod["metadata"]["namespace"] = namespace
    return pod


CONSTANT_WEBHOOKS = "constant-answer.bench.local"


def constant_configuration(url: str, ca_bundle: str) -> dict[str, Any]:
    """The chart's fallback configuration (its guard entry shields and refuses where there are
    no admission policies), renamed and selecting the constant webhook's namespace."""
    doc = webhook_configuration(url, ca_bundle, admission_policies=False)
    doc["metadata"]["name"] = CONSTANT_CONFIGURATION
    for webhook in doc["webhooks"]:
        webhook["name"] = webhook["name"].replace("tenant-inference.kamiwaza.ai", CONSTANT_WEBHOOKS)
        selected = [
            expression
            for expression in webhook["namespaceSelector"]["matchExpressions"]
            if expression["key"] == OPT_IN_LABEL
        ]
        if not selected:
            # Otherwise the copy would select the tenant's namespaces too.
            raise SystemExit(f"webhook {webhook['name']} does not select on {OPT_IN_LABEL}")
        for expression in selected:
            expression["values"] = [CONSTANT_OPT_IN]
        # The chart's entry names its tenant namespace; the copy selects by its label alone.
        webhook["namespaceSelector"]["matchExpressions"] = [
            e
            for e in webhook["namespaceSelector"]["matchExpressions"]
            if e["key"] != "kubernetes.io/metadata.name"
        ]
    return doc


class ConstantWebhook:
    """`bench/constant_webhook.py` as a process, answering with `tmi`'s prepared answers. With
    `scheduler_name` the engine answer names that scheduler instead of `tmi`'s (the same patch,
    one value changed), so its Pods wait in a queue of their own and never in `tmi`'s."""

    def __init__(
        self, plane: ControlPlane, hook: LocalWebhook, scheduler_name: str | None = None
    ) -> None:
        self.plane = plane
        answers = {
            "engine": tmi_answer(hook, engine("x")),
            "tenant": tmi_answer(hook, tenant("x")),
        }
        if scheduler_name is not None:
            answers["engine"] = with_scheduler_name(answers["engine"], scheduler_name)
        directory = plane.workdir / "constant-webhook"
        directory.mkdir(exist_ok=True)
        answers_file = directory / "answers.json"
        answers_file.write_text(json.dumps(answers))
        pair = plane.issue_serving_cert("constant-webhook")
        self.port = free_port()
        self.url = f"https://{HOST}:{self.port}"
        self.log = (directory / "constant-webhook.log").open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "constant_webhook.py"),
                f"--cert={pair.cert_file}",
                f"--key={pair.key_file}",
                f"--port={self.port}",
                f"--answers={answers_file}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        context = ssl.create_default_context(cafile=plane.ca_file)
        wait_until(
            lambda: get_ok(f"{self.url}/readyz", context), timeout=30, what="constant webhook"
        )

    def reviews(self) -> int:
        text = metrics_text(self.url, self.plane.ca_file)
        return int(metric(parse_metrics(text), "constant_webhook_reviews_total"))

    def install(self) -> None:
        kube = self.plane.kube("admin")
        kube.apply(constant_configuration(f"{self.url}/mutate", self.plane.ca_bundle))
        wait_until(
            lambda: probe_planned(kube, NAMESPACES["constant_webhook"]),
            timeout=60,
            what="the constant webhook's configuration to take effect",
        )

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()


def with_scheduler_name(answer: dict[str, Any], name: str) -> dict[str, Any]:
    """An admission answer whose JSON Patch sets `spec.schedulerName` to `name`."""
    ops = json.loads(base64.b64decode(answer["patch"]))
    found = False
    for op in ops:
        if op.get("path") == "/spec/schedulerName":
            op["value"] = name
            found = True
        elif op.get("path") == "/spec" and isinstance(op.get("value"), dict):
            op["value"]["schedulerName"] = name
            found = True
    if not found:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": name})
    return {**answer, "patch": base64.b64encode(json.dumps(ops).encode()).decode("ascii")}


def probe_planned(kube: Kube, namespace: str) -> bool:
    """Whether a dry-run engine Pod in the namespace comes back planned."""
    probe = in_namespace(engine(f"probe-{uuid.uuid4().hex[:8]}"), namespace)
    return is_planned(kube.create(probe, dry_run=True))


def metrics_text(url: str, ca_file: str | Path) -> str:
    context = ssl.create_default_context(cafile=str(ca_file))
    with urllib.request.urlopen(f"{url}/metrics", timeout=5, context=context) as resp:
        return str(resp.read().decode())


def get_ok(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def tmi_answer(hook: LocalWebhook, pod: dict[str, Any]) -> dict[str, Any]:
    """`tmi`'s response object for this Pod, asked of the running webhook itself."""
    pod = {**pod, "metadata": {**pod["metadata"], "namespace": NAMESPACE}}
    body = json.dumps(review(pod)).encode()
    context = ssl.create_default_context(cafile=hook.plane.ca_file)
    request_ = urllib.request.Request(
        f"{hook.url}/mutate", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request_, timeout=10, context=context) as resp:
        response: dict[str, Any] = json.loads(resp.read())["response"]
    response.pop("uid")
    if not response.get("allowed"):
        raise SystemExit(f"tmi refused the benchmark Pod: {response}")
    return response


def create_namespaces(plane: ControlPlane) -> None:
    """The other two namespaces, labelled as the tenant's but for the opt-in."""
    kube = plane.kube("admin")
    labels = dict(kube.get("v1", "Namespace", NAMESPACE)["metadata"].get("labels") or {})
    labels.pop("kubernetes.io/metadata.name", None)
    labels.pop(OPT_IN_LABEL, None)
    plane.create_namespace(NAMESPACES["without_webhook"], labels)
    plane.create_namespace(
        NAMESPACES["constant_webhook"], {**labels, OPT_IN_LABEL: CONSTANT_OPT_IN}
    )
    if probe_planned(kube, NAMESPACES["without_webhook"]):
        raise SystemExit("a Pod in the namespace without a webhook was planned")
