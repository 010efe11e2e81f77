"""The informers that keep a `policy_io.feed.PolicyFeed` current, the same in every server.

The webhook, the extender and the controller read the same ConfigMaps the same way: the pinned
profile and each configured recipe catalog by `metadata.name`, which lets the Role name the
ConfigMaps it may read (`resourceNames`) rather than every ConfigMap in the namespace; and,
following revisions, every ConfigMap labelled `kamiwaza.ai/inference-profile=true`. Each hands
the feed a watch event as one ConfigMap (None once deleted), a complete list whole once the list
is complete, and a list or watch the API server refuses to this server's Role as the refusal
(`serving.kube.not_permitted`). Kept here, once, so the servers cannot drift in what they select,
how they key it or how they take a refusal; each server still makes the `Informer` itself
(`NewInformer`), with its own resync, backoff and error handling.

What the informers keep is set here too, since the labelled ConfigMaps are the tenant's to write
(`policy_io.caps`): each signed profile ConfigMap is judged as it arrives and kept as its
identity alone, listed a few at a time so a list of large ones is never held whole; the pinned
profile is kept as what the verifier reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from inference_policy.base.pod_view import ObjectView
from policy_io import caps
from policy_io.feed import FeedChange, PolicyFeed
from policy_io.state import PROFILE_SELECTOR
from serving.informer import JSON, Collection, Delta, Informer
from serving.kube import not_permitted

NewInformer = Callable[
    [Collection, Callable[[Delta], None], Callable[[Informer], None], Callable[[Exception], None]],
    Informer,
]
"""Makes a server's informer: its collection, then `changed`, `listed` and `failed` handlers."""
Notify = Callable[[FeedChange], None]
Read = Callable[[Mapping[str, Any] | None, str | None], FeedChange]
# Labelled ConfigMaps listed per page: each may be near the API server's 1 MiB, and a page is
# decoded whole before its items are judged and let go.
REVISIONS_PAGE = 4


def _ignore(change: FeedChange) -> None:
    return None


def _name(configmap: JSON) -> str:
    return str(ObjectView(configmap).name)


def feed_informers(feed: PolicyFeed, new: NewInformer, notify: Notify = _ignore) -> list[Informer]:
    """The informers `feed` reads (none when it reads nothing). `notify` hears what each
    event, list or refusal changed, after the feed has taken it."""
    namespace = feed.settings.namespace
    informers: list[Informer] = []
    if feed.follows:
        informers.append(_revisions(feed, namespace, new, notify))
    if feed.pinned is not None:
        pinned = _by_name(feed.pinned, namespace, feed.profile_read, new, notify)
        limit = feed.settings.max_revision_bytes
        pinned.transform = partial(caps.readable, max_bytes=limit)
        informers.append(pinned)
    for capability, name in feed.catalog_names.items():
        read = partial(feed.catalog_read, capability)
        informers.append(_by_name(name, namespace, read, new, notify))
    return informers


def _by_name(name: str, namespace: str, read: Read, new: NewInformer, notify: Notify) -> Informer:
    def changed(delta: Delta) -> None:
        # What a list found is read once the list is complete (`listed`).
        if not delta.listed:
            notify(read(None if delta.type == "DELETED" else delta.object, None))

    def listed(informer: Informer) -> None:
        # Re-reading a revision already read costs the feed a lookup.
        notify(read(informer.store.get(name), None))

    def failed(exc: Exception) -> None:
        why = not_permitted(exc)
        if why is not None:
            # The Role does not name this ConfigMap (a new revision's name, say).
            notify(read(None, why))

    collection = Collection(
        "configmaps", "ConfigMap", namespace, field_selector=f"metadata.name={name}"
    )
    return new(collection, changed, listed, failed)


def _revisions(feed: PolicyFeed, namespace: str, new: NewInformer, notify: Notify) -> Informer:
    """Every signed profile ConfigMap of the namespace, by label."""

    def changed(delta: Delta) -> None:
        if not delta.listed:
            configmap = None if delta.type == "DELETED" else delta.object
            notify(feed.revision_changed(_name(delta.object), configmap))

    def listed(informer: Informer) -> None:
        notify(feed.revisions_listed({_name(o): o for o in informer.store.values()}))

    def failed(exc: Exception) -> None:
        why = not_permitted(exc)
        if why is not None:
            notify(feed.revisions_refused(why))

    def kept(configmap: JSON) -> JSON:
        state = feed.state
        return state.followed.take(configmap, state.policy(), state.trust_error)

    collection = Collection("configmaps", "ConfigMap", namespace, label_selector=PROFILE_SELECTOR)
    informer = new(collection, changed, listed, failed)
    informer.transform, informer.transform_gone = kept, caps.slim
    informer.page_size = min(informer.page_size, REVISIONS_PAGE)
    return informer


__all__ = ["REVISIONS_PAGE", "NewInformer", "Notify", "feed_informers"]
