"""The API requests each system's whole path makes, from the API server's own audit log.

Per Pod bound, `tmi`'s path is its webhook, its extender and the kube-scheduler that calls it
(which binds); HAMi's is its scheduler process (webhook, extender, binder), the kube-scheduler
beside it and its device plugin (`hami_standin.py`). Each of these authenticates as a user of
its own, so the audit log says who made each request. The benchmark starts the API server with
the policy written here (`policy_args`: Metadata level for those users and every
ServiceAccount, nothing for anyone else, so the benchmark's own calls and KWOK's are not
recorded) and reads the log as it grows (`AuditTail`): each request once, when it completed,
with who made it and what it was.

Watches are left out of the counts: an informer's watch is one long request whose cost is the
events it carries, which the API server's CPU figure holds instead.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from localcluster.plane.audit import LOG_FILE


def policy_args(users: Iterable[str]) -> tuple[str, ...]:
    """API server flags recording every request of `users` and of ServiceAccounts outside
    kube-system; given after the plane's own audit flags, they replace its policy."""
    rules = [
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "Metadata", "users": sorted(set(users))},
        {"level": "None"},
    ]
    policy = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": rules,
    }
    directory = Path(tempfile.mkdtemp(prefix="tmi-peer-audit-"))
    path = directory / "audit-policy.json"
    path.write_text(json.dumps(policy))
    # Blocking (the plane's mode) writes each event before the response: the count is exact
    # when a window ends, and the write is the same small cost for every system's requests.
    return (f"--audit-policy-file={path}",)


@dataclass(frozen=True)
class Request:
    at: float
    user: str
    verb: str
    what: str
    code: int


class AuditTail:
    """The requests in the plane's audit log, read incrementally as it grows."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / LOG_FILE
        self.offset = 0
        self.requests: list[Request] = []
        self._ids: set[str] = set()

    def read(self) -> None:
        if not self.path.is_file():
            return
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        complete = data.rfind(b"\n") + 1
        self.offset += complete
        for line in data[:complete].splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete":
                continue
            audit_id = event["auditID"]
            if audit_id in self._ids:
                continue
            self._ids.add(audit_id)
            ref = event.get("objectRef") or {}
            what = ref.get("resource", event.get("requestURI", "?").split("?")[0])
            if ref.get("subresource"):
                what += f"/{ref['subresource']}"
            self.requests.append(
                Request(
                    at=datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp(),
                    user=event.get("user", {}).get("username", ""),
                    verb=event.get("verb", ""),
                    what=what,
                    code=int(event.get("responseStatus", {}).get("code", 0)),
                )
            )

    def count(self, users: Collection[str], start: float, end: float) -> dict[str, int]:
        """Requests of `users` received in [start, end] (wall-clock seconds), watches left
        out, by "verb resource" and in all ("total"), failed ones among them ("failed", and
        by kind and status code)."""
        self.read()
        counts: Counter[str] = Counter()
        for request in self.requests:
            if request.user not in users or not start <= request.at <= end:
                continue
            if request.verb == "watch":
                continue
            counts[f"{request.verb} {request.what}"] += 1
            counts["total"] += 1
            if request.code >= 400:
                counts["failed"] += 1
                counts[f"failed {request.verb} {request.what} {request.code}"] += 1
        return dict(sorted(counts.items()))

    def last_request(self, users: Collection[str]) -> float:
        """When the latest request of `users` was received (0 if none)."""
        self.read()
        return max((r.at for r in self.requests if r.user in users), default=0.0)


def per_pod(counts: dict[str, int], pods: int) -> dict[str, float]:
    """Requests a Pod bound: each kind and the total."""
    return {key: round(value / pods, 2) for key, value in counts.items()} if pods else {}


__all__ = ["AuditTail", "Request", "per_pod", "policy_args"]
