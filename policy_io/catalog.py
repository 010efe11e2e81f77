"""The engine catalog shipped inside the package, loaded once per process."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from inference_policy.base import strictjson
from inference_policy.planning.catalog import EngineCatalog

CATALOG_RESOURCE = "engine-catalog.json"


def catalog_bytes() -> bytes:
    return files("inference_policy").joinpath("data", CATALOG_RESOURCE).read_bytes()


@cache
def packaged_catalog() -> EngineCatalog:
    return EngineCatalog.from_document(strictjson.loads(catalog_bytes(), what=CATALOG_RESOURCE))
