"""What tenant data may cost the owner's parts: the caps on the profile revisions they follow.

The tenant's namespace admin may write any ConfigMap in its namespace, labelled
`kamiwaza.ai/inference-profile=true` included, and every server that follows revisions (the
extender, the allocation controller, the tenant's webhook) reads each such ConfigMap as a
signed profile revision. Without a bound, a few dozen ConfigMaps near the API server's 1 MiB
limit took the controller past its memory limit. So, per tenant namespace:

* `MAX_REVISION_BYTES`: a ConfigMap whose data (keys and values of `data` and `binaryData`, as
  the API server counts them) is larger is refused unread: never parsed, never verified, and
  its data is not kept. A real signed bundle is about 4 KiB (the examples' envelope), some
  190 KiB at 256 device-plugin bindings (about 1 MiB kept once verified); the verifier's own
  bound on a bundle read from a file stays `signing.MAX_BUNDLE_BYTES`.
* `MAX_PROFILE_REVISIONS`: the verified revisions a server keeps. Past it the newest distinct
  revisions are kept (one ConfigMap per bundle before its copies, then the highest version, as
  `signing.newest` picks), whatever order they arrived in, and the others are refused; a copy
  of a bundle kept already is refused unverified. Only what the owner signed verifies, so junk
  never fills this cap and never displaces a verified revision, and a refused revision keeps
  its name and the reason alone (`signing.RefusalRecord`), some hundreds of bytes. A revision
  refused by this cap is judged again when it changes, or when the server restarts.
* the room figures the owner's extender publishes into the namespace are read by one name, at
  most `room.MAX_ROOM_BYTES` of text and `room.MAX_ROOM_BINDINGS` bindings.

Each revision is judged once per uid and resourceVersion (`state.revision_of`), so a ConfigMap
rewritten in a loop costs one judgement per write, and what the informers keep of a labelled
ConfigMap once it is judged is its identity and claimed digest (`slim`), so a restarted server
that lists the same junk again holds no more than the running one did.

The caps are settings (`PolicySettings`), from flags or `TMI_*` variables like the others
(`serving.settings.REVISION_CAPS`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from inference_policy.base.pod_view import ObjectView, text_at
from inference_policy.planning.room import MAX_ROOM_BINDINGS, MAX_ROOM_BYTES
from inference_policy.trust.signing import BUNDLE_KEY, DIGEST_KEY

MAX_PROFILE_REVISIONS: Final = 32
MAX_REVISION_BYTES: Final = 256 * 1024
# The API server refuses a ConfigMap over 1 MiB; a cap above it would never be reached.
CEILING_BYTES: Final = 1024 * 1024

# The refusals counted (`tmi_*_profile_revisions_refused_total{reason=...}`): over the size
# cap, over the count cap, or refused by the verifier.
TOO_LARGE: Final = "too-large"
TOO_MANY: Final = "too-many"
UNVERIFIED: Final = "unverified"
REFUSAL_REASONS: Final = (TOO_LARGE, TOO_MANY, UNVERIFIED)

# Where `slim` records the size of data it did not keep, so the verdict on a ConfigMap read
# through an informer is the one on the ConfigMap as the API server sent it. Not a ConfigMap
# field, so no object written to the API server carries it; one that claims it is only ever
# refused by it.
SIZE_MARK: Final = "tmi.kamiwaza.ai/dataBytes"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def data_bytes(configmap: Mapping[str, Any]) -> int:
    """The size of a ConfigMap's data as the API server bounds it: every key and value of
    `data` and `binaryData` (the latter as the base64 text it is sent as)."""
    marked = configmap.get(SIZE_MARK)
    if isinstance(marked, int):
        return marked
    total = 0
    for field in ("data", "binaryData"):
        values = configmap.get(field)
        if isinstance(values, Mapping):
            for key, value in values.items():
                total += _length(key) + _length(value)
    return total


def _length(text: object) -> int:
    if not isinstance(text, str):
        return 0
    # isascii() is a flag test: the common case costs no copy of a large value.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def digest_of(configmap: Mapping[str, Any]) -> str | None:
    """The bundle sha256 a ConfigMap claims, when it is one (64 lowercase hex digits): a plan
    names its revision by such a digest, so no other text can ever be looked up."""
    data = configmap.get("data")
    digest = data.get(DIGEST_KEY) if isinstance(data, Mapping) else None
    return digest if isinstance(digest, str) and _SHA256.match(digest) else None


def _identity(configmap: Mapping[str, Any]) -> dict[str, Any]:
    """What an informer needs of any object: its kind, and the metadata it is keyed and
    compared by (name, namespace, uid, resourceVersion)."""
    metadata = ObjectView(configmap).metadata
    kept: dict[str, Any] = {}
    for field in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp"):
        value = text_at(metadata, field)
        if value is not None:
            kept[field] = value
    return {
        "apiVersion": configmap.get("apiVersion", "v1"),
        "kind": configmap.get("kind", "ConfigMap"),
        "metadata": kept,
    }


def slim(configmap: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of a labelled ConfigMap once its revision is judged: its identity and the
    digest it claims, a few hundred bytes whatever it carried."""
    kept = _identity(configmap)
    digest = digest_of(configmap)
    if digest is not None:
        kept["data"] = {DIGEST_KEY: digest}
    return kept


def readable(configmap: Mapping[str, Any], max_bytes: int) -> dict[str, Any]:
    """What is kept of a profile ConfigMap before it is verified: what the verifier reads (its
    identity, `immutable`, the bundle and its digest) when its data is within `max_bytes`;
    otherwise its identity, its claimed digest and the size that refuses it."""
    size = data_bytes(configmap)
    if size > max_bytes:
        kept = slim(configmap)
        kept[SIZE_MARK] = size
        return kept
    kept = _identity(configmap)
    if "immutable" in configmap:
        kept["immutable"] = configmap["immutable"]
    data = configmap.get("data")
    if isinstance(data, Mapping):
        kept["data"] = {key: data[key] for key in (BUNDLE_KEY, DIGEST_KEY) if key in data}
    elif data is not None:
        kept["data"] = data
    return kept


def too_large(name: str, size: int, max_bytes: int) -> str:
    return (
        f"ConfigMap {name!r} carries {size} bytes of data, over the cap of {max_bytes} bytes on "
        "a profile revision (--max-profile-revision-bytes); it was not read"
    )


def too_many(name: str, namespace: str, max_revisions: int) -> str:
    return (
        f"ConfigMap {name!r} was not kept: namespace {namespace!r} holds more than "
        f"{max_revisions} signed profile revisions, the cap (--max-profile-revisions), and the "
        "newest are kept"
    )


__all__ = [
    "CEILING_BYTES",
    "MAX_PROFILE_REVISIONS",
    "MAX_REVISION_BYTES",
    "MAX_ROOM_BINDINGS",
    "MAX_ROOM_BYTES",
    "REFUSAL_REASONS",
    "SIZE_MARK",
    "TOO_LARGE",
    "TOO_MANY",
    "UNVERIFIED",
    "data_bytes",
    "digest_of",
    "readable",
    "slim",
    "too_large",
    "too_many",
]
