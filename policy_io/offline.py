"""The servers' feed, fed from files: what `tmi plan`, `tmi capacity`, `tmi test` and the tests
plan with.

A server's decisions are made from one immutable `PolicySnapshot`, drawn by `policy_io.feed` from
the ConfigMaps its watches read. The owner CLI stands in for those servers, so it must not build
a record of its own: it hands the ConfigMaps it read from files to the same feed, as if a watch
had delivered them, and plans from the snapshot that feed draws. What a server would refuse (a
catalog in another namespace, a profile past the size cap, a key that does not parse) is then
refused the same way, by the same code, and a CLI answer is the answer the servers give.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from inference_policy.base.pod_view import ObjectView
from inference_policy.planning.catalog import EngineCatalog
from inference_policy.planning.recipe_inputs import Capability
from policy_io.feed import PolicyFeed
from policy_io.snapshot import PolicySnapshot
from policy_io.state import PolicySettings

# The name a recipe catalog read from a file is known by when the file names none: the feed
# reads catalogs by name, as the servers' settings pin them.
UNNAMED_CATALOG = {"gpu": "gpu-recipe-catalog", "cpu": "cpu-recipe-catalog"}


def catalog_name(configmap: Any, capability: Capability) -> str:
    """The catalog ConfigMap's own name, or the name it is known by without one."""
    name = ObjectView(configmap).name if isinstance(configmap, Mapping) else None
    return name or UNNAMED_CATALOG[capability]


def fed(
    settings: PolicySettings,
    now: datetime,
    *,
    profile: Mapping[str, Any] | None = None,
    catalogs: Mapping[Capability, Mapping[str, Any]] | None = None,
    catalog: EngineCatalog | None = None,
) -> PolicyFeed:
    """A feed that has read `profile` (the pinned signed profile ConfigMap; None with tenant mode
    off) and each recipe catalog of `catalogs`, at `now`. The settings' catalog names are those
    of the ConfigMaps given, so nothing is pinned that was not read."""
    given = dict(catalogs or {})
    settings = replace(
        settings,
        follow_revisions=False,
        gpu_recipe_catalog_configmap=catalog_name(given["gpu"], "gpu") if "gpu" in given else None,
        cpu_recipe_catalog_configmap=catalog_name(given["cpu"], "cpu") if "cpu" in given else None,
    )
    feed = PolicyFeed(
        settings, catalog, profile=profile is not None, recipes=bool(given), clock=lambda: now
    )
    if profile is not None:
        feed.profile_read(profile)
    for capability, configmap in given.items():
        feed.catalog_read(capability, configmap)
    return feed


def snapshot_of(
    settings: PolicySettings,
    now: datetime,
    *,
    profile: Mapping[str, Any] | None = None,
    catalogs: Mapping[Capability, Mapping[str, Any]] | None = None,
    catalog: EngineCatalog | None = None,
) -> PolicySnapshot:
    """What a server with `settings` plans with, having read these ConfigMaps at `now`."""
    return fed(settings, now, profile=profile, catalogs=catalogs, catalog=catalog).snapshot


__all__ = ["UNNAMED_CATALOG", "catalog_name", "fed", "snapshot_of"]
