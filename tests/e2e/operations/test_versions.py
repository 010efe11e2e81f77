"""The version-range check (`make test-versions`, `localcluster.install.version_check`) on the
pinned release: the chart's every object passes a server-side dry run and the stack does what the
chart promises, both ways; an object the API server does not serve is a failure naming it, so a
release that lacks a kind the chart renders fails; and a release where the shield, the guard or
the scheduler's calls to the extender do not happen fails the probe that needs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localcluster import ControlPlane
from localcluster.install import version_behaviour, version_check
from localcluster.install.stack import TenantStack, deploy_stack
from localcluster.plane.binaries import bin_dir, versions
from localcluster.servers.admission_policies import policy_docs, remove_policies

pytestmark = pytest.mark.e2e


def test_the_pinned_release_passes_both_ways() -> None:
    rows = version_check.check(versions().kubernetes)
    assert [result for _, result in rows] == ["pass"] * 4, rows
    whats = [what for what, _ in rows]
    assert "dry run" in whats[0] and "with the admission policies" in whats[0]
    assert whats[1].startswith("the stack with the admission policies: shield, guard, webhook")
    assert f"kube-scheduler {versions().kubernetes}" in whats[1]
    assert "dry run" in whats[2] and "webhook fallback" in whats[2]
    assert whats[3].startswith("the stack webhook fallback")


def test_a_kind_the_release_does_not_serve_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = version_check._docs

    def with_an_unserved_kind(policies: bool) -> list[dict[str, Any]]:
        unserved = {
            "apiVersion": "admissionregistration.k8s.io/v9",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": "from-the-future"},
        }
        return [*rendered(policies), unserved]

    monkeypatch.setattr(version_check, "_docs", with_an_unserved_kind)
    rows = version_check.check(versions().kubernetes)
    # No way passes its dry run, so no stack is brought up.
    assert len(rows) == 2
    for _, result in rows:
        assert result.startswith("fail: MutatingAdmissionPolicy from-the-future: ")


def test_a_release_that_neither_enforces_the_policies_nor_schedules_fails_those_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a release that took the policies but enforces neither, and whose scheduler never
    calls the extender: the stack comes up, then its policies are deleted and its scheduler
    stopped. The webhook still plans, so only that probe passes."""

    def without_policies_or_scheduler(*args: Any, **kwargs: Any) -> TenantStack:
        stack = deploy_stack(*args, **kwargs)
        assert stack.owner is not None
        remove_policies(stack.plane, policy_docs(stack.owner), stack.settings.namespace)
        stack.stop_scheduler()
        return stack

    monkeypatch.setattr(
        "localcluster.install.version_behaviour.deploy_stack", without_policies_or_scheduler
    )
    monkeypatch.setattr(version_behaviour, "WAIT", 5.0)
    plane = ControlPlane.start(
        tmp_path / "plane", bin_dir(), start_scheduler=False, start_controller_manager=False
    )
    with plane:
        found = version_behaviour.behaviour(plane, policies=True)
    assert found["webhook"] is None
    assert found["shield"] is not None and "unshielded" in found["shield"]
    assert found["guard"] is not None and "admitted" in found["guard"]
    assert found["extender"] is not None and "not placed" in found["extender"]
    assert version_behaviour.summary(found).startswith("fail: shield: ")
