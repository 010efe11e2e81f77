"""docs/first-day.md, followed to the letter: every `sh` block it shows, in order, in one shell,
on the local control plane with its real node, as the owner (the admin kubeconfig) and, where
the document says so, as the namespace installer it sets up.

From `tmi keygen` to a profile drafted from the real H200's recording, signed and verified; the
cluster checked by `tmi doctor` (as the owner and as the installer); both chart parts installed
by `helm install` with only the values the document writes; and `helm test` passing for both.
The document is the test's script, so a step that stops working, or a document that drifts
from the software, fails here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import ApiError, ControlPlane, Kube
from localcluster.nodes.node_images import SCHEDULER_REPOSITORY, TMI_REPOSITORY
from localcluster.nodes.realnode import RealNode
from localcluster.plane.binaries import bin_dir
from localcluster.plane.process import wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "first-day.md"
CAPTURE = ROOT / "tests" / "fixtures" / "gpu" / "h200-1x"
CLUSTER = "first-day"
NAMESPACES = ("kamiwaza", "kamiwaza-scheduling")
# Generous: two helm installs and an upgrade wait for their Deployments on a two-core machine.
SCRIPT_TIMEOUT = 900
NAMESPACE_GONE_TIMEOUT = 240.0


def blocks(text: str) -> list[str]:
    """The document's shell blocks, in order."""
    return re.findall(r"^```sh\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def _script(text: str) -> str:
    steps = [f'echo "== first-day step {i}" >&2\n{block}' for i, block in enumerate(blocks(text))]
    return "set -euo pipefail\n" + "\n".join(steps)


def _environment(plane: ControlPlane, node: RealNode, work: Path) -> dict[str, str]:
    images = {image.repository: image for image in node.images.values()}
    scheduler = images[SCHEDULER_REPOSITORY]
    kubeconfig = work / "owner.kubeconfig"
    shutil.copyfile(plane.kubeconfig("admin"), kubeconfig)
    tools = os.pathsep.join([str(Path(sys.executable).parent), str(bin_dir())])
    return {
        "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(work),
        "XDG_CACHE_HOME": str(work / ".cache"),
        "XDG_CONFIG_HOME": str(work / ".config"),
        "XDG_DATA_HOME": str(work / ".local"),
        "KUBECONFIG": str(kubeconfig),
        "REPO": str(ROOT),
        "CLUSTER_BINDING_ID": CLUSTER,
        "TMI_IMAGE_REPOSITORY": TMI_REPOSITORY,
        "TMI_IMAGE_DIGEST": images[TMI_REPOSITORY].digest,
        "SCHEDULER_IMAGE": f"{SCHEDULER_REPOSITORY}@{scheduler.digest}",
        "CAPTURE_DIR": str(CAPTURE),
        "GPU_NODE": node.name,
        # The local plane serves no cluster DNS to Pods: the document's step for that case.
        "NO_CLUSTER_DNS": "1",
    }


def _absent(admin: Kube, namespace: str) -> bool:
    try:
        admin.get("v1", "Namespace", namespace)
    except ApiError as exc:
        if exc.status == 404:
            return True
        raise
    return False


def _fresh(admin: Kube) -> None:
    """The newcomer's cluster has neither of the document's namespaces: the node's other
    modules, which run first on the same plane, may leave the chart's default owner namespace
    behind, and `kubectl create namespace` in the walk would find it."""
    for namespace in NAMESPACES:
        with contextlib.suppress(ApiError):
            admin.delete("v1", "Namespace", namespace)
    wait_until(
        lambda: all(_absent(admin, namespace) for namespace in NAMESPACES),
        timeout=NAMESPACE_GONE_TIMEOUT,
        what=f"namespaces {', '.join(NAMESPACES)} left by earlier modules deleted",
    )


@pytest.fixture
def walked(
    node_plane: ControlPlane, real_node: RealNode, tmp_path: Path
) -> Iterator[tuple[subprocess.CompletedProcess[str], Path]]:
    admin = node_plane.kube("admin")
    _fresh(admin)
    had_runtime_class = True
    try:
        admin.get("node.k8s.io/v1", "RuntimeClass", "nvidia")
    except ApiError:
        had_runtime_class = False
    env = _environment(node_plane, real_node, tmp_path)
    try:
        done = subprocess.run(
            ["bash", "-c", _script(DOC.read_text())],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT,
            check=False,
        )
        yield done, tmp_path
    finally:
        helm = str(bin_dir() / "helm")
        for release, namespace in (("tmi", "kamiwaza"), ("tmi-owner", "kamiwaza-scheduling")):
            subprocess.run(
                [helm, "uninstall", release, "-n", namespace, "--wait", "--timeout", "2m"],
                env=env,
                capture_output=True,
                check=False,
                timeout=180,
            )
        guard = ROOT / "manifests" / "guard" / "kamiwaza-tenant-pod-guard.yaml"
        kubectl = str(bin_dir() / "kubectl")
        subprocess.run(
            [kubectl, "delete", "--ignore-not-found", "-f", str(guard)],
            env=env,
            capture_output=True,
            check=False,
            timeout=60,
        )
        for namespace in NAMESPACES:
            with contextlib.suppress(ApiError):
                admin.delete("v1", "Namespace", namespace)
        if not had_runtime_class:
            with contextlib.suppress(ApiError):
                admin.delete("node.k8s.io/v1", "RuntimeClass", "nvidia")


def test_the_document_has_every_step_of_the_first_day() -> None:
    script = "\n".join(blocks(DOC.read_text()))
    for step in (
        "tmi keygen",
        "tmi detect --host",
        "tmi draft",
        "tmi sign",
        "tmi verify",
        "tmi doctor",
        "helm install tmi ",
        "helm install tmi-owner ",
        "helm test tmi ",
        "helm test tmi-owner ",
    ):
        assert step in script, step


def test_a_newcomer_following_the_document_sees_helm_test_pass(
    walked: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, work = walked
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert output.count("== first-day step") == len(blocks(DOC.read_text()))

    # The profile was drafted from the recording by the seed's rule, then signed and verified.
    envelope = json.loads((work / "owner-profile-envelope.json").read_text())
    bindings = [b for p in envelope["profiles"] for b in p.get("bindings", [])]
    h200 = [b for b in bindings if b.get("accelerator", {}).get("vendor") == "nvidia"]
    assert [b["capacity"]["usableMemory"] for b in h200] == ["139Gi"], h200
    assert '"verified": true' in done.stdout

    # Both doctors passed (the script stops at a FAIL, which exits 1), and said so line by line.
    assert "FAIL" not in output
    assert output.count("PASS  namespace-pod-security") == 2

    # Both parts' helm test Pods ran and succeeded.
    for pod in ("tmi-webhook-test", "tmi-extender-test"):
        suite = rf"TEST SUITE:\s+{pod}\n(?:.*\n){{0,3}}?Phase:\s+Succeeded"
        assert re.search(suite, output), output[-4000:]
