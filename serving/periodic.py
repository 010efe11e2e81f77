"""One background step repeated at an interval, for the servers' housekeeping loops.

The extender publishes room figures and reviews the allocation controller's rights on a timer;
each loop must survive a failing round (the next one starts over, and what the round feeds ages
out meanwhile) and stop cleanly at shutdown. This is that loop, written once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


class Periodic:
    """Runs `step` every `interval()` seconds from `start` until `stop`; a step that raises is
    logged (`what`, with `code`) and the loop goes on."""

    def __init__(
        self,
        step: Callable[[], Awaitable[object]],
        interval: Callable[[], float],
        log: logging.Logger,
        what: str,
        code: str,
    ) -> None:
        self._step = step
        self._interval = interval
        self._log = log
        self._what = what
        self._code = code
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except Exception:
                self._log.exception(self._what, extra={"code": self._code})
            await asyncio.sleep(self._interval())


__all__ = ["Periodic"]
