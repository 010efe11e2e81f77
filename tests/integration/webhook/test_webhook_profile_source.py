"""KubernetesSource against a fake API server: list, watch, revisions, deletion, errors, 410.

The informer and its aiohttp client run for real; only the server is fake. Each test waits for
the store to reach a state (`kits.polling`, naming what it waits for) rather than sleeping a
fixed time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from inference_policy.planning.recipe_inputs import CatalogUnavailable
from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME, Reason
from kits import polling
from kits.fakeapi import FakeApiServer
from kits.profilekit import NAMESPACE, NOW, Owner, request
from serving.apiserver import from_kubeconfig
from serving.kube import ClientConfigError
from webhook.profile_source import KubernetesSource, PolicyStore


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer(NAMESPACE)
    await server.start()
    yield server
    await server.stop()


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Until `check` holds, up to `timeout`; the timeout names the check's source line."""
    code = check.__code__
    what = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno} to hold"
    await polling.eventually(check, what=what, timeout=timeout)


def _version(store: PolicyStore) -> int:
    return store.state.profile.version if store.state.profile is not None else 0


async def _source(
    api: FakeApiServer, tmp_path: Path, store: PolicyStore, resync: int = 30
) -> KubernetesSource:
    client = from_kubeconfig(str(api.kubeconfig(tmp_path / "kubeconfig")))
    source = KubernetesSource(NAMESPACE, client, resync, backoff_seconds=0.05)
    await source.start(store)
    return source


async def test_profile_is_read_watched_and_verified_once_per_revision(
    api: FakeApiServer, tmp_path: Path
) -> None:
    owner = Owner()
    api.put(owner.sign())
    store = PolicyStore(owner.settings(), clock=lambda: NOW)
    source = await _source(api, tmp_path, store)
    try:
        await eventually(lambda: store.ready and store.state.profile is not None)
        assert store.state.verifications == 1
        assert store.decide(request()).allowed

        # A new revision arrives through the watch and is verified once.
        envelope = owner.envelope(version=2)
        api.put(owner.sign(envelope))
        await eventually(
            lambda: store.state.profile is not None and store.state.profile.version == 2
        )
        assert store.state.verifications == 2

        # Deleted: refused with the seed's arrival reason, and still ready.
        api.delete(DEFAULT_CONFIGMAP_NAME)
        await eventually(lambda: store.state.profile is None)
        refusal = store.state.profile_refusal
        assert refusal is not None and refusal.reason is Reason.ARRIVAL
        assert store.ready
        decision = store.decide(request())
        assert decision.status == 503
        assert decision.detail.endswith("bundle did not arrive from the configured ConfigMap")
    finally:
        await source.stop()


async def test_resync_relists_without_verifying_again(api: FakeApiServer, tmp_path: Path) -> None:
    owner = Owner()
    api.put(owner.sign())
    store = PolicyStore(owner.settings(), clock=lambda: NOW)
    source = await _source(api, tmp_path, store, resync=1)
    try:
        await eventually(lambda: api.lists >= 3, timeout=15)
        assert store.state.verifications == 1
    finally:
        await source.stop()


async def test_missing_configmap_is_ready_and_refused(api: FakeApiServer, tmp_path: Path) -> None:
    owner = Owner()
    store = PolicyStore(owner.settings(), clock=lambda: NOW)
    source = await _source(api, tmp_path, store)
    try:
        await eventually(lambda: store.ready)
        assert store.decide(request()).detail == (
            "owner profile bundle: invalid inference profile authorization: bundle did not "
            "arrive from the configured ConfigMap"
        )
        api.put(owner.sign())
        await eventually(lambda: store.decide(request()).allowed)
    finally:
        await source.stop()


async def test_errors_back_off_and_recover(api: FakeApiServer, tmp_path: Path) -> None:
    owner = Owner()
    api.put(owner.sign())
    api.fail_next = 3
    store = PolicyStore(owner.settings(), clock=lambda: NOW)
    source = await _source(api, tmp_path, store)
    try:
        await eventually(lambda: store.ready and store.state.profile is not None)
        assert source.errors >= 3
    finally:
        await source.stop()


async def test_watch_expiry_410_relists(api: FakeApiServer, tmp_path: Path) -> None:
    owner = Owner()
    api.put(owner.sign())
    api.gone_next = 1
    store = PolicyStore(owner.settings(), clock=lambda: NOW)
    source = await _source(api, tmp_path, store)
    try:
        await eventually(lambda: api.lists >= 2 and api.watches >= 2)
        api.put(owner.sign(owner.envelope(version=3)))
        await eventually(
            lambda: store.state.profile is not None and store.state.profile.version == 3
        )
    finally:
        await source.stop()


