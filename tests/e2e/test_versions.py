"""The version-range check (`make test-versions`, `localcluster.version_check`) on the pinned
release: the chart's every object passes a server-side dry run, and an object the API server
does not serve is a failure naming it, so a release that lacks a kind the chart renders fails."""

from __future__ import annotations

from typing import Any

import pytest

from localcluster import version_check
from localcluster.binaries import versions

pytestmark = pytest.mark.e2e


def test_the_pinned_release_passes_both_ways() -> None:
    rows = version_check.check(versions().kubernetes)
    assert [result for _, result in rows] == ["pass", "pass"]
    assert "with the admission policies" in rows[0][0] and "webhook fallback" in rows[1][0]


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
    for _, result in rows:
        assert result.startswith("fail: MutatingAdmissionPolicy from-the-future: ")
