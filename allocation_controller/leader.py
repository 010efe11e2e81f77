"""Leader election on a coordination.k8s.io/v1 Lease, so two replicas never both write.

The kubernetes client's `leaderelection` package runs on threads and blocking calls; this is
the same algorithm as client-go's, on asyncio, over the `LeasePort`, so the fake can test it.

Safety rests on three rules, all timed on this process's monotonic clock (never by comparing
the timestamps in the Lease with our own wall clock, which may be skewed):

1. A candidate takes the Lease only after it has seen the same record, unchanged, for a whole
   `lease_duration` (or the record is released: no holder). Each write is a compare-and-swap on
   resourceVersion, so of two candidates racing for one record, one gets a 409.
2. The holder counts itself leader only until `renew_deadline` after the *start* of its last
   successful renewal. `renew_deadline < lease_duration`, so the old leader stops writing
   before anyone else may start: the other replica first saw that renewal no earlier than it
   was made, and then waits a full `lease_duration`.
3. `is_leader()` is asked right before each write, not once per reconcile.

The margin (`lease_duration - renew_deadline`, 5s by default) must cover one API request in
flight, so the controller's API timeout is kept below it. On shutdown the Lease is released
(holder emptied), so the other replica takes over at its next round (one retry period) rather
than after the Lease expires.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from allocation_controller.ports import JSON, ApiError, Conflict, LeasePort
from inference_policy.base.pod_view import ObjectView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaderSettings:
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs retry period < renew deadline < lease duration; got "
                f"{self.retry_period}, {self.renew_deadline}, {self.lease_duration}"
            )


class Leadership(Protocol):
    """Whether this replica may write now; asked right before each write (rule 3)."""

    def is_leader(self) -> bool: ...


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api: LeasePort,
        settings: LeaderSettings,
        *,
        namespace: str,
        on_started: Callable[[], None] | None = None,
        on_stopped: Callable[[], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] | None = None,
    ) -> None:
        self.api = api
        self.settings = settings
        self.namespace = namespace
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.monotonic = monotonic
        self.wall = wall or (lambda: datetime.now(UTC))
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self.leading = False
        self.transitions = 0

    @property
    def identity(self) -> str:
        return self.settings.identity

    def is_leader(self) -> bool:
        renewed = self._renewed_at
        return renewed is not None and self.monotonic() < renewed + self.settings.renew_deadline

    def _spec(self, acquire: str, now: str, transitions: int) -> JSON:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.settings.lease_duration),
            "acquireTime": acquire,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    async def try_acquire_or_renew(self) -> bool:
        """One round of the election; True if this replica holds the Lease afterwards."""
        started = self.monotonic()
        now = _micro_time(self.wall())
        try:
            lease = await self.api.get_lease(self.settings.name)
            if lease is None:
                body: JSON = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.settings.name, "namespace": self.namespace},
                    "spec": self._spec(now, now, 0),
                }
                created = await self.api.create_lease(body)
                return self._won(created, started)
            stored = ObjectView(lease)
            spec = stored.spec
            holder = spec.get("holderIdentity") or ""
            record = (
                holder,
                spec.get("renewTime"),
                spec.get("acquireTime"),
                stored.resource_version,
            )
            if record != self._observed:
                self._observed = record
                self._observed_at = started
            duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration)
            if holder and holder != self.identity and started < self._observed_at + duration:
                return False
            mine = holder == self.identity
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
            acquire = spec.get("acquireTime") if mine and spec.get("acquireTime") else now
            updated = dict(lease)
            updated["spec"] = {**spec, **self._spec(str(acquire), now, transitions)}
            written = await self.api.replace_lease(self.settings.name, updated)
            return self._won(written, started)
        except Conflict:
            return False
        except ApiError as exc:
            log.warning("leader election on Lease %s failed: %s", self.settings.name, exc)
            return False
        except (OSError, TimeoutError) as exc:
            log.warning("leader election on Lease %s failed: %s", self.settings.name, exc)
            return False

    def _won(self, lease: JSON, started: float) -> bool:
        stored = ObjectView(lease)
        spec = stored.spec
        self._observed = (
            spec.get("holderIdentity") or "",
            spec.get("renewTime"),
            spec.get("acquireTime"),
            stored.resource_version,
        )
        self._observed_at = started
        self._renewed_at = started
        return True

    def _update_state(self) -> None:
        leader = self.is_leader()
        if leader and not self.leading:
            self.leading = True
            self.transitions += 1
            log.info("leading: this replica (%s) holds Lease %s", self.identity, self.settings.name)
            if self.on_started is not None:
                self.on_started()
        elif not leader and self.leading:
            self.leading = False
            log.warning("lost the Lease %s; stopped writing", self.settings.name)
            if self.on_stopped is not None:
                self.on_stopped()

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign and renew until `stop` is set, then release the Lease if held."""
        try:
            while not stop.is_set():
                await self.try_acquire_or_renew()
                self._update_state()
                period = self.settings.retry_period
                if not self.leading:
                    period *= 1 + random.random() * 0.2  # noqa: S311 - jitter, not security
                else:
                    # Wake up in time to notice a missed deadline even if renewals hang.
                    assert self._renewed_at is not None
                    left = self._renewed_at + self.settings.renew_deadline - self.monotonic()
                    period = max(0.0, min(period, left))
                try:
                    async with asyncio.timeout(period):
                        await stop.wait()
                except TimeoutError:
                    pass
        finally:
            if self.leading or self.is_leader():
                await self.release()
            if self.leading:
                self.leading = False
                if self.on_stopped is not None:
                    self.on_stopped()

    async def release(self) -> None:
        """Hand the Lease back (holder emptied), so another replica need not wait for expiry."""
        self._renewed_at = None
        try:
            lease = await self.api.get_lease(self.settings.name)
            spec = ObjectView(lease).spec
            if lease is None or spec.get("holderIdentity") != self.identity:
                return
            updated = dict(lease)
            now = _micro_time(self.wall())
            updated["spec"] = {
                **spec,
                "holderIdentity": None,
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
            }
            await self.api.replace_lease(self.settings.name, updated)
            log.info("released Lease %s", self.settings.name)
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("could not release Lease %s: %s", self.settings.name, exc)
