"""Follow mode's one informer: every signed profile ConfigMap of a namespace, by label.

With `--follow-profile-revisions` the webhook and the extender read the profile from every
ConfigMap labelled `kamiwaza.ai/inference-profile=true` rather than from one by name, so that
publishing revision N+1 is the only step. Both list and watch the same collection and hand it on
the same way: a watch event as one ConfigMap by name (None once deleted), a complete list as
every ConfigMap by name, which is what `PolicyState.follow` and `PolicyState.follow_list` take.
Kept here, once, so the two servers cannot drift in what they select or how they key it; each
server still builds the `Informer` with its own resync, backoff and error handling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policy_io.state import PROFILE_SELECTOR
from serving.informer import JSON, Collection, Delta, Informer

FollowOne = Callable[[str, Mapping[str, Any] | None], None]
FollowAll = Callable[[Mapping[str, Mapping[str, Any]]], None]


def _name(configmap: JSON) -> str:
    return str((configmap.get("metadata") or {}).get("name"))


@dataclass(frozen=True)
class ProfileRevisionFeed:
    """The signed profile ConfigMaps of `namespace`, and the informer handlers that feed them
    to a server: `one` for each change a watch brings, `every` once each list is complete."""

    namespace: str
    one: FollowOne
    every: FollowAll

    @property
    def collection(self) -> Collection:
        return Collection(
            "configmaps", "ConfigMap", self.namespace, label_selector=PROFILE_SELECTOR
        )

    def changed(self, delta: Delta) -> None:
        # What a list found is handed on whole once the list is complete (`listed`).
        if not delta.listed:
            self.one(_name(delta.object), None if delta.type == "DELETED" else delta.object)

    def listed(self, informer: Informer) -> None:
        self.every({_name(o): o for o in informer.store.values()})
