"""The image, proven without a registry: assembled as an OCI layout and run from its files.

``localcluster.install.image`` builds the image's two layers the way the Dockerfile does (Python
3.11 from the Debian bookworm packages, then /opt/tmi from uv.lock and the packages the Dockerfile
copies), ``tmi-oci`` (go-containerregistry) writes them as an OCI image layout, and the layout's
layers are unpacked into a root filesystem. The tests check the layout and what is (and is not)
inside, then run each server's entry point from that filesystem as the image's user, and the
webhook as a server against the real API server until it reports ready.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import yaml

from kits.profilekit import CLUSTER, Owner
from kits.stackkit import dated
from localcluster import ControlPlane
from localcluster.install.image import USER, Layout
from localcluster.nodes.node_images import tmi_image
from localcluster.plane.controlplane import HOST
from localcluster.plane.process import ManagedProcess, free_port, http_get, http_ok, wait_until
from localcluster.servers.webhook import (
    IDENTITY,
    WebhookSettings,
    apply_webhook_rbac,
    publish_profile,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
SHARE = "opt/tmi/share/tmi"
ENTRY_POINTS = ("tmi", "tmi-webhook", "tmi-extender", "tmi-controller")


@dataclass(frozen=True)
class Built:
    layout: Layout
    digest: str
    rootfs: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    work = tmp_path_factory.mktemp("image")
    image = tmi_image(work)
    layout = Layout.read(image.layout)
    rootfs = layout.unpack(work / "rootfs")
    # The Deployments mount an emptyDir at /tmp (the root filesystem is read-only).
    (rootfs / "tmp").chmod(0o1777)
    return Built(layout, image.digest, rootfs)


def as_image_user(rootfs: Path, *argv: str) -> list[str]:
    """Run ``argv`` inside ``rootfs`` as the image's user (chroot needs root; otherwise a user
    namespace maps the caller to root inside, which is as far as an unprivileged run goes)."""
    if os.geteuid() == 0:
        return ["chroot", f"--userspec={USER}", str(rootfs), *argv]
    return ["unshare", "--map-root-user", f"--root={rootfs}", *argv]


def test_the_layout_is_one_oci_image_for_the_non_root_user(built: Built) -> None:
    layout = built.layout
    assert json.loads((layout.path / "oci-layout").read_text())["imageLayoutVersion"] == "1.0.0"
    assert layout.manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    config = layout.config["config"]
    assert isinstance(config, dict)
    assert config["User"] == USER
    assert any(str(e).startswith("PATH=/opt/tmi/bin:") for e in config["Env"])
    assert len(layout.layers) == 2
    assert built.digest.startswith("sha256:")


def test_the_image_holds_the_lock_file_and_its_sbom_and_no_harness(built: Built) -> None:
    names = built.layout.names()
    assert f"{SHARE}/uv.lock" in names and f"{SHARE}/sbom.cdx.json" in names
    assert (built.rootfs / SHARE / "uv.lock").read_bytes() == (ROOT / "uv.lock").read_bytes()
    sbom = json.loads((built.rootfs / SHARE / "sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    assert {"aiohttp", "kubernetes", "cryptography"} <= {c["name"] for c in sbom["components"]}
    for harness in ("localcluster", "kits", "tests", "bench"):
        assert not [n for n in names if f"site-packages/{harness}/" in n or n.startswith(harness)]
    packages = {n.split("site-packages/")[1].split("/")[0] for n in names if "site-packages/" in n}
    assert {"webhook", "extender", "allocation_controller", "inference_policy"} <= packages


def test_the_image_runs_the_packages_source(built: Built) -> None:
    modules = ["inference_policy.planning.planner", "webhook.admission", "extender.view"]
    probe = (
        "import importlib, sys; print(*(importlib.import_module(m).__file__ for m in sys.argv[1:]))"
    )
    done = subprocess.run(
        as_image_user(built.rootfs, "/opt/tmi/bin/python", "-c", probe, *modules),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    files = done.stdout.split()
    assert len(files) == len(modules)
    for module, path in zip(modules, files, strict=True):
        assert path.startswith("/opt/tmi/") and path.endswith(".py"), path
        shipped = (built.rootfs / path.lstrip("/")).read_bytes()
        assert shipped == (ROOT / (module.replace(".", "/") + ".py")).read_bytes()


def test_every_entry_point_starts_from_the_image(built: Built) -> None:
    for entry in ENTRY_POINTS:
        done = subprocess.run(
            as_image_user(built.rootfs, f"/opt/tmi/bin/{entry}", "--help"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (entry, done.stderr[-2000:])
        assert "usage" in done.stdout.lower()


@pytest.fixture
def webhook_files(
    control_plane: ControlPlane, built: Built
) -> Iterator[tuple[Path, WebhookSettings]]:
    """The namespace, RBAC, profile, certificate and kubeconfig a webhook in the image needs,
    the files placed where the image's user can read them."""
    owner = Owner()
    namespace = f"tmi-image-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(namespace)
    settings = WebhookSettings(
        owner_public_keys=(owner.public_key,), cluster_binding_id=CLUSTER, namespace=namespace
    )
    apply_webhook_rbac(control_plane, settings)
    profile = owner.sign(dated(owner.envelope(), namespace), name=settings.bundle_configmap)
    publish_profile(control_plane, profile)
    identity = control_plane.service_account_identity(namespace, IDENTITY)
    files = built.rootfs / "run" / "tmi"
    files.mkdir(parents=True, exist_ok=True)
    pair = control_plane.issue_serving_cert(f"image-{namespace}", (HOST,))
    shutil.copy(pair.cert_file, files / "tls.crt")
    shutil.copy(pair.key_file, files / "tls.key")
    token = yaml.safe_load(control_plane.kubeconfig(identity).read_text())["users"][0]["user"]
    (files / "kubeconfig").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {
                            "server": control_plane.server,
                            "certificate-authority-data": base64.b64encode(
                                control_plane.ca.cert_pem()
                            ).decode(),
                        },
                    }
                ],
                "users": [{"name": "webhook", "user": token}],
                "contexts": [{"name": "c", "context": {"cluster": "local", "user": "webhook"}}],
                "current-context": "c",
            }
        )
    )
    if os.geteuid() == 0:
        for path in (files, *files.iterdir()):
            os.chown(path, 65532, 65532)
    try:
        yield files, settings
    finally:
        shutil.rmtree(files, ignore_errors=True)


