"""The Helm chart and the kustomize bases, rendered by the pinned helm and kustomize.

What a user installs is the chart (or the kustomize bases generated from it), so these tests
hold the chart to what the project promises: it lints strictly, its schema refuses malformed
values, the two parts are separable (the tenant part is namespaced only), one value moves a
profile revision everywhere, the guard's CEL is the core's, and the kustomize bases and overlays
build to exactly what `helm template` produces.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from allocation_controller.config import settings_from_args as controller_settings
from chart_tools import generate as chartgen
from chart_tools.render import (
    CHART,
    OWNER,
    TENANT,
    ChartError,
    find,
    kustomize_build,
    lint,
    part_values,
    render,
)
from extender.config import settings_from_args
from inference_policy.admission.access_cel import cel_condition
from inference_policy.admission.owner_objects_cel import OWNER_LABEL
from inference_policy.admission.policy_cel import policy_parts
from inference_policy.placing.schedconfig import DEFAULT_SCHEDULER_NAME, render_scheduler_config
from inference_policy.planning.room import ROOM_CONFIGMAP
from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
from localcluster.plane.kube import JSON

ROOT = Path(__file__).resolve().parents[2]
# Where the chart mounts the extender's CA in the scheduler's container (_helpers.tpl).
SCHEDULER_CA_FILE = "/etc/kubernetes/kamiwaza-scheduler/extender-ca/ca.crt"
OVERLAY_VALUES = CHART / "ci" / "overlay-values.yaml"
TENANT_NS = chartgen.TENANT_NAMESPACE
OWNER_NS = chartgen.OWNER_NAMESPACE
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
    "Namespace",
    "TenantAdmission",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def webhook_environment(docs: list[JSON]) -> dict[str, str]:
    """tmi-settings as the tenant webhook's environment: its keys under the envFrom prefix."""
    (container,) = find(docs, "Deployment", "tmi-webhook")["spec"]["template"]["spec"]["containers"]
    (source,) = container["envFrom"]
    data = find(docs, "ConfigMap", source["configMapRef"]["name"])["data"]
    return {source.get("prefix", "") + k: v for k, v in data.items()}


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return chartgen.base_values()


def rendered(values: dict[str, Any], part: str) -> list[JSON]:
    namespace = TENANT_NS if part == TENANT else OWNER_NS
    return render(part_values(part, values), namespace=namespace)


def identity(doc: JSON) -> tuple[str, str, str]:
    meta = doc["metadata"]
    return (doc["kind"], meta.get("namespace") or "", meta["name"])


def test_the_chart_lints_strictly_with_each_part(values: dict[str, Any], tmp_path: Path) -> None:
    for part in (TENANT, OWNER):
        path = tmp_path / f"{part}.yaml"
        path.write_text(yaml.safe_dump(part_values(part, values)))
        assert "0 chart(s) failed" in lint([path])


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"core": {"inferenceResources": {"ownerPublicKey": "not-a-key"}}}, "ownerPublicKey"),
        ({"core": {"inferenceResources": {"bundleConfigMap": "Has_Capitals"}}}, "bundleConfigMap"),
        ({"core": {"inferenceResources": {"minimumBundleVersion": 0}}}, "minimumBundleVersion"),
        ({"core": {"inferenceResources": {"bundelConfigMap": "x"}}}, "bundelConfigMap"),
        ({"image": {"digest": "latest"}}, "digest"),
        ({"tenant": {"webhook": {"replicas": 0}}}, "replicas"),
    ],
)
def test_the_schema_refuses_malformed_values(
    values: dict[str, Any], change: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ChartError, match=complaint):
        render(part_values(TENANT, merged(values, change)), namespace=TENANT_NS)


@pytest.mark.parametrize("missing", ["ownerPublicKey", "clusterBindingId"])
def test_the_trust_values_are_required(values: dict[str, Any], missing: str) -> None:
    change = {"core": {"inferenceResources": {missing: ""}}}
    with pytest.raises(ChartError, match=missing):
        render(part_values(TENANT, merged(values, change)), namespace=TENANT_NS)


def _scheduler_config(docs: list[JSON], name: str = DEFAULT_SCHEDULER_NAME) -> Any:
    return yaml.safe_load(find(docs, "ConfigMap", f"{name}-config")["data"]["config.yaml"])


