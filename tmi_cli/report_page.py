"""What the HTML reports of `tmi evidence --html` and `tmi capacity --html` share: the page
around them, the template engine, colours, sizes and the file they are written to.

An owner hands a report to people who read pictures rather than JSON, often as an attachment
opened offline or kept in an audit archive. So each page is one file that fetches nothing (no
CDN, font or script; its Content-Security-Policy forbids every fetch), draws with inline SVG and
CSS alone so it reads without JavaScript, and carries the very JSON the command prints, so the
picture can always be checked against the data. Pod, namespace and deployment names are written
by tenants: every value goes through Jinja2's autoescaping, never into markup by hand.

The per-report modules (`report_evidence`, `report_capacity`) turn a report the command already
computed into a view for their template; nothing here decides anything.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, PackageLoader, StrictUndefined

from policy_io.files import write_atomic

__all__ = [
    "STATUS_COLOURS",
    "Tick",
    "check_writable",
    "gib",
    "page_json",
    "render",
    "shorten",
    "tenant_colours",
    "ticks",
    "write_page",
]

# Okabe and Ito's palette, which stays distinct under the common colour-vision deficiencies; a
# tenant keeps its colour across the pages of one report.
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#7F6BB0",
    "#8C6D31",
    "#3D9970",
)
OTHER_COLOUR = "#9AA0A6"  # a process outside every Pod: no tenant to colour it by
STATUS_COLOURS = {
    "honoured": "#1B7F3B",
    "not-honoured": "#C62828",
    "inconclusive": "#B26A00",
}
GIB = 1024**3


@functools.cache
def _environment() -> Environment:
    environment = Environment(
        loader=PackageLoader("tmi_cli", "templates"),
        # Every value is escaped unless a template says otherwise; none does.
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["gib"] = gib
    environment.filters["shorten"] = shorten
    environment.globals["status_colours"] = STATUS_COLOURS
    return environment


def gib(value: Any) -> str:
    """Bytes as GiB for a person ("12.0 GiB"); "unknown" where the driver would not say."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "unknown"
    return f"{value / GIB:.1f} GiB"


def shorten(text: Any, limit: int = 48) -> str:
    """A label that fits its box: the middle of a long name elided (its ends tell Pods apart);
    the whole name stays in the page's tables and in each shape's tooltip."""
    value = str(text)
    if len(value) <= limit:
        return value
    keep = limit - 1
    return value[: keep - keep // 2] + "…" + value[len(value) - keep // 2 :]


def tenant_colours(tenants: Iterable[str]) -> dict[str, str]:
    """A colour per tenant, in name order; past the palette, colours repeat."""
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(sorted(set(tenants)))}


@dataclass(frozen=True, slots=True)
class Tick:
    x: float
    label: str


def ticks(positions: Sequence[float], labels: Sequence[str], most: int = 10) -> list[Tick]:
    """At most `most` labelled ticks along an axis, evenly spread, the first and last kept."""
    count = len(positions)
    if count == 0:
        return []
    step = max(1, -(-count // most))
    chosen = list(range(0, count, step))
    if chosen[-1] != count - 1:
        if count - 1 - chosen[-1] < step / 2 and len(chosen) > 1:
            chosen[-1] = count - 1
        else:
            chosen.append(count - 1)
    return [Tick(positions[i], labels[i]) for i in chosen]


def page_json(report: Mapping[str, Any]) -> str:
    """The report as the command prints it (indented JSON), for the page's embedded copy."""
    return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()


def render(template: str, **context: Any) -> str:
    """The named template filled in; `report` (the JSON document) is embedded in every page."""
    report = context["report"]
    return _environment().get_template(template).render(report_json=page_json(report), **context)


def check_writable(path: str) -> str | None:
    """Why a page cannot be written to `path`, or None: asked before a long run, so that
    minutes of sampling are not lost to a mistyped folder."""
    folder = Path(path).parent
    if not folder.is_dir():
        return f"--html {path}: the folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"--html {path}: the folder {folder} is not writable"
    if Path(path).is_dir():
        return f"--html {path} is a folder"
    return None


def write_page(path: str, html: str) -> None:
    """Replace `path` with the page in one rename (a reader never sees half of it)."""
    write_atomic(path, html.encode(), "HTML report")
