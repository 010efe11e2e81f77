"""`tmi diff` and `tmi test`: a revision compared with the last, and a suite run against one.

`tmi diff --old A --new B` verifies both signed profiles with the same trust flags (a revision
the servers would refuse is refused here, naming which), lists the bindings the new one adds,
removes or changes, and, with `--requests`, whose plan changes. `tmi test --suite FILE` plans
each case's request against the profile and checks what it must get, with a report and an exit
status that say which cases failed. Both decide through the core
(`inference_policy.tools.revisions_compare`) with the state `tmi plan` uses.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, model_validator

from inference_policy.base.errors import describe
from inference_policy.base.strict import Strict
from inference_policy.tools.revisions_compare import binding_changes, plan_changes, run_case
from policy_io.files import read_json
from policy_io.snapshot import PolicySnapshot
from tmi_cli.output import add_output_arguments, emit
from tmi_cli.policy_args import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    add_policy_arguments,
    now_from,
    policy_snapshot,
)

Subparsers = Any


def _verified(args: argparse.Namespace, bundle: str, which: str, now: Any) -> PolicySnapshot:
    state = policy_snapshot(argparse.Namespace(**{**vars(args), "bundle": bundle}), now)
    if state.profile is None:
        refusal = state.profile_refusal
        reason = refusal.authorization_message if refusal is not None else "not read"
        raise CommandError(f"{which} revision {bundle}: {reason}")
    return state


class _Named(Strict):
    name: Annotated[str, Field(min_length=1, max_length=253)]
    request: Any


class _Case(Strict):
    name: Annotated[str, Field(min_length=1, max_length=253)]
    request: dict[str, Any] | None = None
    requestFile: str | None = None
    expect: dict[str, Any] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_request(self) -> _Case:
        if (self.request is None) == (self.requestFile is None):
            raise ValueError("give exactly one of request and requestFile")
        return self


class _Suite(Strict):
    schemaVersion: int = Field(ge=1, le=1)
    cases: list[_Case] = Field(min_length=1, max_length=10_000)


def _requests(path: str) -> list[tuple[str, Any]]:
    document = read_json(path, "requests")
    try:
        named = [_Named.model_validate(item) for item in document]
    except (ValidationError, TypeError) as exc:
        what = describe(exc) if isinstance(exc, ValidationError) else "not a list"
        raise CommandError(
            f"requests {path}: a list of {{name, request}} is expected: {what}"
        ) from None
    return [(n.name, n.request) for n in named]


def cmd_diff(args: argparse.Namespace) -> int:
    now = now_from(args.now)
    old, new = _verified(args, args.old, "old", now), _verified(args, args.new, "new", now)
    assert old.profile is not None and new.profile is not None
    report: dict[str, Any] = {
        "old": {"version": old.profile.version, "bundleSha256": old.profile.sha256},
        "new": {"version": new.profile.version, "bundleSha256": new.profile.sha256},
        "bindings": [c.wire() for c in binding_changes(old.profile.envelope, new.profile.envelope)],
    }
    if args.requests:
        report["plans"] = plan_changes(
            _requests(args.requests),
            old.context(now),
            new.context(now),
            old.options,
            new.options,
        )
    if new.profile.version <= old.profile.version:
        sys.stderr.write(
            f"warning: the new revision's version {new.profile.version} is not above the old "
            f"one's {old.profile.version}; the servers' rollback floor refuses it once the old "
            "one was used\n"
        )
    emit(report, args)
    return EXIT_OK


def cmd_test(args: argparse.Namespace) -> int:
    now = now_from(args.now)
    document = read_json(args.suite, "suite")
    try:
        suite = _Suite.model_validate(document)
    except ValidationError as exc:
        raise CommandError(f"suite {args.suite}: {describe(exc)}") from None
    state = policy_snapshot(args, now, disabled=args.disabled)
    ctx = state.context(now)
    base = Path(args.suite).parent if args.suite != "-" else Path(".")
    results = []
    for case in suite.cases:
        request = copy.deepcopy(case.request)
        if case.requestFile is not None:
            request = read_json(str(base / case.requestFile), f"case {case.name!r} request")
        results.append(run_case(case.name, request, case.expect, ctx, state.options))
    failed = [r for r in results if not r.passed]
    if args.output == "table":
        for result in results:
            sys.stdout.write(f"{'PASS' if result.passed else 'FAIL'}  {result.name}\n")
            for field, expected, got in result.mismatches:
                sys.stdout.write(f"      {field}: expected {expected!r}, got {got!r}\n")
        sys.stdout.write(f"{len(results) - len(failed)} passed, {len(failed)} failed\n")
    else:
        emit(
            {
                "passed": len(results) - len(failed),
                "failed": len(failed),
                "cases": [r.wire() for r in results],
            },
            args,
        )
    return EXIT_FAILED if failed else EXIT_OK


def add_revision_parsers(sub: Subparsers) -> None:
    p = sub.add_parser("diff", help="compare two signed profile revisions")
    add_policy_arguments(p)
    p.add_argument("--old", required=True, metavar="CONFIGMAP_FILE", help="the revision in use")
    p.add_argument("--new", required=True, metavar="CONFIGMAP_FILE", help="the one to publish")
    p.add_argument(
        "--requests",
        metavar="FILE",
        help="a list of {name, request}: report whose plan the new revision changes",
    )
    add_output_arguments(p)
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("test", help="run a suite of requests and expected plans against a profile")
    add_policy_arguments(p)
    p.add_argument(
        "--suite",
        required=True,
        metavar="FILE",
        help="schemaVersion 1, cases of {name, request | requestFile, expect} (JSON or YAML)",
    )
    p.add_argument("--disabled", action="store_true", help="tenant-mode inference off")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="the report's form (default table)",
    )
    p.add_argument("--output-file", metavar="FILE", help="write a json/yaml report to FILE")
    p.set_defaults(func=cmd_test)


__all__ = ["add_revision_parsers"]
