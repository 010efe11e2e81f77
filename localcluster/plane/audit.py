"""The API server's audit log: the policy it records under and the reading of what it recorded.

The least-privilege tests hold each tmi server to what its Role grants by reading every request
its ServiceAccount made; the API server writes those requests (localcluster/data/audit-policy.yaml
says which) as JSON lines, and this module turns them back into one event per request.
"""

from __future__ import annotations

import json
from pathlib import Path

from localcluster.plane.components import data_text
from localcluster.plane.kube import JSON

POLICY_FILE = "audit-policy.yaml"
LOG_FILE = "audit.log"


def audit_args(workdir: Path) -> list[str]:
    """The API server's audit flags, with the shipped policy written into ``workdir``."""
    policy = workdir / POLICY_FILE
    policy.write_text(data_text(POLICY_FILE))
    return [
        # What ServiceAccounts do, so a test can hold each server to its Role.
        f"--audit-policy-file={policy}",
        f"--audit-log-path={workdir / LOG_FILE}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",
    ]


def audit_events(log: Path, user: str | None = None) -> list[JSON]:
    """The requests recorded in ``log`` so far, once each, for ``user`` if given. A watch is
    recorded when its response starts; it completes only when the watch ends."""
    if not log.is_file():
        return []
    events: dict[str, JSON] = {}
    for line in log.read_text().splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        if event.get("stage") not in ("ResponseStarted", "ResponseComplete"):
            continue
        if user is None or event.get("user", {}).get("username") == user:
            events.setdefault(event["auditID"], event)
    return list(events.values())
