"""What every fuzz target shares: its budget, its counters, JSON strategies and an app driver.

Why it exists: the fuzz targets run twice, briefly in `make test` (a few hundred inputs each,
seconds) and at length in `make fuzz` (`TMI_FUZZ_EXAMPLES`, 100,000 inputs each). The budget
comes from the environment so the same tests serve both; the counters (inputs, forgeries tried,
forged grants found) are written as JSON under `TMI_FUZZ_STATS` when it is set, which is where
`tools/fuzz.py` collects the figures `RELIABILITY.md` reports.

`AppDriver` runs a server's real aiohttp app in-process behind aiohttp's test server (a real
loopback socket) on a loop of its own, so a synchronous Hypothesis test can post thousands of
bodies to one app without starting it again for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

QUICK_EXAMPLES = 150


def examples(quick: int = QUICK_EXAMPLES) -> int:
    """Inputs per target: `TMI_FUZZ_EXAMPLES` when set (make fuzz), else the quick size."""
    value = os.environ.get("TMI_FUZZ_EXAMPLES", "")
    return int(value) if value else quick


def fuzz_settings(quick: int = QUICK_EXAMPLES) -> settings:
    return settings(
        max_examples=examples(quick),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


@dataclass
class Stats:
    """What one target did: inputs, forgeries tried and found, and how its answers fell."""

    target: str
    inputs: int = 0
    forgeries_tried: int = 0
    forged_grants: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    # How many inputs carried each surface a target tries (an input may carry several).
    surfaces: dict[str, int] = field(default_factory=dict)

    def saw(self, outcome: str) -> None:
        self.inputs += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def tried(self, *surfaces: str) -> None:
        for surface in surfaces:
            self.surfaces[surface] = self.surfaces.get(surface, 0) + 1


@contextlib.contextmanager
def recorded(stats: Stats) -> Iterator[Stats]:
    """Time the target and write its counters under `TMI_FUZZ_STATS` (if set), even when it
    fails, so a failed run still reports how far it got."""
    started = time.perf_counter()
    try:
        yield stats
    finally:
        stats.seconds = round(time.perf_counter() - started, 1)
        directory = os.environ.get("TMI_FUZZ_STATS")
        if directory:
            path = Path(directory)
            path.mkdir(parents=True, exist_ok=True)
            (path / f"{stats.target}.json").write_text(json.dumps(asdict(stats), indent=2))


# -- JSON ----------------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["", "1", "-1", "0", "1Gi", "500m", "nvidia.com/gpu", "void", "all"])
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


def paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside `document` (dict keys and list indexes)."""
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found.extend(paths(value, (*prefix, key)))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found.extend(paths(value, (*prefix, index)))
    return found


def replace_at(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of `document` with the value at `path` replaced (the whole of it for ())."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(document, dict):
        return {**document, head: replace_at(document[head], rest, value)}
    copied = list(document)
    copied[head] = replace_at(document[head], rest, value)
    return copied


def chance(draw: st.DrawFn, percent: int) -> bool:
    """True about `percent` times in a hundred. Hypothesis favours the ends of a range (0, the
    maximum), so the true values sit in the middle, where its bias does not reach."""
    return 30 <= draw(st.integers(0, 99)) < 30 + percent


@st.composite
def mutated(draw: st.DrawFn, document: Any, most: int = 3) -> Any:
    """`document` with up to `most` values anywhere in it replaced by arbitrary JSON."""
    for _ in range(draw(st.integers(0, most))):
        path = draw(st.sampled_from(paths(document)))
        document = replace_at(document, path, draw(json_values))
    return document


@st.composite
def garbled(draw: st.DrawFn, body: bytes) -> bytes:
    """`body` cut short, spliced with random bytes, or replaced by them."""
    how = draw(st.sampled_from(["cut", "splice", "random", "bom", "deep"]))
    if how == "cut":
        return body[: draw(st.integers(0, max(len(body) - 1, 0)))]
    if how == "splice":
        at = draw(st.integers(0, len(body)))
        return body[:at] + draw(st.binary(max_size=16)) + body[at:]
    if how == "bom":
        return b"\xef\xbb\xbf" + body
    if how == "deep":
        depth = draw(st.integers(200, 5000))
        return b"[" * depth + b"]" * depth
    return draw(st.binary(max_size=256))


# -- driving an app ------------------------------------------------------------------------------


class Failure(AssertionError):
    """An oracle found the server wrong."""


class AppDriver:
    """One app behind aiohttp's test server, on its own loop, posted to synchronously."""

    def __init__(self, app: web.Application) -> None:
        self.loop = asyncio.new_event_loop()
        self.client: TestClient[Any, Any] = self.loop.run_until_complete(self._start(app))

    @staticmethod
    async def _start(app: web.Application) -> TestClient[Any, Any]:
        client: TestClient[Any, Any] = TestClient(TestServer(app))
        await client.start_server()
        return client

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        async def go() -> tuple[int, bytes]:
            async with self.client.post(
                path, data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                return resp.status, await resp.read()

        return self.loop.run_until_complete(go())

    def answer(self, path: str, body: bytes, accepted: bool, what: str) -> Any:
        """The decoded 200 answer to a body the server must accept; None once a body it must
        refuse got its 400. Any other status is a Failure naming `what` was sent."""
        status, data = self.post(path, body)
        if not accepted:
            if status != 400:
                raise Failure(f"{what} that must be refused got {status}: {data[:300]!r}")
            return None
        if status != 200:
            raise Failure(f"{what} got HTTP {status}: {data[:300]!r}")
        return orjson.loads(data)

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()
