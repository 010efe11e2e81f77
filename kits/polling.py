"""Waiting in async tests for a condition that something else makes true, up to a deadline.

A test that sleeps for "long enough" is slow on an idle machine and flaky on a loaded one; these
helpers check the real condition often and give up only at a generous deadline, naming what was
awaited, so a timeout reads as the failure it is rather than as an unexplained assertion.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
DEFAULT_INTERVAL = 0.01


class Timeout(AssertionError):
    """The awaited condition did not hold by the deadline."""


async def eventually(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
) -> T:
    """The first truthy value of `check()`, called every `interval` seconds until `timeout`."""
    return await eventually_async(_awaitable(check), what=what, timeout=timeout, interval=interval)


async def eventually_async(
    probe: Callable[[], Awaitable[T | None]],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """The first truthy value `probe()` resolves to, awaited every `interval` seconds until
    `timeout`. Exceptions of the `ignoring` types count as "not yet" (a server still starting
    refuses connections); the last one is named on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = await probe()
        except ignoring as exc:
            last = exc
        else:
            if value:
                return value
        if loop.time() >= deadline:
            detail = f" (last error: {last!r})" if last is not None else ""
            raise Timeout(f"timed out after {timeout:g}s waiting for {what}{detail}")
        await asyncio.sleep(interval)


def _awaitable(check: Callable[[], T | None]) -> Callable[[], Awaitable[T | None]]:
    async def probe() -> T | None:
        return check()

    return probe