@pytest.mark.parametrize(
    ("scheduler", "name", "url", "server_name"),
    [
        ({}, DEFAULT_SCHEDULER_NAME, f"https://tmi-extender.{OWNER_NS}.svc:443", None),
        (
            {
                "extenderURL": "https://10.96.0.17:443",
                "extenderServerName": f"tmi-extender.{OWNER_NS}.svc",
                "weight": 7,
                "httpTimeout": "2s",
            },
            "team-a-scheduler",
            "https://10.96.0.17:443",
            f"tmi-extender.{OWNER_NS}.svc",
        ),
    ],
)
def test_the_chart_renders_the_scheduler_configuration_the_core_renders(
    values: dict[str, Any],
    scheduler: dict[str, Any],
    name: str,
    url: str,
    server_name: str | None,
) -> None:
    """No configuration to render by hand: the chart's is the core's for the same inputs, its
    CA the extender certificate Secret's ca.crt mounted in the scheduler's container."""
    change = {
        "core": {"inferenceResources": {"schedulerName": name}},
        "owner": {"scheduler": {"config": "", **scheduler}},
    }
    docs = rendered(merged(values, change), OWNER)
    assert _scheduler_config(docs, name) == render_scheduler_config(
        extender_url=url,
        ca_file=SCHEDULER_CA_FILE,
        scheduler_name=name,
        scheduler_namespace=OWNER_NS,
        weight=scheduler.get("weight", 5),
        http_timeout=scheduler.get("httpTimeout", "5s"),
        server_name=server_name,
    )
    deployment = find(docs, "Deployment", name)
    (mount,) = [
        m
        for m in deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        if m["name"] == "extender-ca"
    ]
    assert f"{mount['mountPath']}/ca.crt" == SCHEDULER_CA_FILE
    volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "extender-ca"
    )
    assert volume["secret"]["secretName"] == "tmi-extender-tls"


def test_every_name_that_follows_the_scheduler_name_is_derived_from_it(
    values: dict[str, Any],
) -> None:
    change = {
        "core": {"inferenceResources": {"schedulerName": "team-a-scheduler"}},
        "owner": {"scheduler": {"config": ""}},
    }
    docs = rendered(merged(values, change), OWNER)
    policy = find(docs, "NetworkPolicy", "tmi-extender")
    selectors = [
        f["podSelector"] for r in policy["spec"]["ingress"] for f in r["from"] if "podSelector" in f
    ]
    assert selectors == [
        {"matchLabels": {"app.kubernetes.io/name": "team-a-scheduler"}},
        {
            "matchLabels": {
                "app.kubernetes.io/name": "tmi-extender-test",
                "app.kubernetes.io/component": "helm-test",
            }
        },
    ]
    role = find(docs, "Role", "team-a-scheduler-leader-election")
    assert ["team-a-scheduler"] in [r.get("resourceNames") for r in role["rules"]]
    assert _scheduler_config(docs, "team-a-scheduler")["leaderElection"]["resourceName"] == (
        "team-a-scheduler"
    )
    settings = webhook_environment(rendered(merged(values, change), TENANT))
    assert settings["TMI_SCHEDULER_NAME"] == "team-a-scheduler"


def test_a_passed_configuration_for_another_scheduler_name_is_refused(
    values: dict[str, Any],
) -> None:
    """The example configuration names the default scheduler: with another schedulerName the
    engine Pods would wait Pending for a scheduler that never comes, so the chart says so."""
    example = render_scheduler_config(extender_url="http://tmi-extender:8443")
    change = {
        "core": {"inferenceResources": {"schedulerName": "team-a-scheduler"}},
        "owner": {"scheduler": {"config": yaml.safe_dump(example)}},
    }
    with pytest.raises(ChartError, match='names scheduler "kamiwaza-inference-scheduler" but'):
        render(part_values(OWNER, merged(values, change)), namespace=OWNER_NS)


def test_the_tenant_part_is_namespaced_and_stays_in_its_namespace(values: dict[str, Any]) -> None:
    docs = rendered(values, TENANT)
    assert docs
    for doc in docs:
        assert doc["kind"] not in CLUSTER_SCOPED, identity(doc)
        assert doc["metadata"]["namespace"] == TENANT_NS, identity(doc)
        for subject in doc.get("subjects") or []:
            assert subject["namespace"] == TENANT_NS


def test_the_owner_part_touches_the_tenant_namespace_only_with_its_servers_rights(
    values: dict[str, Any],
) -> None:
    """Only Roles for the owner's servers (in the owner's namespace) to read the profile and,
    for the controller, write the verdict, and for the extender the room figures, the quota
    that keeps the tenant's affinity terms in its namespace, and the admission policies'
    parameters; nothing that runs there."""
    docs = rendered(values, OWNER)
    in_tenant = sorted(identity(d) for d in docs if d["metadata"].get("namespace") == TENANT_NS)
    assert in_tenant == [
        ("ResourceQuota", TENANT_NS, "tmi-no-cross-namespace-affinity"),
        ("Role", TENANT_NS, "tmi-allocation-controller"),
        ("Role", TENANT_NS, "tmi-extender-read-profiles"),
        ("Role", TENANT_NS, "tmi-extender-write-room"),
        ("RoleBinding", TENANT_NS, "tmi-allocation-controller"),
        ("RoleBinding", TENANT_NS, "tmi-extender-read-profiles"),
        ("RoleBinding", TENANT_NS, "tmi-extender-write-room"),
        ("TenantPolicy", TENANT_NS, "tmi-admission"),
    ]
    for binding in (d for d in docs if d["kind"] == "RoleBinding"):
        assert all(s["namespace"] == OWNER_NS for s in binding["subjects"])
    assert {d["kind"] for d in docs} >= {"MutatingWebhookConfiguration", "ClusterRole"}


