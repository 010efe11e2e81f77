"""`tmi capacity`: what a list of deployments would get on a profile and a fleet, before any is
deployed.

The owner gives the signed profile and its trust (the flags of `tmi plan`), the deployments (a
JSON list of `{"name", "request"}`, or engine Pods as `kubectl get pods -o json` prints them,
read by their request annotation) and the fleet (`kubectl get nodes -o json`, or a list of
Nodes: GFD labels and allocatable are what count). The replay is `inference_policy.capacity`'s:
the servers' own planning and placement, in order. Prints a table, or with `-o json` the report.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from inference_policy.capacity import Deployment, Report, replay
from inference_policy.wire import ENGINE_LABEL, REQUEST_ANNOTATION
from policy_io.files import read_json
from tmi_cli.policy_args import (
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    add_policy_arguments,
    now_from,
    policy_state,
)


def _items(document: Any, what: str, path: str) -> list[Any]:
    if isinstance(document, dict) and isinstance(document.get("items"), list):
        return list(document["items"])
    if isinstance(document, list):
        return document
    raise CommandError(f"{what} {path} must be a JSON list or an object with items", EXIT_USAGE)


def _deployments(path: str) -> list[Deployment]:
    out: list[Deployment] = []
    for i, item in enumerate(_items(read_json(path, "deployments"), "deployments", path)):
        if not isinstance(item, dict):
            raise CommandError(f"deployments {path}: item {i} is not an object", EXIT_USAGE)
        if item.get("kind") == "Pod":
            meta = item.get("metadata") or {}
            text = (meta.get("annotations") or {}).get(REQUEST_ANNOTATION)
            if not isinstance(text, str):
                raise CommandError(
                    f"deployments {path}: Pod {meta.get('name')} has no {REQUEST_ANNOTATION}",
                    EXIT_USAGE,
                )
            try:
                request = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                raise CommandError(
                    f"deployments {path}: Pod {meta.get('name')}'s request is not JSON: {exc}",
                    EXIT_USAGE,
                ) from None
            name = (meta.get("labels") or {}).get(ENGINE_LABEL) or meta.get("name") or f"#{i}"
            out.append(Deployment(str(name), request))
        elif isinstance(item.get("name"), str) and "request" in item:
            out.append(Deployment(item["name"], item["request"]))
        else:
            raise CommandError(
                f'deployments {path}: item {i} is neither a Pod nor {{"name", "request"}}',
                EXIT_USAGE,
            )
    return out


def _nodes(path: str) -> list[dict[str, Any]]:
    nodes = _items(read_json(path, "fleet"), "fleet", path)
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or not (node.get("metadata") or {}).get("name"):
            raise CommandError(f"fleet {path}: item {i} is not a named Node", EXIT_USAGE)
    return nodes


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def render(report: Report) -> str:
    """The report as the tables a person reads."""
    parts = []
    rows: list[tuple[str, ...]]
    if report.placed:
        rows = [("DEPLOYMENT", "NODE", "BINDING", "GRANTED")]
        for p in report.placed:
            granted = ",".join(f"{k}={v}" for k, v in sorted(p.resources.items())) or "-"
            rows.append((p.name, p.node, p.binding, granted))
        parts.append("placed\n" + _table(rows))
    if report.waiting:
        rows = [("DEPLOYMENT", "BINDING", "CODE", "WHY")]
        rows += [(w.name, w.binding, w.code, w.reason) for w in report.waiting]
        parts.append("waiting\n" + _table(rows))
    if report.refused:
        rows = [("DEPLOYMENT", "STATUS", "CODE", "DETAIL")]
        rows += [(r.name, str(r.status), r.code or "-", r.detail) for r in report.refused]
        parts.append("refused at admission\n" + _table(rows))
    if report.external:
        parts.append("external (no local resources): " + ", ".join(report.external))
    rows = [("NODE", "FREE")]
    for node, left in sorted(report.left.items()):
        rows.append((node, ",".join(f"{k}={v}" for k, v in left.items())))
    parts.append("left free\n" + (_table(rows) if len(rows) > 1 else "(none)"))
    if report.stranded:
        stranded = ", ".join(f"{k}={v}" for k, v in sorted(report.stranded.items()))
        parts.append(f"stranded (free while a deployment waited for it): {stranded}")
    return "\n\n".join(parts)


def cmd_capacity(args: argparse.Namespace) -> int:
    now = now_from(args.now)
    deployments = _deployments(args.deployments)
    nodes = _nodes(args.fleet)
    state = policy_state(args, now)
    report = replay(deployments, nodes, state.context(now))
    if args.output == "json":
        sys.stdout.buffer.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        sys.stdout.write(render(report) + "\n")
    sys.stdout.flush()
    return EXIT_OK


def add_capacity_parser(sub: Any) -> None:
    p = sub.add_parser(
        "capacity",
        help="replay deployment requests against a profile and a fleet: what is placed where, "
        "what waits and why, and the capacity left stranded",
    )
    add_policy_arguments(p)
    p.add_argument("--deployments", required=True, metavar="FILE")
    p.add_argument("--fleet", required=True, metavar="FILE")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_capacity)
