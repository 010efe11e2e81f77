"""The owner's quota per tenant as chart values: rendered as one ResourceQuota in each tenant
namespace that has one (a further tenant's own, never the first's), which the core reads back
as the values said; the owner's extender and the tenant's webhook may read it; the schema refuses
what no quota means."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from chart_tools import generate as chartgen
from chart_tools.render import OWNER, TENANT, ChartError, find, part_values, render
from inference_policy.placing.quota import QUOTA_NAME, Quota, parse_quota
from localcluster.plane.kube import JSON

FIRST, SECOND, THIRD = chartgen.TENANT_NAMESPACE, "team-b", "team-c"
KEY = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc="
QUOTA = {
    "devices": {"nvidia.com/gpu": 4, "nvidia.com/mig-3g.40gb": 2},
    "bindings": {"whole-h100-amd64": 2},
    "accountedVramGB": 96,
    "enginePods": 8,
}


def _owner(values: dict[str, Any]) -> list[JSON]:
    docs: list[JSON] = render(part_values(OWNER, values), namespace=chartgen.OWNER_NAMESPACE)
    return docs


def _values(**owner: Any) -> dict[str, Any]:
    values = copy.deepcopy(chartgen.base_values())
    values["owner"].update(owner)
    return values


def test_each_tenant_gets_its_own_quota_and_none_inherits_the_firsts() -> None:
    docs = _owner(
        _values(
            quota=QUOTA,
            tenants=[
                {"namespace": SECOND, "ownerPublicKey": KEY},
                {"namespace": THIRD, "ownerPublicKey": KEY, "quota": {"enginePods": 0}},
            ],
        )
    )
    quotas = {
        d["metadata"]["namespace"]: d
        for d in docs
        if d["kind"] == "ResourceQuota" and d["metadata"]["name"] == QUOTA_NAME
    }
    assert set(quotas) == {FIRST, THIRD}
    first = quotas[FIRST]
    # Kubernetes' own quota counts the devices per resource; the owner's parts read the rest.
    assert first["spec"] == {
        "hard": {"requests.nvidia.com/gpu": "4", "requests.nvidia.com/mig-3g.40gb": "2"}
    }
    assert first["metadata"]["labels"]["tmi.kamiwaza.ai/owner-part"] == "true"
    assert parse_quota(first) == Quota(
        QUOTA_NAME,
        {"nvidia.com/gpu": 4, "nvidia.com/mig-3g.40gb": 2},
        {"whole-h100-amd64": 2},
        96,
        8,
    )
    # A limit of 0 allows none; one left out is no limit.
    assert parse_quota(quotas[THIRD]) == Quota(QUOTA_NAME, engine_pods=0)
    assert quotas[THIRD]["spec"] == {"hard": {}}


def test_without_a_quota_no_object_is_rendered() -> None:
    docs = _owner(_values())
    assert not [d for d in docs if d["metadata"]["name"] == QUOTA_NAME]


def test_the_extender_and_the_tenants_webhook_may_read_the_quota_by_name() -> None:
    values = _values(tenants=[{"namespace": SECOND, "ownerPublicKey": KEY}])
    owner = _owner(values)
    for namespace in (FIRST, SECOND):
        role = find(owner, "Role", "tmi-extender-read-profiles", namespace)
        assert {
            "apiGroups": [""],
            "resources": ["resourcequotas"],
            "verbs": ["list", "watch"],
            "resourceNames": [QUOTA_NAME],
        } in role["rules"]
    tenant = render(part_values(TENANT, values), namespace=FIRST)
    rules = find(tenant, "Role", "tmi-webhook-read-profiles")["rules"]
    quota = next(r for r in rules if r["resources"] == ["resourcequotas"])
    assert quota["resourceNames"] == [QUOTA_NAME] and quota["verbs"] == ["list", "watch"]
    pods = next(r for r in rules if r["resources"] == ["pods"])
    assert pods["verbs"] == ["list", "watch"] and "resourceNames" not in pods


@pytest.mark.parametrize(
    ("quota", "complaint"),
    [
        ({"enginePods": -1}, "enginePods"),
        ({"borrowing": True}, "borrowing"),
        # helm names the wrong path for a property name; the name itself is right.
        ({"devices": {"gpu": 1}}, "'gpu' does not match"),
        ({"devices": {"nvidia.com/gpu": "1"}}, "devices"),
        ({"accountedVramGB": 1.5}, "accountedVramGB"),
    ],
)
def test_the_schema_refuses_what_no_quota_means(quota: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ChartError, match=complaint):
        _owner(_values(quota=quota))
    further = _values(tenants=[{"namespace": SECOND, "ownerPublicKey": KEY, "quota": quota}])
    with pytest.raises(ChartError, match=complaint):
        _owner(further)