def test_the_extender_may_write_the_room_figures_only_while_it_publishes_them(
    values: dict[str, Any],
) -> None:
    """The room Role names the one ConfigMap it may update; create cannot be named. With
    roomSeconds 0 the extender is told to write none and no Role lets it; the tenant's webhook
    may read the figures by name either way."""
    docs = rendered(values, OWNER)
    role = find(docs, "Role", "tmi-extender-write-room")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [ROOM_CONFIGMAP],
            "verbs": ["update"],
        },
    ]
    settings = find(docs, "ConfigMap", "tmi-extender-settings")["data"]
    assert settings_from_args(["--plain-http"], settings).room_seconds == 2.0
    off = rendered(merged(values, {"owner": {"extender": {"roomSeconds": 0}}}), OWNER)
    assert not [d for d in off if d["metadata"]["name"] == "tmi-extender-write-room"]
    settings = find(off, "ConfigMap", "tmi-extender-settings")["data"]
    assert settings_from_args(["--plain-http"], settings).room_seconds == 0
    webhook = find(rendered(values, TENANT), "Role", "tmi-webhook-read-profiles")
    assert ROOM_CONFIGMAP in webhook["rules"][0]["resourceNames"]


def test_the_fallback_guard_expression_is_the_cores(values: dict[str, Any]) -> None:
    fallback = merged(values, {"owner": {"admissionPolicies": {"enabled": False}}})
    docs = rendered(fallback, OWNER)
    configuration = find(docs, "MutatingWebhookConfiguration", "kamiwaza-tenant-inference")
    guard = next(w for w in configuration["webhooks"] if w["name"].startswith("guard."))
    expressions = {c["name"]: c["expression"] for c in guard["matchConditions"]}
    assert expressions["reaches-for-an-accelerator"] == cel_condition()
    assert not {d["kind"] for d in docs} & {"MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"}


def test_the_tenant_webhook_is_sent_engine_pods_only(values: dict[str, Any]) -> None:
    configuration = find(
        rendered(values, OWNER), "MutatingWebhookConfiguration", "kamiwaza-tenant-inference"
    )
    (entry,) = configuration["webhooks"]
    assert entry["name"] == "pods.tenant-inference.kamiwaza.ai"
    assert entry["objectSelector"] == {
        "matchExpressions": [{"key": "kamiwaza.ai/deployment-id", "operator": "Exists"}]
    }


