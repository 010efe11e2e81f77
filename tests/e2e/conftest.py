"""Fixtures for e2e tests against the real local Kubernetes control plane.

One control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK)
serves the whole test session, its tmi servers local processes the tests can kill or pause
(``localcluster.install.stack``); a second one (``node_plane``) carries the session's one real node
(``real_node``), where ``test_real_node.py`` still runs local-process servers and
``test_real_node_chart.py`` runs the chart's own Deployments as Pods. Each test gets fresh
namespaces rather than reusing deleted ones, since a namespace takes a while to finish
terminating. Missing binaries fail the tests with instructions instead of skipping them, so CI
cannot silently pass without e2e coverage; set TMI_SKIP_E2E=1 to skip them deliberately. When
a test fails, every component log is copied to .artifacts/<test-name>/.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import IO

import pytest

from kits.nodekit import node_images
from localcluster import (
    ApiError,
    BinariesMissingError,
    ControlPlane,
    FakeNode,
    Kube,
    bin_dir,
    create_fake_nodes,
    delete_fake_nodes,
)
from localcluster.nodes.machine_lock import hold_machine, release_machine
from localcluster.nodes.podnet import PodNetwork
from localcluster.nodes.realnode import RealNode

ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts"


def _artifact_dir(name: str) -> Path:
    return ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:150]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("TMI_SKIP_E2E") != "1":
        return
    skip = pytest.mark.skip(reason="TMI_SKIP_E2E=1")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


# The machine's real-node lock, once a test of this session needed the node (held to the end).
_MACHINE: list[IO[str]] = []


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    # The first test that needs the real node waits its turn for the machine here, outside the
    # test's timeout (which starts inside this hook): another run on the machine may hold the
    # node for as long as a whole run.
    if "node_plane" in getattr(item, "fixturenames", ()) and not _MACHINE:
        held = hold_machine()
        if held is not None:
            _MACHINE.append(held)
    return (yield)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    while _MACHINE:
        release_machine(_MACHINE.pop())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # Keep each phase's report on the item so fixtures can tell whether the test failed.
    report: pytest.TestReport = yield
    setattr(item, f"_tmi_report_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The session's control plane with the default scheduler and KWOK running."""
    missing: str | None = None
    try:
        bins = bin_dir()
    except BinariesMissingError as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    workdir = tmp_path_factory.mktemp("k8s")
    try:
        plane = ControlPlane.start(workdir, bins)
    except Exception:
        logs = workdir / "logs"
        if logs.is_dir():
            shutil.copytree(logs, _artifact_dir("control-plane-start"), dirs_exist_ok=True)
        raise
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def node_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A second control plane, for the real node: its API server serves Pods as a real
    cluster's does (ServiceAccount tokens, the Node authorizer, Pods reaching it through the
    ``kubernetes`` Service). Separate from ``control_plane`` so the KWOK tests keep theirs."""
    workdir = tmp_path_factory.mktemp("k8s-node")
    # The Pod network's bridge, like the node's device plugins, is the machine's: the hook
    # around the first test that needs this plane has taken the machine (`_MACHINE`).
    try:
        plane = ControlPlane.start(workdir, bin_dir(), pod_network=PodNetwork())
    except Exception:
        if (workdir / "logs").is_dir():
            shutil.copytree(workdir / "logs", _artifact_dir("node-plane-start"), dirs_exist_ok=True)
        raise
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def real_node(node_plane: ControlPlane) -> Iterator[RealNode]:
    """The session's one real node (kubelet, containerd, runc, kube-proxy, simulated GPUs),
    with the tmi image and the kube-scheduler image imported."""
    try:
        node = RealNode.start(node_plane, images=node_images(node_plane.workdir / "images"))
    except Exception:
        node_plane.copy_logs(_artifact_dir("real-node-start"))
        raise
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(autouse=True)
def _logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    failed = any(
        getattr(getattr(request.node, f"_tmi_report_{when}", None), "failed", False)
        for when in ("setup", "call")
    )
    if not failed:
        return
    for fixture in ("control_plane", "node_plane"):
        if fixture in request.fixturenames:
            plane: ControlPlane = request.getfixturevalue(fixture)
            plane.copy_logs(_artifact_dir(request.node.nodeid))


@pytest.fixture
def kube(control_plane: ControlPlane) -> Kube:
    """Raw-JSON client as cluster admin (system:masters)."""
    return control_plane.kube("admin")


def _delete_pods(kube: Kube, namespace: str) -> None:
    # Pods on fake nodes hold fake GPUs; free them for later tests. Grace 0 because
    # no kubelet confirms termination (KWOK's pod-delete stage would, more slowly).
    with contextlib.suppress(ApiError):
        kube.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods",
            query={"gracePeriodSeconds": 0},
        )


@pytest.fixture
def new_namespace(control_plane: ControlPlane) -> Iterator[Callable[[str], str]]:
    """Factory for fresh namespaces; their pods are deleted after the test."""
    created: list[str] = []

    def make(prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        control_plane.create_namespace(name)
        created.append(name)
        return name

    yield make
    for name in created:
        _delete_pods(control_plane.kube("admin"), name)


@pytest.fixture
def namespace(new_namespace: Callable[[str], str], request: pytest.FixtureRequest) -> str:
    """A fresh namespace named after the test."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    return new_namespace(stem or "t")


@pytest.fixture
def fake_nodes(control_plane: ControlPlane) -> Iterator[Callable[..., list[dict[str, object]]]]:
    """Factory that creates FakeNodes (waiting for KWOK) and deletes them afterwards."""
    names: list[str] = []
    kube = control_plane.kube("admin")

    def make(*nodes: FakeNode) -> list[dict[str, object]]:
        names.extend(n.name for n in nodes)
        return create_fake_nodes(kube, nodes)

    yield make
    delete_fake_nodes(kube, names)
