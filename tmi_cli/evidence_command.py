"""The `tmi evidence` command line: flags, files, the report on stdout, and the exit status.

Kept apart from `tmi_cli.main` so the owner CLI's other commands do not grow with it; main only
registers the subcommand. Exit status: 0 every share honoured and no process outside a grant,
1 a share not honoured, a process outside every grant, or a memory-pressure Pod that did not end
in a CUDA out-of-memory error, 2 a usage error, 3 inconclusive (the GPUs or some process's memory
or Pod could not be read).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import orjson

from inference_policy.evidence import EvidenceError
from inference_policy.tools.detection import DetectionError
from policy_io.files import InputError, read_bytes, read_json
from tmi_cli.evidence import (
    EvidenceRequest,
    gather,
    load_pods,
    pods_from_api,
    post_report,
    status_of,
)
from tmi_cli.gpu_processes import open_reader
from tmi_cli.progress import progress
from tmi_cli.report_evidence import evidence_page
from tmi_cli.report_page import check_writable, write_page

__all__ = ["EXIT_BY_STATUS", "add_evidence_parser", "cmd_evidence"]

EXIT_BY_STATUS = {"honoured": 0, "not-honoured": 1, "inconclusive": 3}
EXIT_USAGE, EXIT_INCONCLUSIVE = 2, 3
# `kubectl get pods -A -o json` of a busy cluster runs to tens of MiB.
MAX_PODS_BYTES = 64 * 1024 * 1024
MAX_LOG_BYTES = 8 * 1024 * 1024


def _usage(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return EXIT_USAGE


def cmd_evidence(args: argparse.Namespace) -> int:
    node = args.node or os.environ.get("NODE_NAME") or None
    if args.pods_from_api and not node:
        return _usage("--pods-from-api needs --node (or NODE_NAME)")
    if len(args.job_log) > len(args.job_pod):
        return _usage("each --job-log belongs to the --job-pod at the same position")
    if args.post and not args.token_file:
        return _usage("--post needs --token-file")
    if args.html and (problem := check_writable(args.html)):
        return _usage(problem)
    jobs = []
    for i, path in enumerate(args.job_pod):
        log = None
        if i < len(args.job_log):
            log = read_bytes(args.job_log[i], "job log", MAX_LOG_BYTES).decode("utf-8", "replace")
        jobs.append((read_json(path, "job Pod", MAX_PODS_BYTES), log))
    token = read_bytes(args.token_file, "token", 4096).decode().strip() if args.token_file else ""

    while True:
        try:
            pods: list[dict[str, Any]] = []
            if args.pods:
                pods = load_pods(read_json(args.pods, "Pods", MAX_PODS_BYTES))
            elif args.pods_from_api:
                pods = pods_from_api(str(node), args.kubeconfig)
            sampling = 0 if args.skip_gpus else args.samples
            with progress("sampling the GPUs", sampling) as taken_one:
                report = gather(
                    EvidenceRequest(
                        node=node,
                        pods=pods,
                        samples=args.samples,
                        interval=args.interval,
                        proc=args.proc,
                        jobs=jobs,
                        read_gpus=not args.skip_gpus,
                    ),
                    open_reader,
                    taken_one=taken_one,
                )
            sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
            sys.stdout.flush()
            if args.post:
                post_report(args.post, token, report)
            status = EXIT_BY_STATUS.get(status_of(report), EXIT_INCONCLUSIVE)
            if args.html:
                write_page(args.html, evidence_page(report))
        except EvidenceError as exc:
            sys.stderr.write(f"error: {exc}\n")
            status = 1
        except DetectionError as exc:
            sys.stderr.write(f"error: {exc}\n")
            status = EXIT_INCONCLUSIVE
        except InputError as exc:
            # The page could not be written: fatal once, retried by a reporter loop.
            if not args.every:
                raise
            sys.stderr.write(f"error: {exc}\n")
        if not args.every:
            return status
        # A reporter loop: a failed round is logged and retried, never fatal.
        time.sleep(args.every)


def _positive(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 1 to 3600")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 0 to 3600 seconds")
    return value


def add_evidence_parser(sub: Any) -> None:
    p = sub.add_parser(
        "evidence",
        help="on a GPU host: which Pod holds which physical GPU, who overlaps, and whether "
        "each granted share is honoured (JSON report; exit 0 only when every share is)",
    )
    pods = p.add_mutually_exclusive_group()
    pods.add_argument(
        "--pods", metavar="FILE", help="Pods with their plans: `kubectl get pods -A -o json`"
    )
    pods.add_argument(
        "--pods-from-api",
        action="store_true",
        help="read this node's Pods from the API server (in-cluster, else --kubeconfig)",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="for the API read (else $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    p.add_argument("--node", metavar="NAME", help="this node's name (default $NODE_NAME)")
    p.add_argument("--samples", type=_positive, default=1, metavar="N", help="samples to take")
    p.add_argument(
        "--interval", type=_seconds, default=2.0, metavar="S", help="seconds between samples"
    )
    p.add_argument(
        "--proc", default="/proc", metavar="DIR", help="the host's /proc (default /proc)"
    )
    p.add_argument(
        "--job-pod",
        action="append",
        default=[],
        metavar="FILE",
        help="a finished memory-pressure Pod (`kubectl get pod -o json`) to classify",
    )
    p.add_argument(
        "--job-log",
        action="append",
        default=[],
        metavar="FILE",
        help="that Pod's log (`kubectl logs`), in the same order as --job-pod",
    )
    p.add_argument(
        "--skip-gpus",
        action="store_true",
        help="read no GPU: only classify --job-pod (off the GPU host)",
    )
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write the report as one self-contained HTML page (timelines per GPU, "
        "grants against use, the verdict's checks; the JSON inside)",
    )
    p.add_argument("--post", metavar="URL", help="PUT the report to the collector at URL")
    p.add_argument("--token-file", metavar="FILE", help="bearer token for --post")
    p.add_argument(
        "--every",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="repeat every S seconds (a reporter DaemonSet); 0: once",
    )
    p.set_defaults(func=cmd_evidence)
