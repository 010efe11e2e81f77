"""One owner release for two tenant namespaces: each gets its own parameters, policies, webhook
configuration and Roles for the one allocation controller, and the one extender and the one
controller are configured for both (their own settings parsers read what the chart writes)."""

from __future__ import annotations

from typing import Any

import pytest

from allocation_controller.config import settings_from_args as controller_settings
from chart_tools import generate as chartgen
from chart_tools.render import OWNER, find, part_values, render
from extender.config import settings_from_args
from localcluster.plane.kube import JSON

FIRST, SECOND = chartgen.TENANT_NAMESPACE, "team-b"
OWNER_NS = chartgen.OWNER_NAMESPACE
SECOND_KEY = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc="


@pytest.fixture(scope="module")
def docs() -> list[JSON]:
    values = chartgen.base_values()
    values["owner"]["tenants"] = [
        {
            "namespace": SECOND,
            "ownerPublicKey": SECOND_KEY,
            "bundleConfigMap": "team-b-profile-r4",
            "minimumBundleVersion": 4,
            "webhook": {"url": "https://webhook.team-b.example:8443/mutate", "caBundle": "Q0E="},
        }
    ]
    rendered: list[JSON] = render(part_values(OWNER, values), namespace=OWNER_NS)
    return rendered


def _names(docs: list[JSON], kind: str) -> set[tuple[str, str | None]]:
    return {
        (d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs if d["kind"] == kind
    }


def test_each_tenant_has_its_own_parameters_and_the_policies_are_bound_once(
    docs: list[JSON],
) -> None:
    first, second = find(docs, "TenantAdmission", FIRST), find(docs, "TenantAdmission", SECOND)
    assert second["spec"]["minimumBundleVersion"] == 4
    assert first["spec"]["minimumBundleVersion"] == 1
    assert first["spec"]["allocationController"] == second["spec"]["allocationController"]
    for namespace in (FIRST, SECOND):
        policy = find(docs, "TenantPolicy", "tmi-admission", namespace)
        assert policy["spec"]["namespace"] == namespace
    # One policy and one binding each, whatever the number of tenants.
    policies = [d for d in docs if d["kind"].endswith("AdmissionPolicy")]
    bindings = [d for d in docs if d["kind"].endswith("AdmissionPolicyBinding")]
    assert len(policies) == len(bindings) == 7
    for doc in policies + bindings:
        assert not doc["metadata"]["name"].endswith((FIRST, SECOND))
        assert SECOND not in str(doc)


def test_each_tenant_webhook_is_sent_its_own_namespaces_engine_pods(docs: list[JSON]) -> None:
    first = find(docs, "MutatingWebhookConfiguration", "kamiwaza-tenant-inference")
    second = find(docs, "MutatingWebhookConfiguration", f"kamiwaza-tenant-inference-{SECOND}")
    for configuration, namespace in ((first, FIRST), (second, SECOND)):
        (entry,) = configuration["webhooks"]
        names = next(
            e
            for e in entry["namespaceSelector"]["matchExpressions"]
            if e["key"] == "kubernetes.io/metadata.name"
        )
        assert names == {
            "key": "kubernetes.io/metadata.name",
            "operator": "In",
            "values": [namespace],
        }
    assert first["webhooks"][0]["clientConfig"]["service"]["namespace"] == FIRST
    assert second["webhooks"][0]["clientConfig"] == {
        "url": "https://webhook.team-b.example:8443/mutate",
        "caBundle": "Q0E=",
    }
    # Its CA is given, so cert-manager injects nothing into it; the first's it injects.
    assert "annotations" not in second["metadata"]
    assert "cert-manager.io/inject-ca-from" in first["metadata"]["annotations"]


def test_one_extender_is_configured_for_both_tenants(docs: list[JSON]) -> None:
    data: dict[str, Any] = find(docs, "ConfigMap", "tmi-extender-settings")["data"]
    settings = settings_from_args(["--plain-http"], data)
    first, second = settings.every_tenant()
    assert (first.namespace, first.rollback_record) == (FIRST, FIRST)
    assert (second.namespace, second.rollback_record) == (SECOND, SECOND)
    assert second.policy.owner_public_keys == (SECOND_KEY,)
    assert second.policy.bundle_configmap == "team-b-profile-r4"
    assert second.policy.minimum_bundle_version == 4
    assert second.policy.cluster_binding_id == first.policy.cluster_binding_id
    assert settings.pod_namespaces == (FIRST, SECOND)
    # It may read each tenant's profile and write each tenant's record, and nothing more.
    assert _names(docs, "Role") >= {
        ("tmi-extender-read-profiles", FIRST),
        ("tmi-extender-read-profiles", SECOND),
    }
    second_role = next(
        d
        for d in docs
        if d["kind"] == "Role"
        and d["metadata"].get("namespace") == SECOND
        and d["metadata"]["name"] == "tmi-extender-read-profiles"
    )
    assert second_role["rules"][0]["resourceNames"] == ["team-b-profile-r4"]
    cluster_role = find(docs, "ClusterRole", "kamiwaza-tmi-extender")
    records = [r for r in cluster_role["rules"] if "tenantadmissions/status" in r["resources"]]
    assert records[0]["resourceNames"] == [FIRST, SECOND]


def test_one_controller_and_one_lease_serve_every_tenant(docs: list[JSON]) -> None:
    """Adding a tenant adds its entry in the one controller's settings and its namespace's
    Roles, not a Deployment, a Lease or a settings ConfigMap of its own."""
    controller = [
        d
        for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/name")
        == "tmi-allocation-controller"
    ]
    deployments = [d for d in controller if d["kind"] == "Deployment"]
    (deployment,) = deployments
    assert deployment["metadata"]["name"] == "tmi-allocation-controller"
    # The selector the first tenant's Deployment had before, which a Deployment cannot change:
    # `helm upgrade` from a release with a Deployment per tenant rolls this one in place.
    assert deployment["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "tmi-allocation-controller",
        "kamiwaza.ai/tenant-namespace": FIRST,
    }
    (pdb,) = [d for d in controller if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--lease-name=tmi-allocation-controller" in container["args"]
    assert container["envFrom"] == [{"configMapRef": {"name": "tmi-controller-settings"}}]
    (configmap,) = [d for d in controller if d["kind"] == "ConfigMap"]
    assert configmap["metadata"]["name"] == "tmi-controller-settings"
    lease = next(
        r
        for r in find(docs, "Role", "tmi-allocation-controller-lease")["rules"]
        if r.get("resourceNames")
    )
    assert lease["resourceNames"] == ["tmi-allocation-controller"]
    # Each tenant namespace keeps its own Role and RoleBinding for the one ServiceAccount.
    for namespace in (FIRST, SECOND):
        assert ("tmi-allocation-controller", namespace) in _names(docs, "Role")
        assert ("tmi-allocation-controller", namespace) in _names(docs, "RoleBinding")


def test_the_controller_is_told_every_tenant_with_its_own_trust(docs: list[JSON]) -> None:
    """TMI_TENANTS names every tenant namespace with its own settings, as the controller's own
    parser reads them; the shares of each are held apart from the others' in one process."""
    data = find(docs, "ConfigMap", "tmi-controller-settings")["data"]
    assert "TMI_TENANT_NAMESPACES" not in data and "TMI_NAMESPACE" not in data
    settings = controller_settings([], data)
    first, second = settings.every_tenant()
    assert (first.namespace, second.namespace) == (FIRST, SECOND)
    assert second.owner_public_keys == (SECOND_KEY,)
    assert (second.bundle_configmap, second.minimum_bundle_version) == ("team-b-profile-r4", 4)
    assert second.cluster_binding_id == first.cluster_binding_id
    assert first.minimum_bundle_version == 1
    assert settings.other_tenants == ()
    alone = render(part_values(OWNER, chartgen.base_values()), namespace=OWNER_NS)
    (only,) = controller_settings(
        [], find(alone, "ConfigMap", "tmi-controller-settings")["data"]
    ).every_tenant()
    assert only.namespace == FIRST


def test_a_tenant_added_rolls_the_controller() -> None:
    """The settings checksum changes with the tenants, so the Deployment's Pods are replaced
    with ones that serve the new tenant too."""

    def checksum(tenants: list[dict[str, Any]]) -> str:
        values = chartgen.base_values()
        values["owner"]["tenants"] = tenants
        docs = render(part_values(OWNER, values), namespace=OWNER_NS)
        template = find(docs, "Deployment", "tmi-allocation-controller")["spec"]["template"]
        return str(template["metadata"]["annotations"]["checksum/settings"])

    one = checksum([])
    two = checksum([{"namespace": SECOND, "ownerPublicKey": SECOND_KEY}])
    assert one != two
    assert two == checksum([{"namespace": SECOND, "ownerPublicKey": SECOND_KEY}])


def test_each_tenant_names_only_its_own_priority_classes() -> None:
    """A further tenant inherits much of the first tenant's settings, but not the classes its
    Pods may name: a class allowed to one tenant would let it preempt the other's Pods."""
    values = chartgen.base_values()
    values["owner"]["priorityClasses"] = ["team-a-serving"]
    values["owner"]["tenants"] = [
        {"namespace": SECOND, "ownerPublicKey": SECOND_KEY},
        {"namespace": "team-c", "ownerPublicKey": SECOND_KEY, "priorityClasses": ["batch"]},
    ]
    docs = render(part_values(OWNER, values), namespace=OWNER_NS)
    classes = {
        d["metadata"]["name"]: d["spec"]["priorityClasses"]
        for d in docs
        if d["kind"] == "TenantAdmission"
    }
    assert classes == {FIRST: ["team-a-serving"], SECOND: [], "team-c": ["batch"]}
    quotas = _names(docs, "ResourceQuota")
    assert {ns for _, ns in quotas} == {FIRST, SECOND, "team-c"}
