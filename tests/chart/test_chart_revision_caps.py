"""The caps on what tenant data may cost (`policy_io.caps`) as chart values: unset, no server is
given them and each keeps its own defaults; set, the webhook, the extender and every tenant's
allocation controller read the same two; the schema refuses a size no server would take.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from chart_tools import generate as chartgen
from chart_tools.render import OWNER, TENANT, ChartError, find, part_values, render
from localcluster.plane.kube import JSON

CAPS = {"TMI_MAX_PROFILE_REVISIONS": "8", "TMI_MAX_PROFILE_REVISION_BYTES": "65536"}


def _values(**caps: int) -> dict[str, Any]:
    values = copy.deepcopy(chartgen.base_values())
    values["core"]["inferenceResources"].update(caps)
    return values


def _settings(values: dict[str, Any]) -> list[dict[str, str]]:
    """The settings every server that follows revisions reads: the tenant webhook's (its keys
    under the envFrom prefix TMI_), the extender's and each allocation controller's."""
    tenant = render(part_values(TENANT, values), namespace=chartgen.TENANT_NAMESPACE)
    owner = render(part_values(OWNER, values), namespace=chartgen.OWNER_NAMESPACE)
    webhook = {f"TMI_{k}": v for k, v in find(tenant, "ConfigMap", "tmi-settings")["data"].items()}
    controllers: list[JSON] = [
        d
        for d in owner
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tmi-controller-settings")
    ]
    assert controllers
    return [
        webhook,
        find(owner, "ConfigMap", "tmi-extender-settings")["data"],
        *(d["data"] for d in controllers),
    ]


def test_unset_no_server_is_given_a_cap() -> None:
    for settings in _settings(_values()):
        assert not set(CAPS) & set(settings)


def test_set_every_server_that_follows_revisions_reads_the_same_caps() -> None:
    for settings in _settings(_values(maxProfileRevisions=8, maxProfileRevisionBytes=65536)):
        assert {k: settings.get(k) for k in CAPS} == CAPS


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"maxProfileRevisionBytes": 100}, "maxProfileRevisionBytes"),
        ({"maxProfileRevisionBytes": 2 * 1024 * 1024}, "maxProfileRevisionBytes"),
        ({"maxProfileRevisions": -1}, "maxProfileRevisions"),
    ],
)
def test_the_schema_refuses_caps_no_server_takes(change: dict[str, int], complaint: str) -> None:
    with pytest.raises(ChartError, match=complaint):
        render(part_values(TENANT, _values(**change)), namespace=chartgen.TENANT_NAMESPACE)
