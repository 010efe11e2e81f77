"""The chart's owner part with `tmi render-dra`'s values: the DRA objects exactly the core's.

The CLI prints `owner.dra.<namespace>` from the verified profile; the chart copies each
DeviceClass's selector and each claim template's spec from it and lists them as the claims
policy's parameters, so nothing about a DRA binding is decided in a template.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import yaml

from chart_tools import generate as chartgen
from chart_tools.render import OWNER, find, part_values, render
from inference_policy.admission.dra_cel import claim_policy_parts
from inference_policy.trust.dra_claims import owner_objects, published_templates
from inference_policy.trust.profile import parse_envelope
from kits.profilekit import Owner, dra_binding, gpu_profile, with_profiles

TENANT_NS = chartgen.TENANT_NAMESPACE
OWNER_NS = chartgen.OWNER_NAMESPACE
KEY = Owner()


def envelope() -> dict[str, Any]:
    bindings = [
        dra_binding("h100-80"),
        dra_binding("h100-nvl", product="NVIDIA H100 NVL", device_memory="94Gi", usable="93Gi"),
    ]
    document = with_profiles(KEY, gpu_profile("dra", "whole-device", bindings))
    document["namespace"] = TENANT_NS
    return document


def cli_values(tmp_path: Any) -> dict[str, Any]:
    """What `tmi render-dra` prints for the signed envelope, read back as YAML."""
    from tmi_cli.main import main

    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps(KEY.sign(envelope())))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(
            [
                "render-dra",
                "--bundle",
                str(bundle),
                "--owner-public-key",
                KEY.public_key,
                "--cluster-binding-id",
                "demo-cluster",
                "--namespace",
                TENANT_NS,
                "--now",
                "2026-11-29T12:00:00Z",
            ]
        )
    assert status == 0
    loaded: dict[str, Any] = yaml.safe_load(out.getvalue())
    return loaded


def test_render_dra_prints_the_cores_objects_for_the_namespace(tmp_path: Any) -> None:
    values = cli_values(tmp_path)
    assert values == {"owner": {"dra": {TENANT_NS: owner_objects(parse_envelope(envelope()))}}}


def test_the_chart_renders_the_dra_objects_and_the_policys_parameters(tmp_path: Any) -> None:
    values = chartgen.base_values()
    values["owner"]["dra"] = cli_values(tmp_path)["owner"]["dra"]
    docs = render(part_values(OWNER, values), namespace=OWNER_NS)
    objects = owner_objects(parse_envelope(envelope()))
    for entry in objects["deviceClasses"]:
        device_class = find(docs, "DeviceClass", entry["name"])
        assert device_class["spec"] == {"selectors": [{"cel": {"expression": entry["selector"]}}]}
    templates = published_templates(parse_envelope(envelope()))
    for template in templates:
        rendered = find(docs, "ResourceClaimTemplate", template.name, TENANT_NS)
        assert rendered["spec"] == {"spec": template.claim_spec()}
    params = find(docs, "TenantAdmission", TENANT_NS)["spec"]
    assert params["deviceClasses"] == [c["name"] for c in objects["deviceClasses"]]
    assert params["claimTemplates"] == [
        {"name": t.name, "deviceClasses": list(t.device_classes), "count": t.count}
        for t in templates
    ]
    claims = find(docs, "ValidatingAdmissionPolicy", "kamiwaza-tmi-claims")["spec"]
    parts = claim_policy_parts()
    assert claims["variables"] == parts["variables"]
    assert claims["validations"] == parts["validations"]
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "kamiwaza-tmi-claims")
    assert binding["spec"]["paramRef"] == {
        "name": "tmi-admission",
        "parameterNotFoundAction": "Deny",
    }
    # The claims policy reads the TenantPolicy in the tenant namespace, with the same lists.
    policy = find(docs, "TenantPolicy", "tmi-admission", TENANT_NS)["spec"]
    assert (policy["deviceClasses"], policy["claimTemplates"]) == (
        params["deviceClasses"],
        params["claimTemplates"],
    )
    admin = find(docs, "ValidatingAdmissionPolicy", "kamiwaza-tmi-admin-access")
    assert admin["spec"]["validations"] == parts["adminAccess"]["validations"]
    # The controller reads claims and slices only where DRA is in use.
    role = find(docs, "Role", "tmi-allocation-controller", TENANT_NS)
    assert {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims"],
        "verbs": ["get"],
    } in (role["rules"])
    cluster_role = find(docs, "ClusterRole", "tmi-allocation-controller-dra")
    assert cluster_role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}
    ]


def test_without_dra_values_the_controller_gets_no_claim_rights() -> None:
    docs = render(part_values(OWNER, chartgen.base_values()), namespace=OWNER_NS)
    role = find(docs, "Role", "tmi-allocation-controller", TENANT_NS)
    assert all("resource.k8s.io" not in rule["apiGroups"] for rule in role["rules"])
    assert not [d for d in docs if d["kind"] in ("DeviceClass", "ResourceClaimTemplate")]
