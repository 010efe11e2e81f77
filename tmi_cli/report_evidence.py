"""The evidence report as a page (`tmi evidence --html FILE`): for each physical GPU, by UUID,
a timeline of the Pods and tenants seen holding it sample by sample with the overlaps marked,
each share's grant against the memory its processes used, and the verdict with the checks
behind it.

A judged report answers "who was on which card, and did each keep to its share", but as JSON it
answers only people who read JSON. This module lays the report `judge` already produced out for
the page template (`templates/evidence.html.j2`): positions, colours and labels. It decides
nothing: every status, finding and overlap drawn is the report's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tmi_cli.report_page import (
    GIB,
    OTHER_COLOUR,
    STATUS_COLOURS,
    Tick,
    render,
    tenant_colours,
    ticks,
)

__all__ = ["evidence_page"]

LABEL_W = 330  # room for "namespace/pod" before the plot
PLOT_W = 620
ROW_H = 26
MAX_CELL_W = 110  # a short run's samples stay cells, not one wide band
BAR_W = 520  # the memory chart's plot, leaving room for its figures to the right


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive samples in which a holder (or an overlap) was seen, as one band."""

    x: float
    width: float
    title: str
    same_memory: bool = True


@dataclass(frozen=True, slots=True)
class Lane:
    """One holder of a GPU in the timeline: a Pod's grant, or a process outside every grant."""

    y: float
    label: str
    detail: str
    colour: str
    status_colour: str
    outside: bool
    runs: tuple[Run, ...]


@dataclass(frozen=True, slots=True)
class Timeline:
    width: float
    height: float
    plot_x: float
    plot_w: float
    lanes: tuple[Lane, ...]
    overlap_y: float
    overlaps: tuple[Run, ...]
    axis_y: float
    ticks: tuple[Tick, ...]


@dataclass(frozen=True, slots=True)
class MemoryBar:
    """One allocation's grant (the outline) against the memory its processes used (the fill)."""

    y: float
    label: str
    title: str
    colour: str
    status_colour: str
    granted_w: float
    used_w: float
    over_x: float
    over_w: float
    budget_x: float | None
    text: str


@dataclass(frozen=True, slots=True)
class MemoryChart:
    width: float
    height: float
    plot_x: float
    plot_w: float
    bars: tuple[MemoryBar, ...]
    axis_y: float
    ticks: tuple[Tick, ...]


@dataclass(frozen=True, slots=True)
class GpuView:
    gpu: Mapping[str, Any]
    timeline: Timeline
    memory: MemoryChart | None
    allocations: tuple[Mapping[str, Any], ...]
    bypasses: tuple[Mapping[str, Any], ...]
    overlaps: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Check:
    """One condition the verdict rests on, as the verdict states it."""

    name: str
    state: str  # "ok", "bad", "warn" or "none" (nothing to check)
    summary: str
    items: tuple[str, ...] = ()


def _runs(columns: Iterable[int], x_of: Sequence[float], cell: float, what: str) -> list[Run]:
    """Bands over runs of consecutive columns; `what` names the holder in each tooltip."""
    out: list[Run] = []
    ordered = sorted(set(columns))
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            span = f"sample {first}" if first == last else f"samples {first}–{last}"
            out.append(Run(x_of[first], x_of[last] - x_of[first] + cell, f"{what}: {span}"))
            start = i
    return out


def _ref(entry: Mapping[str, Any]) -> str:
    return f"{entry.get('namespace')}/{entry.get('pod')}"


