"""The capacity replay as a picture (`tmi capacity --html FILE`): the fleet's nodes and their
devices, which deployment, binding and tenant holds each, what is left free and what of it is
stranded, and each waiting deployment with the reason of the node that came closest.

An owner sizing a fleet wants to see where the holes are, and the tables `tmi capacity` prints
make them count rows. This module lays out the report the replay already produced (the
document `-o json` prints) for `templates/capacity.html.j2`: a box per device of an isolating
resource, a proportional bar per accounted-share GPU. It decides nothing: placements, reasons
and stranded units are the replay's own (`inference_policy.tools.capacity`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inference_policy.placing.tenancy import gpu_index, shares_gpu
from tmi_cli.report_page import OTHER_COLOUR, render, shorten, tenant_colours

__all__ = ["capacity_page"]

BOX_W, BOX_H, GAP = 96, 44, 6
MAX_BOXES = 32  # past this many devices a resource is drawn as one proportional bar
BAR_W = 640
FREE_COLOUR = "#FFFFFF"


@dataclass(frozen=True, slots=True)
class Box:
    """A device, or a part of an accounted GPU: held by a deployment, free, or stranded."""

    x: float
    width: float
    kind: str  # "held", "free" or "stranded"
    fill: str
    label: str
    title: str


@dataclass(frozen=True, slots=True)
class ResourceRow:
    label: str
    resource: str
    total: int
    free: int
    stranded: int
    width: float
    boxes: tuple[Box, ...]


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    anchor: str
    rows: tuple[ResourceRow, ...]
    closest_for: tuple[Mapping[str, Any], ...]


def _units(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _row(
    node: str,
    resource: str,
    report: Mapping[str, Any],
    colours: Mapping[str, str],
) -> ResourceRow:
    held = sum(
        _units(units)
        for entry in report.get("gpus") or []
        if entry.get("node") == node and entry.get("resource") == resource
        for units in (entry.get("tenants") or {}).values()
    )
    free = _units((report.get("left") or {}).get(node, {}).get(resource))
    stranded = _units((report.get("strandedByNode") or {}).get(node, {}).get(resource))
    total = held + free
    holders = [
        (p, _units((p.get("resources") or {}).get(resource)))
        for p in report.get("placed") or []
        if p.get("node") == node and _units((p.get("resources") or {}).get(resource))
    ]
    index = gpu_index(resource)
    shared = shares_gpu(resource)
    label = f"GPU {index} (accounted shares)" if shared and index is not None else resource
    boxes: list[Box] = []
    if not shared and 0 < total <= MAX_BOXES:
        # One box per device: the devices of an isolating resource are counted, not named,
        # so the order within a node is the replay's order of placement.
        slots: list[tuple[str, str, str, str]] = []
        for p, units in holders:
            tenant = str(p.get("tenant") or "")
            title = f"{p.get('name')} · binding {p.get('binding')} · tenant {tenant or '-'}"
            fill = colours.get(tenant, OTHER_COLOUR)
            slots += [("held", fill, str(p.get("name")), title)] * units
        free_title = f"free {resource} on {node}"
        slots += [("stranded", FREE_COLOUR, "stranded", free_title + " (stranded)")] * stranded
        slots += [("free", FREE_COLOUR, "free", free_title)] * (free - stranded)
        for i, (kind, fill, text, title) in enumerate(slots):
            boxes.append(Box(i * (BOX_W + GAP), BOX_W, kind, fill, shorten(text, 12), title))
        width = max(len(slots) * (BOX_W + GAP), BOX_W)
    else:
        # An accounted GPU (or too many devices to draw): one bar, each holder's part to scale.
        scale = BAR_W / max(total, 1)
        x = 0.0
        unit = "GB" if shared else "devices"
        for p, units in holders:
            tenant = str(p.get("tenant") or "")
            title = (
                f"{p.get('name')} · {units} {unit} · binding {p.get('binding')} · "
                f"tenant {tenant or '-'}"
            )
            fill = colours.get(tenant, OTHER_COLOUR)
            chars = max(0, int(units * scale / 7))
            boxes.append(Box(x, units * scale, "held", fill, shorten(p.get("name"), chars), title))
            x += units * scale
        for kind, units in (("stranded", stranded), ("free", free - stranded)):
            if units > 0:
                text = f"{units} {unit} {kind}"
                chars = max(0, int(units * scale / 7))
                boxes.append(Box(x, units * scale, kind, FREE_COLOUR, shorten(text, chars), text))
                x += units * scale
        width = BAR_W
    return ResourceRow(label, resource, total, free, stranded, width + 2, tuple(boxes))


def capacity_page(
    report: Mapping[str, Any],
    nodes: Sequence[str] = (),
    command: str = "tmi capacity -o json",
) -> str:
    """The page for a capacity report (the `-o json` document); `nodes` names the fleet's
    nodes, so a node that offers no accelerator still appears."""
    placed = [p for p in report.get("placed") or [] if isinstance(p, Mapping)]
    held = [g for g in report.get("gpus") or [] if isinstance(g, Mapping)]
    tenants = {str(p.get("tenant") or "") for p in placed}
    tenants |= {str(t) for g in held for t in g.get("tenants") or {}}
    colours = tenant_colours(tenants)
    left: Mapping[str, Mapping[str, Any]] = report.get("left") or {}
    names = list(dict.fromkeys([*nodes, *sorted(left), *(str(g.get("node")) for g in held)]))
    names += sorted({str(p.get("node")) for p in placed} - set(names))
    waiting = [w for w in report.get("waiting") or [] if isinstance(w, Mapping)]
    anchors = {name: f"node-{i}" for i, name in enumerate(names, 1)}
    views = []
    for name in names:
        resources = set(left.get(name, {})) | {
            str(g.get("resource")) for g in held if g.get("node") == name
        }
        views.append(
            NodeView(
                name=name,
                anchor=anchors[name],
                rows=tuple(_row(name, r, report, colours) for r in sorted(resources)),
                closest_for=tuple(w for w in waiting if w.get("node") == name),
            )
        )
    # Units of different resources (devices, GB of a share) are never added together.
    free: dict[str, int] = {}
    for offered in left.values():
        for resource, units in offered.items():
            free[resource] = free.get(resource, 0) + _units(units)
    return render(
        "capacity.html.j2",
        title="Capacity: what the deployments would get on this fleet",
        command=command,
        report=report,
        nodes=views,
        anchors=anchors,
        waiting=waiting,
        colours=colours,
        other_colour=OTHER_COLOUR,
        free=dict(sorted(free.items())),
        box_h=BOX_H,
    )
