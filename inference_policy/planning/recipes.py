"""Recipe catalogs: an owner's pins of a specific model and configuration to an exact image.

A recipe catalog is published as an immutable ConfigMap whose name carries the catalog's whole
sha256, so a new revision is a new object and a consumer can never see a catalog change under
it, and the name the owner configures binds the ConfigMap to exactly that catalog. The same
parser validates a catalog when `tmi render-catalog` emits it and when the servers load it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from inference_policy.base import strictjson
from inference_policy.base.errors import describe
from inference_policy.base.pod_view import ObjectView
from inference_policy.base.strict import Strict
from inference_policy.trust.profile import DNS_LABEL, PINNED_IMAGE, VARIANT_ID
from inference_policy.trust.signing import canonical, sha256_hex

CATALOG_KEY = "catalog.json"
DIGEST_KEY = "catalog.sha256"
DIGEST_ANNOTATION = "kamiwaza.ai/catalog-sha256"
MAX_CONFIGMAP_BYTES = 1024 * 1024 - 4096


class RecipeCatalogError(ValueError):
    """The recipe catalog is malformed; the message names the field."""


class Recipe(Strict):
    id: Annotated[str, Field(pattern=VARIANT_ID.pattern)]
    engine: Annotated[str, Field(min_length=1, max_length=64)]
    model: Annotated[str, Field(min_length=1, max_length=512)]
    match: dict[str, Any] = Field(default_factory=dict)
    variantId: Annotated[str, Field(pattern=VARIANT_ID.pattern)]
    image: Annotated[str, Field(pattern=PINNED_IMAGE.pattern)]
    tensorParallelSize: Annotated[int, Field(ge=1, le=8)] | None = None


class RecipeCatalog(Strict):
    schemaVersion: Literal[1]
    capability: Literal["gpu", "cpu"]
    recipes: list[Recipe] = Field(max_length=4096)

    def find(self, engine: str, model: str, config: Mapping[str, Any]) -> Recipe | None:
        """The first recipe for this engine and model whose every `match` key the config has."""
        for recipe in self.recipes:
            if recipe.engine != engine or recipe.model != model:
                continue
            if all(config.get(key) == value for key, value in recipe.match.items()):
                return recipe
        return None


def parse_catalog(document: Any, capability: str | None = None) -> RecipeCatalog:
    if not isinstance(document, dict):
        raise RecipeCatalogError("a recipe catalog must be a JSON object")
    try:
        catalog = RecipeCatalog.model_validate(document)
    except ValidationError as exc:
        raise RecipeCatalogError(f"recipe catalog: {describe(exc)}") from None
    ids = [recipe.id for recipe in catalog.recipes]
    duplicate = next((i for i in ids if ids.count(i) > 1), None)
    if duplicate is not None:
        raise RecipeCatalogError(f"recipe catalog: recipe id {duplicate!r} is used twice")
    if capability is not None and catalog.capability != capability:
        raise RecipeCatalogError(
            f"recipe catalog: capability is {catalog.capability!r}, not {capability!r}"
        )
    return catalog


@dataclass(frozen=True)
class RenderedCatalog:
    configmap: dict[str, Any]
    catalog: RecipeCatalog


def render_catalog(document: Any, namespace: str, capability: str) -> RenderedCatalog:
    """Validate a catalog and emit its immutable ConfigMap, named after its digest."""
    if not DNS_LABEL.fullmatch(namespace):
        raise RecipeCatalogError(f"namespace {namespace!r} is not a namespace name")
    catalog = parse_catalog(document, capability)
    payload = canonical(document)
    if len(payload) > MAX_CONFIGMAP_BYTES:
        raise RecipeCatalogError(
            f"recipe catalog is {len(payload)} bytes; a ConfigMap holds at most "
            f"{MAX_CONFIGMAP_BYTES} with room for its metadata"
        )
    digest = sha256_hex(payload)
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            # The whole digest: the name the owner configures is what binds the tenant
            # namespace's ConfigMap to the owner's catalog, so it must not be a prefix a second
            # preimage of 64 bits could match.
            "name": f"kamiwaza-inference-{capability}-recipes-{digest}",
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/part-of": "kamiwaza-tenant-inference",
                "kamiwaza.ai/recipe-catalog": capability,
            },
            "annotations": {DIGEST_ANNOTATION: digest},
        },
        "immutable": True,
        "data": {CATALOG_KEY: payload.decode("utf-8"), DIGEST_KEY: digest},
    }
    return RenderedCatalog(configmap, catalog)


def load_catalog(document: Any, capability: str) -> RecipeCatalog:
    """Load a catalog given either as its rendered ConfigMap or as the bare catalog."""
    if isinstance(document, dict) and document.get("kind") == "ConfigMap":
        if document.get("immutable") is not True:
            raise RecipeCatalogError("recipe catalog ConfigMap is not immutable")
        data = document.get("data")
        if not isinstance(data, dict) or not isinstance(data.get(CATALOG_KEY), str):
            raise RecipeCatalogError(f"recipe catalog ConfigMap lacks {CATALOG_KEY}")
        payload = data[CATALOG_KEY].encode("utf-8")
        digest = sha256_hex(payload)
        if data.get(DIGEST_KEY) != digest:
            raise RecipeCatalogError(f"recipe catalog ConfigMap's {DIGEST_KEY} does not match")
        name = ObjectView(document).name or ""
        if not name.endswith(digest):
            raise RecipeCatalogError(
                f"recipe catalog ConfigMap {name!r} does not carry its sha256 {digest}: render "
                "it again with `tmi render-catalog`, which names it after its whole digest"
            )
        try:
            document = strictjson.loads(payload, what=CATALOG_KEY)
        except strictjson.StrictJSONError as exc:
            raise RecipeCatalogError(str(exc)) from None
    return parse_catalog(document, capability)