def test_the_webhook_serves_from_the_image_against_the_api_server(
    control_plane: ControlPlane, built: Built, webhook_files: tuple[Path, WebhookSettings]
) -> None:
    _, settings = webhook_files
    port = free_port()
    argv = as_image_user(
        built.rootfs,
        "/opt/tmi/bin/tmi-webhook",
        "--cert=/run/tmi/tls.crt",
        "--key=/run/tmi/tls.key",
        f"--host={HOST}",
        f"--port={port}",
        "--kubeconfig=/run/tmi/kubeconfig",
        f"--namespace={settings.namespace}",
        "--enabled",
        f"--bundle-configmap={settings.bundle_configmap}",
        f"--owner-public-key={settings.owner_public_keys[0]}",
        f"--cluster-binding-id={settings.cluster_binding_id}",
        "--drain-seconds=0",
    )
    context = ssl.create_default_context(cafile=str(control_plane.ca_file))
    process = ManagedProcess(
        "tmi-webhook-image", argv, control_plane.logs_dir / "tmi-webhook-image.log", cwd=ROOT
    )
    try:
        wait_until(
            partial(http_ok, f"https://{HOST}:{port}/readyz", context),
            timeout=60,
            what="the webhook in the image /readyz",
            proc=process,
        )
        metrics = http_get(f"https://{HOST}:{port}/metrics", context)
        assert "tmi_webhook_profile_valid 1.0" in metrics
    finally:
        process.stop()
