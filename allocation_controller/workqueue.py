"""A work queue of Pod names with client-go's guarantees, for asyncio.

* A key is queued at most once, however many events arrive for it before a worker takes it.
* A key is never handled by two workers at once: added while being handled, it is queued again
  when the handler finishes, so the last change is always looked at.
* `add_after` is a timer, not a poll: a Pod whose scheduling deadline is in five minutes costs
  one timer handle until then. Only the earliest pending timer per key is kept.
* `add_rate_limited` backs off per key (exponential, capped) until `forget` resets it, so a
  failing Pod is retried without hammering the API server or starving the others.
"""

from __future__ import annotations

import asyncio
from collections import deque


class ShutDown(Exception):
    """The queue was shut down while a worker waited on it."""


class WorkQueue:
    def __init__(self, *, base_delay: float = 0.01, max_delay: float = 120.0) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._ready = asyncio.Event()
        self._shutdown = False
        self.adds = 0

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def pending_timers(self) -> int:
        return len(self._timers)

    def add(self, key: str) -> None:
        if self._shutdown or key in self._dirty:
            return
        self.adds += 1
        self._dirty.add(key)
        if key in self._processing:
            return
        self._queue.append(key)
        self._notify()

    def _notify(self) -> None:
        # Every waiting worker wakes and all but one find the queue empty again; with a handful
        # of workers that is cheaper than a condition, whose lock a plain callback cannot take.
        self._ready.set()

    def add_after(self, key: str, delay: float) -> None:
        if self._shutdown:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        existing = self._timers.get(key)
        if existing is not None:
            if existing.when() <= due:
                return
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: str) -> float:
        """Queue the key again after its backoff; returns the delay chosen."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.base_delay * 2.0**failures, self.max_delay)
        self.add_after(key, delay)
        return delay

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        """The key succeeded: its next failure starts the backoff from the beginning."""
        self._failures.pop(key, None)

    def cancel_timer(self, key: str) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    async def get(self) -> str:
        while not self._queue:
            if self._shutdown:
                raise ShutDown
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._notify()

    def clear(self) -> None:
        """Drop everything queued and every timer (leadership lost: the next leader re-lists)."""
        self._queue.clear()
        self._dirty.clear()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._failures.clear()

    def shutdown(self) -> None:
        self._shutdown = True
        self.clear()
        self._ready.set()
