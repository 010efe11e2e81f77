"""`tmi doctor` on the real control plane: every check passes when its condition holds, and
fails, naming what it found and the fix, when it is made not to.

Run in-process as the owner (the plane's admin) with the installer `tmi-installer`, and as the
installer itself. The namespace is `kamiwaza` (the guard binds the kamiwaza namespaces only);
what the test changes there (labels, the RuntimeClass, a CRD, nodes) it puts back.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest

from kits.fleetkit import h100, no_gfd
from localcluster import ApiError, ControlPlane, create_fake_nodes, delete_fake_nodes
from localcluster.servers.guard import apply_guard
from localcluster.servers.webhook_objects import apply_runtime_class
from tmi_cli.main import main

pytestmark = pytest.mark.e2e

NS = "kamiwaza"
INSTALLER = "tmi-installer"
LABELS = {
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
    "kamiwaza.ai/tenant-inference": "enabled",
}
CERT_MANAGER_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "certificates.cert-manager.io"},
    "spec": {
        "group": "cert-manager.io",
        "names": {"kind": "Certificate", "plural": "certificates", "singular": "certificate"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    apply_guard(control_plane, NS)
    control_plane.grant_namespace_admin(INSTALLER, NS)
    admin = control_plane.kube("admin")
    before = admin.get("v1", "Namespace", NS)["metadata"].get("labels") or {}
    yield control_plane
    # Put the namespace's labels back as they were.
    patch = {k: before.get(k) for k in LABELS}
    admin.request(
        "PATCH",
        f"/api/v1/namespaces/{NS}",
        body={"metadata": {"labels": patch}},
        content_type="application/merge-patch+json",
    )


def _label(plane: ControlPlane, labels: Mapping[str, str | None]) -> None:
    plane.kube("admin").request(
        "PATCH",
        f"/api/v1/namespaces/{NS}",
        body={"metadata": {"labels": labels}},
        content_type="application/merge-patch+json",
    )


def doctor(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str], *extra: str, identity: str = "admin"
) -> tuple[int, dict[str, Any]]:
    argv = ["doctor", "--kubeconfig", str(plane.kubeconfig(identity)), "-o", "json"]
    if identity == "admin" and "--installer" not in extra:
        argv += ["--installer", INSTALLER]
    status = main([*argv, *extra])
    report = json.loads(capsys.readouterr().out)
    checks = {c["check"]: c for c in report["checks"]}
    assert report["ok"] is (status == 0) and report["ok"] is all(
        c["status"] != "fail" for c in checks.values()
    )
    return status, checks


@contextlib.contextmanager
def _serving_configuration(plane: ControlPlane) -> Iterator[None]:
    """A webhook configuration calling a Service in NS, for a kind nobody creates."""
    admin = plane.kube("admin")
    name = f"tmi-doctor-{uuid.uuid4().hex[:6]}"
    admin.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "doctor.tmi.invalid",
                    "clientConfig": {"service": {"namespace": NS, "name": "tmi-webhook"}},
                    "rules": [
                        {
                            "apiGroups": ["tmi-doctor.invalid"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["nothings"],
                        }
                    ],
                    "failurePolicy": "Ignore",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                }
            ],
        }
    )
    try:
        yield
    finally:
        admin.delete("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", name)


def test_the_namespace_checks(plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> None:
    _, checks = doctor(plane, capsys, "--namespace", f"absent-{uuid.uuid4().hex[:6]}")
    assert checks["namespace"]["status"] == "fail"
    assert checks["namespace"]["fix"].startswith("kubectl create namespace absent-")
    _label(plane, {k: None for k in LABELS})
    _, checks = doctor(plane, capsys, "--namespace", NS)
    assert checks["namespace"]["status"] == "pass"
    assert checks["namespace-pod-security"]["status"] == "fail"
    assert "pod-security.kubernetes.io/warn=restricted" in checks["namespace-pod-security"]["fix"]
    # Not opted in before the owner part serves the namespace is no failure of a preflight...
    assert checks["namespace-opt-in"]["status"] == "skip"
    assert checks["namespace-opt-in"]["found"].endswith("no webhook configuration serves it yet")
    # ... but once a webhook configuration calls a Service there, it is.
    with _serving_configuration(plane):
        _, checks = doctor(plane, capsys, "--namespace", NS)
    assert checks["namespace-opt-in"]["status"] == "fail"
    assert checks["namespace-opt-in"]["fix"].startswith("once both chart parts are installed")
    _label(plane, LABELS)
    _, checks = doctor(plane, capsys, "--namespace", NS)
    assert checks["namespace-pod-security"]["status"] == "pass"
    assert checks["namespace-opt-in"]["status"] == "pass"


def test_the_installer_and_guard_checks(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    _, checks = doctor(plane, capsys)
    assert checks["installer-namespace-scoped"]["status"] == "pass"
    assert checks["pod-guard-present"]["status"] == "pass"
    assert checks["pod-guard-denies"]["status"] == "pass"
    # Someone with no rights here is not the installer.
    _, checks = doctor(plane, capsys, "--installer", f"nobody-{uuid.uuid4().hex[:4]}")
    assert checks["installer-namespace-scoped"]["status"] == "fail"
    assert "cannot create deployments" in checks["installer-namespace-scoped"]["found"]
    # The guard binds the kamiwaza namespaces: elsewhere the privileged probe is admitted.
    other = f"tmi-doc-{uuid.uuid4().hex[:6]}"
    plane.create_namespace(other)
    plane.grant_namespace_admin(INSTALLER, other)
    _, checks = doctor(plane, capsys, "--namespace", other)
    assert checks["pod-guard-denies"]["status"] == "fail"
    assert checks["pod-guard-denies"]["found"] == "a privileged Pod was admitted"
    # A guard object missing is named, and the guard put back.
    admin = plane.kube("admin")
    binding = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
    admin.request("DELETE", f"{binding}/kamiwaza-tenant-exec-guard")
    try:
        _, checks = doctor(plane, capsys)
        assert checks["pod-guard-present"]["status"] == "fail"
        assert (
            "validatingadmissionpolicybindings/kamiwaza-tenant-exec-guard"
            in (checks["pod-guard-present"]["found"])
        )
    finally:
        apply_guard(plane, NS)


def test_the_cert_manager_and_runtime_class_checks(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = plane.kube("admin")
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/certificates.cert-manager.io"
    rc = "/apis/node.k8s.io/v1/runtimeclasses/nvidia"
    with contextlib.suppress(ApiError):
        admin.request("DELETE", crd)
    with contextlib.suppress(ApiError):
        admin.request("DELETE", rc)
    _, checks = doctor(plane, capsys)
    assert checks["cert-manager"]["status"] == "fail"
    assert checks["runtimeclass-nvidia"]["status"] == "fail"
    _, checks = doctor(plane, capsys, "--no-cert-manager")
    assert "cert-manager" not in checks
    admin.apply(CERT_MANAGER_CRD)
    apply_runtime_class(plane, "nvidia")
    try:
        _, checks = doctor(plane, capsys)
        assert checks["cert-manager"]["status"] == "pass"
        assert checks["runtimeclass-nvidia"]["status"] == "pass"
    finally:
        with contextlib.suppress(ApiError):
            admin.request("DELETE", crd)


def test_the_gpu_node_checks(plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> None:
    admin = plane.kube("admin")
    suffix = uuid.uuid4().hex[:4]
    good = h100(f"doc-good-{suffix}", gpus=2)
    empty = replace(h100(f"doc-empty-{suffix}", gpus=1), extra_resources={"nvidia.com/gpu": "0"})
    tainted = replace(
        h100(f"doc-taint-{suffix}", gpus=1),
        taints=[{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}],
    )
    bare = no_gfd(f"doc-nogfd-{suffix}", gpus=2)
    names = [n.name for n in (good, empty, tainted, bare)]
    create_fake_nodes(admin, [good, empty, tainted, bare])
    try:
        _, checks = doctor(plane, capsys)
        assert checks["gpu-nodes-allocatable"]["status"] == "fail"
        assert empty.name in checks["gpu-nodes-allocatable"]["found"]
        assert checks["gpu-nodes-untainted"]["status"] == "fail"
        assert f"{tainted.name} (gpu:NoSchedule)" in checks["gpu-nodes-untainted"]["found"]
        assert checks["gpu-nodes-gfd"]["status"] == "fail"
        assert f"{bare.name} lacks nvidia.com/gpu.product" in checks["gpu-nodes-gfd"]["found"]
        assert good.name not in json.dumps(
            {k: v for k, v in checks.items() if v["status"] == "fail"}
        )
        delete_fake_nodes(admin, names[1:])
        _, checks = doctor(plane, capsys)
        for name in ("gpu-nodes-allocatable", "gpu-nodes-untainted", "gpu-nodes-gfd"):
            assert not any(n in checks[name]["found"] for n in names[1:]), checks[name]
        assert f"{good.name}=2" in checks["gpu-nodes-allocatable"]["found"]
    finally:
        delete_fake_nodes(admin, names)


def test_as_the_installer_it_checks_its_own_rights_and_skips_the_owners_reads(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    _, checks = doctor(plane, capsys, "--as-installer", identity=INSTALLER)
    assert checks["installer-namespace-scoped"]["status"] == "pass"
    assert checks["pod-guard-denies"]["status"] == "pass"
    # The installer may not read the guard's cluster-scoped objects: not read is not missing.
    assert checks["pod-guard-present"]["status"] == "skip", checks["pod-guard-present"]
    assert checks["namespace-opt-in"]["status"] in ("pass", "skip")
    for name in ("gpu-nodes-allocatable", "gpu-nodes-untainted", "gpu-nodes-gfd"):
        assert checks[name]["status"] == "skip", checks[name]
    assert checks["runtimeclass-nvidia"]["status"] == "skip"
    assert checks["cert-manager"]["status"] == "skip"


def test_the_table_says_whether_the_install_can_proceed(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        ["doctor", "--kubeconfig", str(plane.kubeconfig("admin")), "--installer", INSTALLER]
    )
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("PASS  pod-guard-denies: ") for line in lines)
    assert lines[-1].endswith(
        "the install can proceed" if status == 0 else "fix the failures first"
    )
    report: Any = None
    assert report is None


def test_draft_reads_the_gpu_nodes_as_the_owner_and_not_as_the_installer(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tmi draft --from-api`: the owner drafts from the Nodes' GFD labels; the installer, who
    may not list Nodes, is told so."""
    admin = plane.kube("admin")
    node = h100(f"draft-{uuid.uuid4().hex[:4]}", gpus=2)
    create_fake_nodes(admin, [node])
    argv = ["draft", "--from-api", "--cluster-binding-id", "c1", "--namespace", NS]
    argv += ["--key-id", "sha256:" + "0" * 64]
    try:
        assert main([*argv, "--kubeconfig", str(plane.kubeconfig("admin"))]) == 0
        captured = capsys.readouterr()
        envelope = json.loads(captured.out)
        ids = [b["id"] for p in envelope["profiles"] for b in p["bindings"]]
        assert "nvidia-h100-80gb-hbm3-amd64" in ids
        assert node.name in captured.err
        assert main([*argv, "--kubeconfig", str(plane.kubeconfig(INSTALLER))]) == 1
        assert "error: cannot list Nodes: HTTP 403" in capsys.readouterr().err
    finally:
        delete_fake_nodes(admin, [node.name])