def _timeline(
    uuid: str,
    report: Mapping[str, Any],
    allocations: Sequence[Mapping[str, Any]],
    bypasses: Sequence[Mapping[str, Any]],
    colours: Mapping[str, str],
) -> Timeline:
    samples = sorted(
        (s for s in report.get("samples") or [] if isinstance(s, Mapping)),
        key=lambda s: int(s.get("index", 0)),
    )
    column = {int(s.get("index", 0)): i for i, s in enumerate(samples)}
    cell = min(MAX_CELL_W, PLOT_W / max(1, len(samples)))
    x_of = [LABEL_W + i * cell for i in range(len(samples))]
    lanes: list[Lane] = []

    def lane(label: str, detail: str, colour: str, status: str, outside: bool, seen: Any) -> None:
        columns = [column[i] for i in seen or [] if i in column]
        runs = _runs(columns, x_of, cell, label)
        y = 8 + len(lanes) * ROW_H
        lanes.append(Lane(y, label, detail, colour, STATUS_COLOURS[status], outside, tuple(runs)))

    for a in allocations:
        slice_ = f" · MIG {a.get('migProfile') or a.get('migInstance')}"
        label = _ref(a) + (slice_ if a.get("migInstance") is not None else "")
        detail = f"{a.get('bindingId') or '-'} · {a.get('isolation')} · {a.get('status')}"
        colour = colours.get(str(a.get("namespace")), OTHER_COLOUR)
        lane(label, detail, colour, str(a.get("status")), False, a.get("samples"))
    # The verdict lists a process it could not attribute as inconclusive, by pid and card.
    unsure = set((report.get("verdict") or {}).get("inconclusive") or [])
    for b in bypasses:
        label = _ref(b) if b.get("pod") else f"pid {b.get('pid')}"
        status = "inconclusive" if f"pid {b.get('pid')}@{uuid}" in unsure else "not-honoured"
        colour = OTHER_COLOUR
        if b.get("pod"):
            colour = colours.get(str(b.get("namespace")), OTHER_COLOUR)
        detail = f"outside every grant: {b.get('reason')}"
        lane(label, detail, colour, status, True, b.get("samples"))

    # The overlap row: the samples in which two holders shared the card, red where they shared
    # its memory too, amber where each sat on its own MIG slice.
    shared: dict[int, bool] = {}
    pairs: dict[int, int] = {}
    for overlap in report.get("overlaps") or []:
        if not isinstance(overlap, Mapping) or overlap.get("gpuUuid") != uuid:
            continue
        for index in overlap.get("samples") or []:
            if index in column:
                col = column[index]
                shared[col] = shared.get(col, False) or bool(overlap.get("sameMemory"))
                pairs[col] = pairs.get(col, 0) + 1
    overlap_runs: list[Run] = []
    for same in (True, False):
        for run in _runs([c for c, s in shared.items() if s is same], x_of, cell, "overlap"):
            kind = "sharing memory" if same else "on separate MIG slices"
            overlap_runs.append(Run(run.x, run.width, f"{run.title} ({kind})", same))
    overlap_y = 8 + len(lanes) * ROW_H + 6
    axis_y = overlap_y + ROW_H + 4
    labels = [f"{s.get('index')}" + _clock(s.get("timestamp")) for s in samples]
    return Timeline(
        width=LABEL_W + max(PLOT_W, cell * len(samples)) + 20,
        height=axis_y + 34,
        plot_x=LABEL_W,
        plot_w=cell * len(samples),
        lanes=tuple(lanes),
        overlap_y=overlap_y,
        overlaps=tuple(overlap_runs),
        axis_y=axis_y,
        ticks=tuple(ticks([x + cell / 2 for x in x_of], labels, most=8)),
    )


def _clock(timestamp: Any) -> str:
    """The time of day of an RFC 3339 timestamp, for the axis (the date is in the header)."""
    text = str(timestamp or "")
    if "T" in text:
        return " · " + text.partition("T")[2][:8]
    return ""


def _step(scale: float) -> float:
    """A round GiB step giving at most eight ticks over `scale` bytes."""
    for units in (0.25, 0.5, 1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1000, 2000, 5000):
        if scale / (units * GIB) <= 8:
            return units * GIB
    return scale / 8


