"""Apply the tenant pod guard (ValidatingAdmissionPolicies) and wait until it enforces.

The API server compiles policies and bindings asynchronously, so an apply that
returned is not yet a guard that denies. Tests and demos call ``apply_guard``, which
polls server-side dry runs of a probe pod and a probe exec until both are refused
with the guard's own message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inference_policy.tools.doctor import EXEC_GUARD, POD_GUARD, privileged_probe
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import JSON, ApiError, Kube
from localcluster.plane.process import wait_until

GUARDED_NAMESPACES = ("kamiwaza", "kamiwaza-extensions")


def guard_manifest_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "manifests" / "guard"


def privileged_probe_pod(
    namespace: str = "kamiwaza", name: str = "kamiwaza-pod-guard-probe"
) -> JSON:
    """The seed's probe: hostPID plus a privileged container (`tmi doctor`'s, from the core)."""
    return privileged_probe(namespace, name)


def exec_path(namespace: str, pod: str, container: str | None) -> tuple[str, list[tuple[str, str]]]:
    """Path and query of a pods/exec request, as ``kubectl exec`` would send it."""
    query = [("command", "true"), ("stdout", "true")]
    if container is not None:
        query.insert(0, ("container", container))
    return f"/api/v1/namespaces/{namespace}/pods/{pod}/exec", query


def dry_run_create(kube: Kube, obj: dict[str, Any]) -> ApiError | None:
    """Server-side dry-run create; the refusal, or None when admitted."""
    try:
        kube.create(obj, dry_run=True)
    except ApiError as exc:
        return exc
    return None


def post_exec(kube: Kube, namespace: str, pod: str, container: str | None) -> ApiError | None:
    """POST pods/NAME/exec without an upgrade; the refusal, or None if it succeeded."""
    path, query = exec_path(namespace, pod, container)
    try:
        kube.request("POST", path, query=query)
    except ApiError as exc:
        return exc
    return None


def apply_guard(plane: ControlPlane, namespace: str = "kamiwaza", timeout: float = 60.0) -> None:
    """Apply manifests/guard and wait until both policies deny in ``namespace``."""
    plane.create_namespace(namespace)
    plane.apply_manifest(guard_manifest_dir())
    kube = plane.kube("admin")
    probe = privileged_probe_pod(namespace)

    def pod_guard_denies() -> bool:
        err = dry_run_create(kube, probe)
        return err is not None and err.status == 403 and POD_GUARD in err.message

    def exec_guard_denies() -> bool:
        err = post_exec(kube, namespace, "kamiwaza-exec-guard-probe", "istio-init")
        return err is not None and err.status == 403 and EXEC_GUARD in err.message

    wait_until(pod_guard_denies, timeout=timeout, what=f"{POD_GUARD} to deny in {namespace}")
    wait_until(exec_guard_denies, timeout=timeout, what=f"{EXEC_GUARD} to deny in {namespace}")
