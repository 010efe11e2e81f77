"""Golden tests of the owner scheduler's configuration and `tmi render-scheduler-config`."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from inference_policy.placing.schedconfig import SchedulerConfigError, render_scheduler_config
from kits.profilekit import CLUSTER, NAMESPACE, NOW_TEXT, Owner
from tmi_cli.main import main

CA = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
URL = "https://tmi-extender.kamiwaza-scheduling.svc:443"

GOLDEN: dict[str, Any] = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "leaderElection": {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceName": "kamiwaza-inference-scheduler",
        "resourceNamespace": "kamiwaza-scheduling",
    },
    "profiles": [
        {
            "schedulerName": "kamiwaza-inference-scheduler",
            "pluginConfig": [
                {
                    "name": "NodeResourcesFit",
                    "args": {
                        "scoringStrategy": {
                            "type": "MostAllocated",
                            "resources": [
                                {"name": "cpu", "weight": 1},
                                {"name": "memory", "weight": 1},
                            ],
                        }
                    },
                }
            ],
        }
    ],
    "extenders": [
        {
            "urlPrefix": URL,
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "weight": 5,
            "enableHTTPS": True,
            "httpTimeout": "5s",
            "nodeCacheCapable": True,
            "ignorable": False,
            "tlsConfig": {"caData": base64.b64encode(CA).decode()},
        }
    ],
}


def test_the_extender_is_consulted_for_every_pod_of_the_scheduler() -> None:
    """No managedResources: kube-scheduler then calls the extender for CPU engine Pods too,
    which is how they are steered off GPU nodes."""
    rendered = render_scheduler_config(extender_url=URL, ca_pem=CA)
    assert "managedResources" not in rendered["extenders"][0]


def test_the_configuration_renders_the_golden_one() -> None:
    assert render_scheduler_config(extender_url=URL + "/", ca_pem=CA) == GOLDEN


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"extender_url": "ftp://x"}, "is not an http(s) URL"),
        ({"extender_url": URL}, "needs the CA"),
        ({"extender_url": URL, "ca_pem": b"junk"}, "no PEM certificate"),
        ({"extender_url": URL, "ca_pem": CA, "weight": 0}, "weight 0"),
        ({"extender_url": URL, "ca_pem": CA, "http_timeout": "5"}, "not a duration"),
        ({"extender_url": URL, "ca_pem": CA, "scheduler_name": "Bad_Name"}, "not a DNS label"),
        ({"extender_url": URL, "ca_pem": CA, "server_name": "Bad Name"}, "must be a DNS name"),
        ({"extender_url": "http://10.96.0.9:80", "server_name": "x.svc"}, "needs an https URL"),
    ],
)
def test_unusable_inputs_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SchedulerConfigError) as caught:
        render_scheduler_config(**kwargs)
    assert message in str(caught.value)


def test_plain_http_needs_no_ca() -> None:
    rendered = render_scheduler_config(extender_url="http://127.0.0.1:18888")
    extender = rendered["extenders"][0]
    assert extender["enableHTTPS"] is False and "tlsConfig" not in extender


def test_a_server_name_is_checked_when_the_url_names_an_address() -> None:
    rendered = render_scheduler_config(
        extender_url="https://10.96.0.17:443",
        ca_pem=CA,
        server_name="tmi-extender.kamiwaza-scheduling.svc",
    )
    tls = rendered["extenders"][0]["tlsConfig"]
    assert tls["serverName"] == "tmi-extender.kamiwaza-scheduling.svc" and tls["caData"]


def test_the_cli_passes_the_server_name(
    files: tuple[Owner, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    owner, bundle, ca = files
    status = main(
        _args(owner, bundle, "--ca-file", str(ca), "--extender-server-name", "ext.ns.svc")
    )
    assert status == 0
    tls = json.loads(capsys.readouterr().out)["extenders"][0]["tlsConfig"]
    assert tls["serverName"] == "ext.ns.svc"


@pytest.fixture
def files(tmp_path: Path) -> tuple[Owner, Path, Path]:
    owner = Owner()
    bundle = tmp_path / "profile.json"
    bundle.write_text(json.dumps(owner.sign()))
    ca = tmp_path / "ca.pem"
    ca.write_bytes(CA)
    return owner, bundle, ca


def _args(owner: Owner, bundle: Path, *extra: str) -> list[str]:
    return [
        "render-scheduler-config",
        "--bundle",
        str(bundle),
        "--owner-public-key",
        owner.public_key,
        "--cluster-binding-id",
        CLUSTER,
        "--namespace",
        NAMESPACE,
        "--extender-url",
        URL,
        "--now",
        NOW_TEXT,
        *extra,
    ]


def test_cli_prints_the_golden_json(
    files: tuple[Owner, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    owner, bundle, ca = files
    assert main(_args(owner, bundle, "--ca-file", str(ca))) == 0
    assert json.loads(capsys.readouterr().out) == GOLDEN


def test_cli_prints_yaml(
    files: tuple[Owner, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    owner, bundle, ca = files
    assert main(_args(owner, bundle, "--ca-file", str(ca), "--format", "yaml")) == 0
    out = capsys.readouterr().out
    assert out.startswith("apiVersion: kubescheduler.config.k8s.io/v1\n")
    assert yaml.safe_load(out) == GOLDEN


def test_cli_refuses_https_without_a_ca(
    files: tuple[Owner, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    owner, bundle, _ = files
    assert main(_args(owner, bundle)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: an https extender URL needs the CA")


def test_cli_refuses_a_profile_the_servers_would_refuse(
    files: tuple[Owner, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, bundle, ca = files
    stranger = Owner()
    assert main(_args(stranger, bundle, "--ca-file", str(ca))) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "error: invalid inference profile authorization: bundle is signed by a key this "
        "cluster does not trust"
    )


def test_cli_renders_without_a_profile_since_nothing_in_it_depends_on_one(
    files: tuple[Owner, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, ca = files
    argv = ["render-scheduler-config", "--extender-url", URL, "--ca-file", str(ca), "-o", "yaml"]
    assert main(argv) == 0
    assert yaml.safe_load(capsys.readouterr().out) == GOLDEN


def test_cli_names_an_empty_ca_file_as_empty_not_missing(
    files: tuple[Owner, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    argv = ["render-scheduler-config", "--extender-url", URL, "--ca-file", str(empty)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: the CA file is empty; it must hold the PEM certificate ({empty})\n"
    )


def test_cli_verifies_a_profile_only_with_the_flags_to_verify_it(
    files: tuple[Owner, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, bundle, ca = files
    argv = ["render-scheduler-config", "--extender-url", URL, "--ca-file", str(ca)]
    assert main([*argv, "--bundle", str(bundle)]) == 2
    assert "--bundle needs --owner-public-key, --cluster-binding-id and --namespace" in (
        capsys.readouterr().err
    )