def test_the_admission_policies_are_the_cores_with_the_owners_parameters(
    values: dict[str, Any],
) -> None:
    docs = rendered(values, OWNER)
    tenant = "kamiwaza-tmi-guard"
    parts = policy_parts()
    shield = find(docs, "MutatingAdmissionPolicy", "kamiwaza-tmi-shield")["spec"]
    assert (
        shield["mutations"][0]["applyConfiguration"]["expression"]
        == (parts["shield"]["expression"])
    )
    assert shield["matchConditions"] == parts["shield"]["matchConditions"]
    guard = find(docs, "ValidatingAdmissionPolicy", tenant)["spec"]
    assert guard["variables"] == parts["guard"]["variables"]
    assert guard["validations"] == parts["guard"]["validations"]
    assert guard["failurePolicy"] == "Fail"
    assert guard["paramKind"] == {
        "apiVersion": "tmi.kamiwaza.ai/v1alpha1",
        "kind": "TenantPolicy",
    }
    binding = find(docs, "ValidatingAdmissionPolicyBinding", tenant)["spec"]
    # Bound once: the parameters are the TenantPolicy in the namespace of the request.
    paramref = {"name": "tmi-admission", "parameterNotFoundAction": "Deny"}
    assert binding["paramRef"] == paramref
    params = find(docs, "TenantAdmission", TENANT_NS)
    assert "namespace" not in params["metadata"]
    policy = find(docs, "TenantPolicy", "tmi-admission")
    assert policy["metadata"]["namespace"] == TENANT_NS
    assert policy["metadata"]["labels"][OWNER_LABEL] == "true"
    # The same decisions, without the version floor (the extender's, not a policy's).
    assert policy["spec"] == {
        k: v for k, v in params["spec"].items() if k != "minimumBundleVersion"
    }
    scheduler = values["core"]["inferenceResources"].get("schedulerName")
    assert params["spec"] == {
        "namespace": TENANT_NS,
        "schedulerName": scheduler or "kamiwaza-inference-scheduler",
        "minimumBundleVersion": values["core"]["inferenceResources"].get("minimumBundleVersion", 1),
        "allocationController": (f"system:serviceaccount:{OWNER_NS}:tmi-allocation-controller"),
        # No owner.dra: no claim in the namespace is admitted.
        "deviceClasses": [],
        "claimTemplates": [],
        # No class beyond the cluster's global default (none here: nothing to look up).
        "priorityClasses": [],
        # The status policy's writers beside the cluster's own: the owner's two parts.
        "statusWriters": [
            f"system:serviceaccount:{OWNER_NS}:{scheduler or 'kamiwaza-inference-scheduler'}",
            f"system:serviceaccount:{OWNER_NS}:tmi-allocation-controller",
        ],
    }
    status_name = "kamiwaza-tmi-status"
    status = find(docs, "ValidatingAdmissionPolicy", status_name)["spec"]
    assert status["variables"] == parts["status"]["variables"]
    assert status["validations"] == parts["status"]["validations"]
    assert status["matchConstraints"]["resourceRules"][0]["resources"] == ["pods/status"]
    status_binding = find(docs, "ValidatingAdmissionPolicyBinding", status_name)["spec"]
    assert status_binding["paramRef"] == paramref
    owned_name = "kamiwaza-tmi-owner-objects"
    owned = find(docs, "ValidatingAdmissionPolicy", owned_name)["spec"]
    assert owned["validations"] == parts["ownerObjects"]["validations"]
    assert owned["matchConstraints"]["resourceRules"] == parts["ownerObjects"]["resourceRules"]
    # Every object the owner places in the tenant namespace carries the label it guards.
    in_tenant = [d for d in docs if d["metadata"].get("namespace") == TENANT_NS]
    assert {d["kind"] for d in in_tenant} >= {"Role", "RoleBinding"}
    for doc in in_tenant:
        assert doc["metadata"]["labels"][OWNER_LABEL] == "true", doc["metadata"]["name"]
    verdict_name = "kamiwaza-tmi-verdict"
    verdict = find(docs, "ValidatingAdmissionPolicy", verdict_name)["spec"]
    assert verdict["variables"] == parts["verdict"]["variables"]
    assert verdict["validations"] == parts["verdict"]["validations"]
    assert verdict["matchConstraints"]["resourceRules"][0]["resources"] == ["pods/status"]
    verdict_binding = find(docs, "ValidatingAdmissionPolicyBinding", verdict_name)["spec"]
    assert verdict_binding["paramRef"] == binding["paramRef"]
    definition = find(docs, "CustomResourceDefinition", "tenantadmissions.tmi.kamiwaza.ai")
    assert definition["spec"]["scope"] == "Cluster"
    # From crds/: created before the templates that hold its TenantAdmission, never deleted
    # by Helm, and not in the tenant's part (its installer may not create definitions).
    assert definition in docs[:2]
    parameters = find(docs, "CustomResourceDefinition", "tenantpolicies.tmi.kamiwaza.ai")
    assert parameters["spec"]["scope"] == "Namespaced"
    assert parameters in docs[:2]
    tenant_docs = render(part_values(TENANT, values), namespace=TENANT_NS)
    assert not [d for d in tenant_docs if d["kind"] == "CustomResourceDefinition"]
    # Every opted-in namespace, not one by name: a tenant added is its parameters only.
    selector = binding["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector == [
        {"key": "kamiwaza.ai/tenant-inference", "operator": "In", "values": ["enabled"]}
    ]
    # The owner-objects policy acts in every namespace on what it matches (its variables).
    owned_binding = find(docs, "ValidatingAdmissionPolicyBinding", "kamiwaza-tmi-owner-objects")
    assert "matchResources" not in owned_binding["spec"]


def test_the_webhook_can_be_called_by_url_with_a_given_ca(values: dict[str, Any]) -> None:
    change = {"owner": {"webhook": {"url": "https://127.0.0.1:9443/mutate", "caBundle": "Q0E="}}}
    docs = rendered(merged(values, change), OWNER)
    configuration = find(docs, "MutatingWebhookConfiguration", "kamiwaza-tenant-inference")
    assert "annotations" not in configuration["metadata"]
    for entry in configuration["webhooks"]:
        assert entry["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate", "caBundle": "Q0E="}


def _references(docs: list[JSON]) -> list[str]:
    """Every place a profile ConfigMap name appears: Role resourceNames and settings."""
    names: list[str] = []
    for doc in docs:
        for rule in doc.get("rules") or []:
            names.extend(n for n in rule.get("resourceNames") or [] if "profiles" in n)
        data = doc.get("data") or {} if doc["kind"] == "ConfigMap" else {}
        for key in ("TMI_BUNDLE_CONFIGMAP", "BUNDLE_CONFIGMAP"):
            if key in data:
                names.append(data[key])
    return names


