"""`tmi doctor`'s judgments (`inference_policy.tools.doctor`), from the documents the command
reads."""

from __future__ import annotations

from typing import Any

from inference_policy.tools.doctor import (
    EXEC_GUARD,
    POD_GUARD,
    gpu_node_checks,
    guard_checks,
    installer_check,
    namespace_checks,
    runtime_class_check,
    serves,
)
from kits.fleetkit import h100, no_gfd
from localcluster.nodes.kwok import FakeNode


def _statuses(checks: Any) -> dict[str, str]:
    return {c.name: c.status for c in checks}


def test_a_namespace_without_the_seeds_labels_fails_with_the_command_that_fixes_it() -> None:
    checks = namespace_checks("kamiwaza", {"metadata": {"labels": {}}})
    assert _statuses(checks) == {
        "namespace": "pass",
        "namespace-pod-security": "fail",
        "namespace-opt-in": "skip",
    }
    fix = checks[1].fix
    assert fix.startswith("kubectl label namespace kamiwaza ")
    assert "pod-security.kubernetes.io/audit=restricted" in fix


def test_the_opt_in_is_required_once_the_owner_part_serves_the_namespace() -> None:
    def opt_in(served: bool | None, labels: dict[str, str]) -> tuple[str, str]:
        (check,) = [
            c
            for c in namespace_checks("kamiwaza", {"metadata": {"labels": labels}}, served)
            if c.name == "namespace-opt-in"
        ]
        return check.status, check.found

    assert opt_in(True, {})[0] == "fail"
    assert opt_in(False, {}) == (
        "skip",
        "kamiwaza.ai/tenant-inference=(absent); no webhook configuration serves it yet",
    )
    assert opt_in(None, {})[0] == "skip"
    assert opt_in(True, {"kamiwaza.ai/tenant-inference": "enabled"})[0] == "pass"
    tenant_hook = {"webhooks": [{"clientConfig": {"service": {"namespace": "kamiwaza"}}}]}
    other = {"webhooks": [{"clientConfig": {"url": "https://elsewhere"}}]}
    assert serves([other, tenant_hook], "kamiwaza") is True
    assert serves([other], "kamiwaza") is False
    # The owner's webhook.url: no Service, the entry selects the namespace by name.
    by_url = {
        "webhooks": [
            {
                "clientConfig": {"url": "https://webhook.example/mutate"},
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "In",
                            "values": ["kamiwaza"],
                        }
                    ]
                },
            }
        ]
    }
    assert serves([by_url], "kamiwaza") is True
    assert serves([by_url], "elsewhere") is False
    assert serves(None, "kamiwaza") is None


def test_the_installer_must_be_namespace_scoped() -> None:
    answers = [
        ("create", "apps", "deployments", True, True),
        ("create", "rbac.authorization.k8s.io", "clusterroles", False, True),
        ("list", "", "nodes", False, False),
    ]
    check = installer_check("sa", answers)
    assert (check.status, check.found) == ("fail", "sa can create clusterroles")
    ok = installer_check("sa", [(v, g, r, e, e) for v, g, r, e, _ in answers])
    assert ok.status == "pass"


def test_the_guard_must_exist_and_deny() -> None:
    present = {f"p/{POD_GUARD}": True, f"b/{EXEC_GUARD}": False}
    checks = guard_checks(present, None, True)
    assert _statuses(checks) == {"pod-guard-present": "fail", "pod-guard-denies": "fail"}
    checks = guard_checks(dict.fromkeys(present, True), f"... '{POD_GUARD}' denied", False)
    assert _statuses(checks) == {"pod-guard-present": "pass", "pod-guard-denies": "pass"}


def test_the_runtime_class_needs_the_nvidia_handler() -> None:
    assert runtime_class_check(None).status == "fail"
    assert runtime_class_check({"handler": "runc"}).status == "fail"
    assert runtime_class_check({"handler": "nvidia"}).status == "pass"
    assert runtime_class_check(None, readable=False).status == "skip"


def test_gpu_nodes_need_allocatable_no_taint_and_gfd_labels() -> None:
    tainted = FakeNode("t", gpus=1, taints=[{"key": "k", "effect": "NoExecute"}])
    nodes = [h100("ok").manifest(), tainted.manifest(), no_gfd("bare").manifest()]
    checks = {c.name: c for c in gpu_node_checks(nodes)}
    assert checks["gpu-nodes-allocatable"].status == "pass"
    assert checks["gpu-nodes-untainted"].found == "tainted: t (k:NoExecute)"
    assert checks["gpu-nodes-gfd"].found.startswith("bare lacks nvidia.com/gpu.product")
    assert [c.status for c in gpu_node_checks(None)] == ["skip"] * 3
    (none,) = gpu_node_checks([FakeNode("cpu", gpus=0, vram_gb=None).manifest()])
    assert none.status == "fail"


def test_guard_objects_the_identity_may_not_read_are_skipped_not_missing() -> None:
    names = [f"{k}/{n}" for n in (POD_GUARD, EXEC_GUARD) for k in ("policies", "bindings")]
    refusal = f"denied by ValidatingAdmissionPolicy '{POD_GUARD}'"
    unread = guard_checks(dict.fromkeys(names), refusal, admitted=False)
    assert [(c.name, c.status) for c in unread] == [
        ("pod-guard-present", "skip"),
        ("pod-guard-denies", "pass"),
    ]
    one_absent = guard_checks({**dict.fromkeys(names), names[0]: False}, refusal, False)
    assert one_absent[0].status == "fail" and one_absent[0].found == f"missing {names[0]}"
