"""`--tenants`: further tenant namespaces over the first tenant's settings, each refused with
the entry and field named when it cannot be used."""

from __future__ import annotations

import json

import pytest

from extender.config import settings_from_args
from serving.settings import ConfigError

KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
BASE = {
    "TMI_NAMESPACE": "team-a",
    "TMI_OWNER_PUBLIC_KEY": KEY,
    "TMI_CLUSTER_BINDING_ID": "demo-cluster",
    "TMI_ROLLBACK_RECORD": "team-a",
    "TMI_PLAIN_HTTP": "true",
}


def test_each_tenant_takes_the_first_ones_settings_but_what_it_names() -> None:
    other = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc="
    entries = [
        {"namespace": "team-b", "ownerPublicKey": other, "rollbackRecord": "team-b"},
        {"namespace": "team-c", "bundleConfigMap": "c-r3", "minimumBundleVersion": 3},
    ]
    settings = settings_from_args([], {**BASE, "TMI_TENANTS": json.dumps(entries)})
    a, b, c = settings.every_tenant()
    assert (a.namespace, a.rollback_record) == ("team-a", "team-a")
    assert (b.namespace, b.policy.owner_public_keys, b.rollback_record) == (
        "team-b",
        (other,),
        "team-b",
    )
    assert b.policy.cluster_binding_id == "demo-cluster"
    assert (c.policy.bundle_configmap, c.policy.minimum_bundle_version) == ("c-r3", 3)
    assert c.policy.owner_public_keys == (KEY,) and c.rollback_record is None
    # Every tenant's Pods are accounted together unless told otherwise.
    assert settings.pod_namespaces == ("team-a", "team-b", "team-c")


def test_without_tenants_there_is_the_one() -> None:
    settings = settings_from_args([], BASE)
    (only,) = settings.every_tenant()
    assert only.policy == settings.policy and only.rollback_record == "team-a"


@pytest.mark.parametrize(
    ("tenants", "message"),
    [
        ("{}", "must be a JSON array"),
        ("[1", "--tenants"),
        (json.dumps([{"bundleConfigMap": "x"}]), r"--tenants\[0\]\.namespace"),
        (json.dumps([{"namespace": "Team_B"}]), r"--tenants\[0\]\.namespace"),
        (json.dumps([{"namespace": "b", "colour": "red"}]), r"--tenants\[0\]\.colour"),
        (json.dumps([{"namespace": "b", "minimumBundleVersion": "2"}]), "minimumBundleVersion"),
        (json.dumps([{"namespace": "team-a"}]), "'team-a' is given twice"),
    ],
)
def test_unusable_tenants_are_named(tenants: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from_args([], {**BASE, "TMI_TENANTS": tenants})