async def test_recipe_catalogs_are_watched_too(api: FakeApiServer, tmp_path: Path) -> None:
    from inference_policy.planning.recipes import render_catalog

    owner = Owner()
    api.put(owner.sign())
    rendered = render_catalog(
        {"schemaVersion": 1, "capability": "cpu", "recipes": []}, NAMESPACE, "cpu"
    )
    name = rendered.configmap["metadata"]["name"]
    store = PolicyStore(owner.settings(cpu_recipe_catalog_configmap=name), clock=lambda: NOW)
    source = await _source(api, tmp_path, store)
    try:
        await eventually(lambda: store.ready)
        assert store.decide(request()).status == 503
        api.put(rendered.configmap)
        await eventually(lambda: not isinstance(store.state.cpu_recipes, CatalogUnavailable))
        assert store.decide(request()).allowed
    finally:
        await source.stop()


async def test_a_configmap_the_role_does_not_name_did_not_arrive(
    api: FakeApiServer, tmp_path: Path
) -> None:
    owner = Owner()
    api.put(owner.sign())
    api.forbidden.add(DEFAULT_CONFIGMAP_NAME)
    store = PolicyStore(owner.settings(), clock=lambda: NOW)
    source = await _source(api, tmp_path, store)
    try:
        await eventually(lambda: store.ready)
        decision = store.decide(request())
        assert decision.status == 503
        assert decision.detail.endswith("bundle did not arrive from the configured ConfigMap")
        refusal = store.state.profile_refusal
        assert refusal is not None and "may not be read (HTTP 403" in refusal.check
        api.forbidden.clear()  # the Role is fixed
        await eventually(lambda: store.decide(request()).allowed)
    finally:
        await source.stop()


def test_unusable_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError, match="cannot load the Kubernetes client"):
        from_kubeconfig(str(tmp_path / "missing"))


async def test_following_takes_the_newest_signed_revision_as_it_is_published(
    tmp_path: Path,
) -> None:
    api = FakeApiServer(NAMESPACE, by_label=True)
    await api.start()
    owner = Owner()
    api.put(owner.sign(name="kamiwaza-inference-profiles-r1"))
    store = PolicyStore(owner.settings(follow_revisions=True), clock=lambda: NOW)
    source = await _source(api, tmp_path, store)
    try:
        await eventually(lambda: store.ready and _version(store) == 1)
        assert store.decide(request()).allowed
        # Revision 2 published under a name no setting and no Role names: followed by itself.
        api.put(owner.sign(owner.envelope(version=2), name="kamiwaza-inference-profiles-r2"))
        await eventually(lambda: _version(store) == 2)
        plan = store.decide(request()).plan
        assert plan is not None and plan.bundle is not None and plan.bundle.version == 2
        # Taken back: the newest left is followed again.
        api.delete("kamiwaza-inference-profiles-r2")
        await eventually(lambda: _version(store) == 1)
        assert store.state.verifications == 2
    finally:
        await source.stop()
        await api.stop()


def test_following_revisions_still_reads_the_pinned_recipe_catalogs() -> None:
    # Following replaces only how the profile is found: a configured catalog is still read by
    # name, and refuses (503) until it has been.
    owner = Owner()
    settings = owner.settings(follow_revisions=True, gpu_recipe_catalog_configmap="gpu-recipes")
    store = PolicyStore(settings, clock=lambda: NOW)
    assert store.follows and store.names == ["gpu-recipes"]
    assert isinstance(store.feed.snapshot.gpu_recipes, CatalogUnavailable)
    store.feed.revisions_listed({"r1": owner.sign(name="r1")})
    store.feed.read("gpu-recipes", None)
    decision = store.decide(request())
    assert decision.status == 503 and decision.detail.startswith("recipe catalog: ")


async def test_following_revisions_the_role_may_not_list_did_not_arrive(tmp_path: Path) -> None:
    api = FakeApiServer(NAMESPACE, by_label=True)
    await api.start()
    owner = Owner()
    api.put(owner.sign(name="kamiwaza-inference-profiles-r1"))
    api.forbid_label_lists = True
    store = PolicyStore(owner.settings(follow_revisions=True), clock=lambda: NOW)
    source = await _source(api, tmp_path, store)
    try:
        await eventually(lambda: store.ready)
        assert store.decide(request()).status == 503
        refusal = store.state.profile_refusal
        assert refusal is not None
        assert refusal.check.startswith("ConfigMaps labelled kamiwaza.ai/inference-profile=true")
        assert "may not be read (HTTP 403; check the Role)" in refusal.check
        api.forbid_label_lists = False  # the Role is fixed
        await eventually(lambda: store.decide(request()).allowed)
    finally:
        await source.stop()
        await api.stop()
