"""Progress of the owner CLI's long commands (`tmi evidence --samples N`, `tmi capacity`) on
a terminal, and silence anywhere else.

Sampling a GPU host twenty times three seconds apart, or replaying a long list of deployments,
looks hung without a sign of life; but the same commands run in pipelines, DaemonSets and CI,
where a bar's control sequences would litter the logs. So the bar is drawn (by rich, on standard
error, erased when done) only when standard error is a terminal; the report on standard output
is never touched.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["Advance", "progress"]

Advance = Callable[[], None]


def _quiet() -> None:
    return None


@contextmanager
def progress(description: str, total: int, stream: TextIO | None = None) -> Iterator[Advance]:
    """A bar of `total` steps on `stream` (standard error) while the block runs; yields the
    function that marks one step done. Nothing is written when the stream is not a terminal,
    nor for fewer than two steps (one step is no progress to show)."""
    out = stream if stream is not None else sys.stderr
    if total < 2 or not out.isatty():
        yield _quiet
        return
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(file=out), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda: bar.advance(task)