def _pod_annotations(docs: list[JSON]) -> dict[str, dict[str, str]]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"].get("annotations") or {}
        for d in docs
        if d["kind"] == "Deployment"
    }


def test_one_value_moves_a_profile_revision_everywhere(values: dict[str, Any]) -> None:
    revision = {
        "core": {"inferenceResources": {"bundleConfigMap": "kamiwaza-inference-profiles-r2"}}
    }
    for part in (TENANT, OWNER):
        before = rendered(values, part)
        after = rendered(merged(values, revision), part)
        # The seed's name, which `tmi sign` gives a profile unless told another.
        assert set(_references(before)) == {DEFAULT_CONFIGMAP_NAME}
        # Webhook Role and settings, or extender Role and settings: all of them, from one value.
        assert len(_references(after)) >= 2
        assert set(_references(after)) == {"kamiwaza-inference-profiles-r2"}
        # Every tmi server Deployment rolls, so it starts with the new settings.
        old, new = _pod_annotations(before), _pod_annotations(after)
        for name in new:
            if name.startswith("tmi-"):
                assert old[name]["checksum/settings"] != new[name]["checksum/settings"], name


def test_the_owners_servers_take_the_owners_settings_not_the_tenants(
    values: dict[str, Any],
) -> None:
    """The webhook plans with the tenant's settings; the controller and the extender, which
    hold the grant, with the owner release's, and the verdict's Lease is in the owner's
    namespace."""
    tenant = rendered(values, TENANT)
    (webhook,) = find(tenant, "Deployment", "tmi-webhook")["spec"]["template"]["spec"]["containers"]
    assert webhook["envFrom"] == [{"prefix": "TMI_", "configMapRef": {"name": "tmi-settings"}}]
    assert not any(e["name"].startswith("TMI_") for e in webhook.get("env") or [])
    assert [d["metadata"]["name"] for d in tenant if d["kind"] == "Deployment"] == ["tmi-webhook"]
    owner = rendered(values, OWNER)
    deployment = find(owner, "Deployment", "tmi-allocation-controller")
    assert deployment["metadata"]["namespace"] == OWNER_NS
    (controller,) = deployment["spec"]["template"]["spec"]["containers"]
    assert controller["envFrom"] == [{"configMapRef": {"name": "tmi-controller-settings"}}]
    lease = next(e for e in controller["env"] if e["name"] == "TMI_LEASE_NAMESPACE")
    assert lease["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # Each server's own parser reads what the chart wrote: the same trust for the tenant.
    settings = find(owner, "ConfigMap", "tmi-controller-settings")["data"]
    (served,) = controller_settings([], settings).every_tenant()
    assert served.namespace == TENANT_NS
    extender = find(owner, "ConfigMap", "tmi-extender-settings")["data"]
    (first,) = settings_from_args(["--plain-http"], extender).every_tenant()
    for field in ("owner_public_keys", "cluster_binding_id", "minimum_bundle_version"):
        assert getattr(served, field) == getattr(first.policy, field)


def test_the_generated_files_are_current() -> None:
    stale = chartgen.stale(chartgen.expected_files())
    assert not stale, f"run `python -m chart_tools.generate`: {stale}"


def _normalised(docs: list[JSON]) -> dict[tuple[str, str, str], JSON]:
    """Objects by identity, without what legitimately differs between the install paths: the
    labels naming the tool, checksums of settings an overlay patches after rendering, and Helm
    hooks (a kustomize base has no events to run them on)."""
    out: dict[tuple[str, str, str], JSON] = {}
    for original in docs:
        if "helm.sh/hook" in (original["metadata"].get("annotations") or {}):
            continue
        doc = copy.deepcopy(original)
        labels = doc["metadata"].get("labels") or {}
        labels.pop("app.kubernetes.io/managed-by", None)
        template = (doc.get("spec") or {}).get("template") or {}
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        for key in [k for k in annotations if k.startswith("checksum/")]:
            del annotations[key]
        out[identity(doc)] = doc
    return out


@pytest.mark.parametrize(("part", "base"), [(TENANT, "tenant"), (OWNER, "owner-all")])
def test_each_kustomize_base_is_the_chart(values: dict[str, Any], part: str, base: str) -> None:
    from_kustomize = _normalised(kustomize_build(ROOT / "manifests" / base))
    from_helm = _normalised(rendered(values, part))
    key = chartgen.KEY_STAND_IN
    for doc in from_helm.values():
        for field, text in (doc.get("data") or {}).items():
            # A value that is the key, or holds it (the controller's TMI_TENANTS).
            if isinstance(text, str) and key in text:
                doc["data"][field] = text.replace(key, chartgen.KEY_PLACEHOLDER)
    assert sorted(from_kustomize) == sorted(from_helm)
    assert from_kustomize == from_helm


@pytest.mark.parametrize(("part", "overlay"), [(TENANT, "tenant"), (OWNER, "owner")])
def test_each_overlay_is_the_chart_with_the_same_values(
    values: dict[str, Any], part: str, overlay: str
) -> None:
    extra = yaml.safe_load(OVERLAY_VALUES.read_text())
    from_kustomize = _normalised(kustomize_build(ROOT / "manifests" / "overlays" / overlay))
    from_helm = _normalised(rendered(merged(values, extra), part))
    assert from_kustomize == from_helm


def test_the_alerts_and_the_dashboard_ship_as_files_say(values: dict[str, Any]) -> None:
    change = {"monitoring": {"prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}}
    docs = rendered(merged(values, change), TENANT)
    rule = find(docs, "PrometheusRule", "tmi")
    files = CHART / "files"
    assert rule["spec"]["groups"] == yaml.safe_load((files / "alerts.yaml").read_text())["groups"]
    dashboard = find(docs, "ConfigMap", "tmi-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((files / "grafana-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["tmi.json"]) == shipped
    evidence = json.loads((files / "gpu-sharing-evidence-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["tmi-gpu-sharing-evidence.json"]) == evidence
    off = {(d["kind"], d["metadata"]["name"]) for d in rendered(values, TENANT)}
    assert ("PrometheusRule", "tmi") not in off


def test_the_owners_extender_plans_with_what_the_tenants_webhook_plans_with(
    values: dict[str, Any],
) -> None:
    """The extender re-derives every Pod's plan, so every setting a plan depends on reaches it
    from the owner release as it reaches the tenant's servers, and it may read the catalogs."""
    planning = {
        "core": {
            "inferenceResources": {
                "engineImageMap": {"llamacpp": "mirror.invalid/llama:1"},
                "gpuRecipeCatalogConfigMap": "gpu-recipes",
                "cpuRecipeCatalogConfigMap": "cpu-recipes",
            }
        },
        "global": {"imageRegistryPrefix": "mirror.invalid/kamiwaza"},
    }
    changed = merged(values, planning)
    tenant = webhook_environment(rendered(changed, TENANT))
    extender = find(rendered(changed, OWNER), "ConfigMap", "tmi-extender-settings")["data"]
    keys = (
        "TMI_ENGINE_IMAGE_MAP",
        "TMI_IMAGE_REGISTRY_PREFIX",
        "TMI_GPU_RECIPE_CATALOG_CONFIGMAP",
        "TMI_CPU_RECIPE_CATALOG_CONFIGMAP",
    )
    for key in keys:
        assert extender[key] == tenant[key], key
    role = find(rendered(changed, OWNER), "Role", "tmi-extender-read-profiles")
    rule = next(r for r in role["rules"] if r["resources"] == ["configmaps"])
    assert set(rule["resourceNames"]) >= {"gpu-recipes", "cpu-recipes"}


def test_the_tenant_uninstall_hook_runs_first_and_the_owner_grants_it_one_configuration(
    values: dict[str, Any],
) -> None:
    """The pre-delete Job (and its ServiceAccount, made just before it) removes the owner's
    configuration for this namespace; the owner release lets that ServiceAccount get and delete
    exactly that one; the kustomize base, which has no uninstall event, leaves the hook out."""
    tenant = rendered(values, TENANT)
    job = find(tenant, "Job", "tmi-webhook-cleanup")
    account = find(tenant, "ServiceAccount", "tmi-webhook-cleanup")
    for doc, weight in ((account, "-10"), (job, "0")):
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert annotations["helm.sh/hook-weight"] == weight
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][:2] == ["remove-webhooks", f"--namespace={TENANT_NS}"]
    assert "--best-effort" in container["args"]
    assert f"--configuration=kamiwaza-tenant-inference-{TENANT_NS}" in container["args"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in container["env"]
    owner = rendered(values, OWNER)
    role = find(owner, "ClusterRole", f"kamiwaza-tmi-webhook-cleanup-{TENANT_NS}")
    assert role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations"],
            "resourceNames": ["kamiwaza-tenant-inference"],
            "verbs": ["get", "delete"],
        }
    ]
    binding = find(owner, "ClusterRoleBinding", f"kamiwaza-tmi-webhook-cleanup-{TENANT_NS}")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tmi-webhook-cleanup", "namespace": TENANT_NS}
    ]
    base = (ROOT / "manifests" / "webhook" / "kustomization.yaml").read_text()
    assert "cleanup" not in base


@pytest.mark.parametrize("overlay", ["tenant", "owner"])
def test_the_overlays_leave_no_placeholder_to_fill_in(overlay: str) -> None:
    built = json.dumps(kustomize_build(ROOT / "manifests" / "overlays" / overlay))
    assert re.findall(r"<[A-Z0-9_]+>", built) == []


def test_a_default_install_has_tenant_mode_off_as_the_seed_says() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert defaults["core"]["inferenceResources"]["enabled"] is False
    assert defaults["core"]["inferenceResources"]["bundleConfigMap"] == DEFAULT_CONFIGMAP_NAME
    values = chartgen.base_values()
    values["core"]["inferenceResources"].pop("enabled", None)
    settings = webhook_environment(rendered(values, TENANT))
    assert settings["TMI_ENABLED"] == "false"


@pytest.mark.parametrize(
    ("kube_version", "prefix", "image"),
    [
        ("v1.36.3", "", "registry.k8s.io/kube-scheduler:v1.36.3"),
        ("v1.34.2+k3s1", "", "registry.k8s.io/kube-scheduler:v1.34.2"),
        (
            "v1.35.1-eks-4096722",
            "mirror.example/kamiwaza",
            "mirror.example/kamiwaza/images/kube-scheduler:v1.35.1",
        ),
    ],
)
def test_the_scheduler_image_follows_the_cluster_version_and_the_registry_prefix(
    values: dict[str, Any], kube_version: str, prefix: str, image: str
) -> None:
    change = {"global": {"imageRegistryPrefix": prefix}, "owner": {"scheduler": {"image": ""}}}
    docs = render(
        part_values(OWNER, merged(values, change)), namespace=OWNER_NS, kube_version=kube_version
    )
    (container,) = find(docs, "Deployment", DEFAULT_SCHEDULER_NAME)["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["image"] == image


@pytest.mark.parametrize(
    ("kube_version", "live", "ready"),
    [
        ("v1.30.14", "/healthz", "/healthz"),
        ("v1.31.0", "/livez", "/readyz"),
        ("v1.36.3", "/livez", "/readyz"),
    ],
)
def test_the_scheduler_is_probed_where_its_release_serves(
    values: dict[str, Any], kube_version: str, live: str, ready: str
) -> None:
    """kube-scheduler serves /livez and /readyz from 1.31 only; before, a probe there would
    restart it forever (found by `make test-versions` on 1.30)."""
    docs = render(part_values(OWNER, values), namespace=OWNER_NS, kube_version=kube_version)
    (container,) = find(docs, "Deployment", DEFAULT_SCHEDULER_NAME)["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["livenessProbe"]["httpGet"]["path"] == live
    assert container["readinessProbe"]["httpGet"]["path"] == ready


def test_a_pinned_scheduler_image_is_probed_where_every_release_serves(
    values: dict[str, Any],
) -> None:
    """A pinned image may be a release below 1.31 on a newer cluster (the skew policy allows
    one minor): /healthz, which every release serves."""
    pinned = merged(values, {"owner": {"scheduler": {"image": "mirror.example/ks:v1.30.14"}}})
    docs = render(part_values(OWNER, pinned), namespace=OWNER_NS, kube_version="v1.36.3")
    (container,) = find(docs, "Deployment", DEFAULT_SCHEDULER_NAME)["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_pod_knobs_reach_every_server_and_leave_the_charts_own_annotations(
    values: dict[str, Any],
) -> None:
    knobs = {
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"node-role.example/infra": "true"},
        "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/team": "platform", "sidecar.istio.io/inject": "true"},
        "owner": {"scheduler": {"extraArgs": ["--v=4"]}},
    }
    changed = merged(values, knobs)
    docs = rendered(changed, TENANT) + rendered(changed, OWNER)
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {
        "tmi-webhook",
        "tmi-extender",
        "tmi-allocation-controller",
        DEFAULT_SCHEDULER_NAME,
    }
    for deployment in deployments:
        pod = deployment["spec"]["template"]
        assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
        assert pod["spec"]["nodeSelector"] == knobs["nodeSelector"]
        assert pod["spec"]["tolerations"] == knobs["tolerations"]
        annotations = pod["metadata"]["annotations"]
        assert annotations["example.com/team"] == "platform"
        # The mesh opt-out is the chart's: a sidecar would sit between the API server and the
        # webhook, or the scheduler and the extender.
        assert annotations["sidecar.istio.io/inject"] == "false"
    scheduler = find(docs, "Deployment", DEFAULT_SCHEDULER_NAME)
    assert scheduler["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "--v=4"


def test_the_alerts_link_the_runbook_where_the_owner_publishes_it(values: dict[str, Any]) -> None:
    base = "https://git.example.com/platform/tmi/blob/v0.1.0/docs/operations.md"
    change = {"monitoring": {"prometheusRule": {"enabled": True}, "runbookURL": base}}
    rule = find(rendered(merged(values, change), TENANT), "PrometheusRule", "tmi")
    annotations = [r["annotations"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert annotations and all("runbook" not in a for a in annotations)
    links = {a["runbook_url"] for a in annotations}
    assert f"{base}#tmiprofileexpiringsoon" in links
    assert f"{base}#{{{{ $labels.reason }}}}" in links
    assert all(link.startswith(base + "#") for link in links)


def _notes(values: dict[str, Any], part: str, tmp_path: Path) -> str:
    """NOTES.txt as `helm install` prints it. `helm template` leaves it out, so a copy of the
    chart defines it as a partial and renders it into a ConfigMap."""
    import shutil

    chart = tmp_path / "tmi"
    shutil.copytree(CHART, chart)
    notes = chart / "templates" / "NOTES.txt"
    body = notes.read_text()
    notes.unlink()
    (chart / "templates" / "_notes.tpl").write_text(
        '{{- define "notes-under-test" -}}\n' + body + "\n{{- end -}}\n"
    )
    (chart / "templates" / "notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-under-test\n"
        'data:\n  notes: {{ include "notes-under-test" . | toJson }}\n'
    )
    namespace = TENANT_NS if part == TENANT else OWNER_NS
    docs = render(part_values(part, values), namespace=namespace, chart=chart)
    return str(find(docs, "ConfigMap", "notes-under-test")["data"]["notes"])


def test_the_notes_say_the_next_steps_for_each_part(values: dict[str, Any], tmp_path: Path) -> None:
    off = merged(values, {"core": {"inferenceResources": {"enabled": False}}})
    notes = _notes(off, TENANT, tmp_path / "off")
    assert "Tenant-mode inference is OFF" in notes and "enabled=true" in notes
    on = merged(values, {"core": {"inferenceResources": {"enabled": True}}})
    notes = _notes(on, TENANT, tmp_path / "on")
    assert f"kubectl -n {TENANT_NS} rollout status deployment/tmi-webhook" in notes
    assert f"--bundle-configmap {DEFAULT_CONFIGMAP_NAME}" in notes
    notes = _notes(on, OWNER, tmp_path / "owner")
    assert f"kubectl label namespace {TENANT_NS} kamiwaza.ai/tenant-inference=enabled" in notes
    assert f"deployment/{DEFAULT_SCHEDULER_NAME}" in notes


def test_the_seeds_values_file_installs_and_its_pull_secret_rule_holds(
    values: dict[str, Any],
) -> None:
    """The seed's staging values are accepted (the platform stages models; tmi stages none), and
    the install's pull Secret is the engine Pods' staging credential unless OpenShift's
    ServiceAccount-only rule is on."""
    seed = {
        "global": {"imagePullSecrets": ["kamiwaza-pull"]},
        "core": {
            "inferenceResources": {
                "gpuRegistry": "registry.kamiwaza.svc:5000",
                "cpuRegistry": "registry.kamiwaza.svc:5000",
                "gpuRegistryInsecure": True,
                "cpuRegistryInsecure": True,
                "gpuStagingImage": "ghcr.io/kamiwaza-ai/model-fetch:1.0",
                "cpuStagingImage": "ghcr.io/kamiwaza-ai/model-fetch:1.0",
                # Left to their default (the bases' values name one).
                "gpuRegistryCredentialsSecret": "",
                "cpuRegistryCredentialsSecret": "",
            }
        },
    }
    settings = webhook_environment(rendered(merged(values, seed), TENANT))
    assert settings["TMI_GPU_REGISTRY_CREDENTIALS_SECRET"] == "kamiwaza-pull"
    assert settings["TMI_CPU_REGISTRY_CREDENTIALS_SECRET"] == "kamiwaza-pull"
    only = merged(seed, {"global": {"openshift": {"serviceAccountImagePullSecretsOnly": True}}})
    settings = webhook_environment(rendered(merged(values, only), TENANT))
    assert "TMI_GPU_REGISTRY_CREDENTIALS_SECRET" not in settings
    explicit = merged(only, {"core": {"inferenceResources": {"gpuRegistryCredentialsSecret": "m"}}})
    settings = webhook_environment(rendered(merged(values, explicit), TENANT))
    assert settings["TMI_GPU_REGISTRY_CREDENTIALS_SECRET"] == "m"


def test_pod_monitors_scrape_each_servers_metrics_port(values: dict[str, Any]) -> None:
    change = {"monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
    for part, servers in (
        (TENANT, {"tmi-webhook": "metrics"}),
        (OWNER, {"tmi-extender": "metrics", "tmi-allocation-controller": "http"}),
    ):
        docs = rendered(merged(values, change), part)
        monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
        assert set(monitors) == set(servers)
        deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
        for name, port in servers.items():
            monitor = monitors[name]
            assert monitor["metadata"]["labels"]["release"] == "prom"
            assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": name}
            (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
            assert endpoint["path"] == "/metrics"
            # The port names one the server's container declares.
            containers = deployments[name]["spec"]["template"]["spec"]["containers"]
            assert port in {p["name"] for c in containers for p in c.get("ports") or []}
            assert endpoint["port"] == port
    assert not [d for d in rendered(values, OWNER) if d["kind"] == "PodMonitor"]
