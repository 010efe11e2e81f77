"""The extender's settings: flags, their TMI_* variables, defaults and refusals."""

from __future__ import annotations

import pytest

from extender.__main__ import main
from extender.config import settings_from_args
from serving.settings import ConfigError

KEY = "A" * 43 + "="
BASE = {
    "TMI_NAMESPACE": "kamiwaza",
    "TMI_OWNER_PUBLIC_KEY": KEY,
    "TMI_CLUSTER_BINDING_ID": "demo-cluster",
    "TMI_TLS_CERT": "/tls/tls.crt",
    "TMI_TLS_KEY": "/tls/tls.key",
}


def test_environment_gives_every_setting() -> None:
    settings = settings_from_args(
        [],
        {**BASE, "TMI_POD_NAMESPACES": "a, b", "TMI_PORT": "9443", "TMI_ROLLBACK_RECORD": "kw"},
    )
    assert settings.namespace == "kamiwaza"
    assert settings.rollback_record == "kw"
    assert settings.policy.owner_public_keys == (KEY,)
    assert settings.policy.cluster_binding_id == "demo-cluster"
    assert settings.policy.bundle_configmap == "kamiwaza-inference-profiles"
    assert settings.pod_namespaces == ("a", "b")
    assert settings.port == 9443 and settings.plain_http is False
    assert settings.cert_file == "/tls/tls.crt"


def test_flags_win_over_variables_and_pods_default_to_the_tenant_namespace() -> None:
    settings = settings_from_args(["--namespace", "tenant-a", "--port", "8444"], BASE)
    assert settings.namespace == "tenant-a"
    assert settings.pod_namespaces == ("tenant-a",)
    # Without a record named, only the configured floor holds.
    assert settings.rollback_record is None
    assert settings.port == 8444


def test_plain_http_needs_no_certificate() -> None:
    env = {k: v for k, v in BASE.items() if not k.startswith("TMI_TLS")}
    assert settings_from_args(["--plain-http"], env).plain_http is True
    with pytest.raises(ConfigError, match="--cert and --key"):
        settings_from_args([], env)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"TMI_NAMESPACE": ""}, "--namespace"),
        ({"TMI_OWNER_PUBLIC_KEY": ""}, "--owner-public-key"),
        ({"TMI_CLUSTER_BINDING_ID": ""}, "--cluster-binding-id"),
        ({"TMI_POD_NAMESPACES": "*,kamiwaza"}, "cannot be combined"),
        ({"TMI_PORT": "0"}, "outside 1..65535"),
        ({"TMI_RESYNC_SECONDS": "5"}, "outside 30..86400"),
        ({"TMI_LOG_LEVEL": "loud"}, "LOUD"),
        ({"TMI_PLAIN_HTTP": "maybe"}, "not true or false"),
    ],
)
def test_unusable_settings_are_refused(change: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        settings_from_args([], {**BASE, **change})


def test_main_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("TMI_") or name in ("POD_NAMESPACE", "KUBECONFIG"):
            monkeypatch.delenv(name)
    assert main(["--namespace", "kamiwaza"]) == 2
    assert "error: --owner-public-key" in capsys.readouterr().err
    code = main(
        [
            "--namespace=kamiwaza",
            f"--owner-public-key={KEY}",
            "--cluster-binding-id=c",
            "--cert=/nonexistent.crt",
            "--key=/nonexistent.key",
        ]
    )
    assert code == 2
    assert "cannot read the certificate or key" in capsys.readouterr().err
