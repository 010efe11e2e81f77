"""What the tenant can write, and what the owner's parts make of it: the inventory, as data.

The owner's parts (the admission policies inside kube-apiserver, the owner's kube-scheduler and
its extender, the allocation controller) all read objects of the tenant namespace, and the
tenant's namespace admin (built-in `admin` there, `pods/status` patch, acting as any
ServiceAccount of its namespace) may write every one of them. Each such input is either checked
against the signed grant, refused by a policy, never read, assigned by the API server, or open
(said so, with the issue that closes it); none is trusted. `docs/threat-model.md` shows this
inventory as its table, and the tests hold the two together
(`tests/unit/core/tools/test_tenant_inputs.py`) and hold the owner parts' Python to it: run over
representative Pods wrapped so that every key they read is recorded, no part may read a Pod
field this inventory does not list, nor one it says is never read
(`tests/integration/serving/test_tenant_inputs_read.py`).

Paths name a Pod's fields as the recorder spells them: `.` between fields, `[]` for any element
of a list, `[key]` for a map key (`metadata.annotations[kamiwaza.ai/plan]`), `[*]` for every key
of a map (its names read), `[prefix*]` for the keys with that prefix, and `[<other>]` for the
keys no other row names (which is never a key read). A listed path covers itself and every path
under it. The other objects' rows name the object first (`ConfigMap ...`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from inference_policy.tools.tenant_input_names import NEXT_ISSUE, Row
from inference_policy.tools.tenant_input_objects import OTHER_ROWS, SIZE_AND_CONFIGMAP_ROWS
from inference_policy.tools.tenant_input_pod import METADATA_ROWS
from inference_policy.tools.tenant_input_spec import SPEC_ROWS, STATUS_ROWS

Treatment = Literal["checked", "refused", "never read", "api server", "open"]
TREATMENTS: dict[Treatment, str] = {
    "checked": "checked against the signed grant",
    "refused": "refused by a policy",
    "never read": "never read",
    "api server": "set by the API server",
    "open": "open",
}


@dataclass(frozen=True, slots=True)
class TenantInput:
    """One input the tenant can write or influence: the object (`kind`) and its paths, who may
    write it, which owner parts read it (`file:function`, or a Kubernetes component), how it is
    treated and why, and the end-to-end tests that prove it acting as the tenant."""

    kind: str
    paths: tuple[str, ...]
    writer: str
    readers: tuple[str, ...]
    treatment: Treatment
    how: str
    tests: tuple[str, ...]

    def table_row(self) -> str:
        """The row of the threat model's table."""
        cells = [
            self.kind,
            "<br>".join(p if " " in p else f"`{p}`" for p in self.paths),
            self.writer,
            "<br>".join(f"`{r}`" for r in self.readers) or "none",
            TREATMENTS[self.treatment],
            self.how,
            "<br>".join(f"`{t}`" for t in self.tests) or "none yet",
        ]
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


TABLE_HEADER = (
    "| object | input | who may write it | read by | treatment | how | proved by (as the "
    "tenant's namespace admin) |",
    "| --- | --- | --- | --- | --- | --- | --- |",
)


def _input(row: Row) -> TenantInput:
    kind, paths, writer, readers, treatment, how, tests = row
    if treatment not in TREATMENTS:
        raise ValueError(f"{paths}: unknown treatment {treatment!r}")
    return TenantInput(kind, paths, writer, readers, treatment, how, tests)


ROWS = METADATA_ROWS + SPEC_ROWS + STATUS_ROWS + SIZE_AND_CONFIGMAP_ROWS + OTHER_ROWS
INVENTORY: tuple[TenantInput, ...] = tuple(_input(row) for row in ROWS)


def table() -> list[str]:
    """The threat model's table, header first, one line a row."""
    return [*TABLE_HEADER, *(entry.table_row() for entry in INVENTORY)]


# -- paths --------------------------------------------------------------------------------------


def segments(path: str) -> tuple[str, ...]:
    """`spec.containers[].env` -> ("spec", "containers", "[]", "env"); a bracket's content is
    taken whole, dots and slashes included."""
    out: list[str] = []
    name = ""
    index = 0
    while index < len(path):
        char = path[index]
        if char == "[":
            end = path.index("]", index)
            if name:
                out.append(name)
                name = ""
            out.append(path[index : end + 1])
            index = end + 1
            continue
        if char == ".":
            if name:
                out.append(name)
            name = ""
        else:
            name += char
        index += 1
    if name:
        out.append(name)
    return tuple(out)


def _segment_matches(listed: str, read: str) -> bool:
    if listed == read:
        return True
    if not (listed.startswith("[") and read.startswith("[")) or listed in ("[*]", "[]"):
        return False
    pattern = listed[1:-1]
    return "*" in pattern and "<" not in pattern and fnmatchcase(read[1:-1], pattern)


def covers(listed: str, read: str) -> bool:
    """`listed` is `read` or a path above it (`[prefix*]` matching the keys it names)."""
    want, have = segments(listed), segments(read)
    return len(want) <= len(have) and all(
        _segment_matches(w, h) for w, h in zip(want, have, strict=False)
    )


def pod_rows() -> tuple[TenantInput, ...]:
    return tuple(entry for entry in INVENTORY if entry.kind == "Pod")


def listed(read: str, *, container: bool = False) -> tuple[TenantInput, ...]:
    """The Pod rows that list `read`. With `container` (what was read is an object or a list,
    or only its size), a row listing something under it counts too: reading the object is
    not reading what it holds, which is recorded on its own."""
    found = []
    for entry in pod_rows():
        if any(covers(path, read) for path in entry.paths) or (
            container and any(covers(read, path) for path in entry.paths)
        ):
            found.append(entry)
    return tuple(found)


def counts() -> dict[Treatment, int]:
    """How many rows each treatment has."""
    out: dict[Treatment, int] = dict.fromkeys(TREATMENTS, 0)
    for entry in INVENTORY:
        out[entry.treatment] += 1
    return out


__all__ = [
    "INVENTORY",
    "NEXT_ISSUE",
    "TABLE_HEADER",
    "TREATMENTS",
    "TenantInput",
    "Treatment",
    "counts",
    "covers",
    "listed",
    "pod_rows",
    "segments",
    "table",
]
