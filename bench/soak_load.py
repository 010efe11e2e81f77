"""What `soak.py` sends its servers and how it judges each answer: the fixture (a signed
profile, a fleet of GPU nodes and bound engine Pods), the calls built from it, the checks each
answer must pass, and the open-loop pacing. Kept apart from the soak's running of the servers so
each stays readable on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

# -- the fixture: profile, nodes, bound Pods --------------------------------------------------


def fixture() -> dict[str, Any]:
    from kits.extenderkit import (
        block,
        bound,
        fleet_envelope,
        plan_for,
        planned_pod,
        published,
    )
    from kits.fleetkit import A100_MIG, CPU, h100
    from kits.profilekit import Owner, request

    owner = Owner()
    envelope = fleet_envelope(owner)
    nodes = [h100(f"h100-{i}") for i in range(6)] + [A100_MIG, CPU]
    whole = plan_for(owner, envelope, request(inferenceResources=block("nvidia-whole")))
    mig = plan_for(owner, envelope, request(inferenceResources=block("nvidia-mig-3g40gb")))
    pods = [bound(planned_pod(whole), f"h100-{i % 6}") for i in range(12)]
    pods += [bound(planned_pod(mig), "a100-mig")]
    return {
        "owner": owner,
        "configmap": published(owner.sign(envelope)),
        "envelope": envelope,
        "nodes": [n.manifest() for n in nodes],
        "pods": pods,
        "plans": {"whole": whole, "mig": mig},
    }


# -- the load ----------------------------------------------------------------------------------


class Load:
    """Builds each call's body and says what its answer must be."""

    def __init__(self, fixture: dict[str, Any]) -> None:
        from kits.extenderkit import cache_args, full_args, planned_pod
        from kits.profilekit import request
        from kits.webhookkit import engine_pod, plain_pod, review

        self._review = review
        self._engine_pod = engine_pod
        self._request = request
        self.repeated_pod = engine_pod(request())
        self.forged_pod = plain_pod(
            containers=[
                {"name": "app", "image": "app", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        )
        names = [n["metadata"]["name"] for n in fixture["nodes"]]
        whole = planned_pod(fixture["plans"]["whole"])
        mig = planned_pod(fixture["plans"]["mig"])
        self.extender_calls = [
            ("filter", orjson.dumps(cache_args(whole, names))),
            ("filter", orjson.dumps(full_args(mig, fixture["nodes"]))),
            ("prioritize", orjson.dumps(cache_args(whole, names))),
            ("prioritize", orjson.dumps(cache_args(mig, names))),
        ]
        self.node_count = len(names)
        self.index = 0

    def review(self) -> tuple[bytes, str, bool]:
        """The next review body, its uid, and whether it must be allowed."""
        self.index += 1
        uid = f"00000000-0000-4000-8000-{self.index:012d}"
        kind = self.index % 10
        if kind < 5:
            pod, allowed = self.repeated_pod, True
        elif kind < 9:
            body = self._request(model__weightsBytes=4_000_000_000 + self.index)
            pod, allowed = self._engine_pod(body), True
        else:
            pod, allowed = self.forged_pod, False
        return orjson.dumps(self._review(pod, uid=uid)), uid, allowed


async def post(
    client: aiohttp.ClientSession, url: str, body: bytes, judge: Callable[[bytes], str | None]
) -> str | None:
    """POST one JSON body; what is wrong with the answer (`judge` reads a 200's body), or
    None. A failed or timed-out call is a problem too, never an exception."""
    try:
        async with client.post(
            url,
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=5),
        ) as resp:
            data = await resp.read()
        return f"status {resp.status}" if resp.status != 200 else judge(data)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"


def check_review(data: bytes, uid: str, allowed: bool) -> str | None:
    answer = orjson.loads(data)
    response = answer.get("response") or {}
    if answer.get("kind") != "AdmissionReview" or response.get("uid") != uid:
        return "review answer without the request's uid"
    if response.get("allowed") is not allowed:
        return f"review allowed={response.get('allowed')}, expected {allowed}"
    return None


def check_extender(verb: str, data: bytes, nodes: int) -> str | None:
    answer = orjson.loads(data)
    if verb == "prioritize":
        if not isinstance(answer, list) or len(answer) != nodes:
            return "prioritize answer is not one score per node"
        return None
    if answer.get("Error"):
        return f"filter Error: {answer['Error']}"
    kept = answer["NodeNames"] if answer.get("NodeNames") is not None else answer["Nodes"]["items"]
    failed = len(answer["FailedNodes"]) + len(answer["FailedAndUnresolvableNodes"])
    if not kept or len(kept) + failed != nodes:
        return "filter answer does not account for every node, or passes none"
    return None


async def paced(rate: float, seconds: float, call: Any, stop: asyncio.Event) -> None:
    """Start `call()` at `rate` per second for `seconds`, open-loop (a slow answer does not
    slow the schedule), then wait for the calls in flight."""
    loop = asyncio.get_running_loop()
    begin = loop.time()
    inflight: set[asyncio.Task[None]] = set()
    index = 0
    while not stop.is_set():
        due = begin + index / rate
        if due - begin >= seconds:
            break
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(call())
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        index += 1
    if inflight:
        await asyncio.wait(inflight)


__all__ = ["Load", "check_extender", "check_review", "fixture", "paced", "post"]