def _memory(allocations: Sequence[Mapping[str, Any]], colours: Mapping[str, str]) -> MemoryChart:
    def size(value: Any) -> float:
        return float(value) if isinstance(value, int | float) else 0.0

    scale = max(
        [1.0]
        + [max(size(a.get("grantedBytes")), size(a.get("usedBytes"))) for a in allocations]
        + [size(a.get("engineBudgetBytes")) for a in allocations]
    )
    step = _step(scale)
    scale = max(scale, step * -(-scale // step))
    width_of = BAR_W / scale
    bars: list[MemoryBar] = []
    for i, a in enumerate(allocations):
        granted, used = size(a.get("grantedBytes")), size(a.get("usedBytes"))
        # The part of the use inside the grant; past it is overuse, drawn apart.
        within = min(used, granted) if a.get("grantedBytes") is not None else used
        budget = a.get("engineBudgetBytes")
        text = f"{_gib(a.get('usedBytes'))} used of {_gib(a.get('grantedBytes'))} granted"
        if a.get("overuseBytes"):
            text += f" · {_gib(a.get('overuseBytes'))} over"
        findings = ", ".join(a.get("findings") or []) or "none"
        notes = ", ".join(a.get("notes") or []) or "none"
        bars.append(
            MemoryBar(
                y=8 + i * ROW_H,
                label=_ref(a),
                title=f"{_ref(a)}: {text}; findings: {findings}; notes: {notes}",
                colour=colours.get(str(a.get("namespace")), OTHER_COLOUR),
                status_colour=STATUS_COLOURS.get(str(a.get("status")), OTHER_COLOUR),
                granted_w=granted * width_of,
                used_w=within * width_of,
                over_x=LABEL_W + within * width_of,
                over_w=max(0.0, used - within) * width_of,
                budget_x=LABEL_W + size(budget) * width_of if budget is not None else None,
                text=text,
            )
        )
    axis_y = 8 + len(bars) * ROW_H + 4
    count = int(scale // step) + 1
    positions = [LABEL_W + k * step * width_of for k in range(count)]
    labels = [_gib(k * step).replace(".0 GiB", " GiB") for k in range(count)]
    return MemoryChart(
        width=LABEL_W + BAR_W + 330,
        height=axis_y + 30,
        plot_x=LABEL_W,
        plot_w=BAR_W,
        bars=tuple(bars),
        axis_y=axis_y,
        ticks=tuple(ticks(positions, labels, most=count)),
    )


def _gib(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "unknown"
    return f"{value / GIB:.1f} GiB"


def _checks(report: Mapping[str, Any]) -> list[Check]:
    verdict = report.get("verdict") or {}
    not_honoured = [str(x) for x in verdict.get("notHonoured") or []]
    outside = int(verdict.get("bypassProcesses") or 0)
    failed = [str(x) for x in verdict.get("failedJobs") or []]
    unsure = [str(x) for x in verdict.get("inconclusive") or []]
    count = int(verdict.get("allocations") or 0)
    jobs = report.get("jobOutcomes") or []
    return [
        Check(
            "Every share honoured",
            "bad" if not_honoured else "ok" if count else "none",
            f"{len(not_honoured)} of {count} allocations not honoured"
            if count
            else "no GPU process of a granted Pod was seen: run while the workloads run",
            tuple(not_honoured),
        ),
        Check(
            "No process outside a grant",
            "bad" if outside else "ok",
            f"{outside} process(es) hold a GPU context no grant accounts for"
            if outside
            else "every process seen belongs to a grant",
        ),
        Check(
            "Every memory-pressure Pod ended in a CUDA out-of-memory error",
            "bad" if failed else "ok" if jobs else "none",
            f"{len(failed)} of {len(jobs)} did not"
            if jobs
            else "no memory-pressure Pod was given (--job-pod)",
            tuple(failed),
        ),
        Check(
            "Every reading conclusive",
            "warn" if unsure else "ok",
            f"{len(unsure)} reading(s) could not be judged" if unsure else "all readings judged",
            tuple(unsure),
        ),
    ]


def _for_gpu(entries: Any, uuid: str) -> tuple[Mapping[str, Any], ...]:
    return tuple(e for e in entries or [] if isinstance(e, Mapping) and e.get("gpuUuid") == uuid)


def evidence_page(report: Mapping[str, Any], command: str = "tmi evidence") -> str:
    """The page for a report `tmi evidence` produced (`judge`'s document)."""
    gpus = [g for g in report.get("gpus") or [] if isinstance(g, Mapping)]
    tenants: set[str] = {str(t) for g in gpus for t in g.get("tenants") or []}
    for entry in [*(report.get("allocations") or []), *(report.get("bypasses") or [])]:
        if isinstance(entry, Mapping) and entry.get("namespace"):
            tenants.add(str(entry["namespace"]))
    colours = tenant_colours(tenants)
    views = []
    for gpu in gpus:
        uuid = str(gpu.get("uuid"))
        allocations = _for_gpu(report.get("allocations"), uuid)
        bypasses = _for_gpu(report.get("bypasses"), uuid)
        views.append(
            GpuView(
                gpu=gpu,
                timeline=_timeline(uuid, report, allocations, bypasses, colours),
                memory=_memory(allocations, colours) if allocations else None,
                allocations=allocations,
                bypasses=bypasses,
                overlaps=_for_gpu(report.get("overlaps"), uuid),
            )
        )
    listed = {str(g.get("uuid")) for g in gpus}
    stray = [b for b in report.get("bypasses") or [] if b.get("gpuUuid") not in listed]
    verdict = report.get("verdict") or {}
    node = report.get("node") or "(node not named)"
    return render(
        "evidence.html.j2",
        title=f"GPU-sharing evidence: {node}",
        command=command,
        report=report,
        verdict=verdict,
        status=str(verdict.get("status", "inconclusive")),
        checks=_checks(report),
        gpus=views,
        stray=stray,
        colours=colours,
        other_colour=OTHER_COLOUR,
        row_h=ROW_H,
    )
