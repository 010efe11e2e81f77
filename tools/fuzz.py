"""`make fuzz`: every fuzz target at full size, spread over the machine's cores, with one table.

Why it exists: `make test` runs each target of `tests/fuzz` for a few hundred inputs; this runs
each for `--examples` inputs (100,000 by default), one pytest process per target, at most
`--jobs` at once (longest first, so the run ends when the longest does), and gathers the
counters each target writes (inputs, forgeries tried, forged grants, seconds) into
`.artifacts/fuzz/summary.json` and a table on standard output. It exits 1 when a target failed
or any forged grant was found.

    .venv/bin/python tools/fuzz.py [--examples 100000] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".artifacts" / "fuzz"
# Longest first: the run lasts as long as its slowest job.
TARGETS = [
    ("deployment-requests", "tests/fuzz/test_fuzz_policy_inputs.py::test_fuzz_plan_api"),
    ("admission-reviews", "tests/fuzz/test_fuzz_admission.py::test_fuzz_admission_reviews"),
    ("plan-annotations", "tests/fuzz/test_fuzz_policy_inputs.py::test_fuzz_plan_annotations"),
    ("profile-configmaps", "tests/fuzz/test_fuzz_policy_inputs.py::test_fuzz_profile_configmaps"),
    ("extender-args", "tests/fuzz/test_fuzz_extender.py::test_fuzz_extender_args"),
    ("server-settings", "tests/fuzz/test_fuzz_policy_inputs.py::test_fuzz_server_settings"),
    ("status-patches", "tests/fuzz/test_fuzz_status.py::test_fuzz_status_patches"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--examples", type=int, default=100_000, help="inputs per target")
    parser.add_argument("--jobs", type=int, default=max(1, len(os.sched_getaffinity(0))))
    parser.add_argument("--only", nargs="*", help="target names to run (default: all)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMI_FUZZ_EXAMPLES": str(args.examples), "TMI_FUZZ_STATS": str(OUT)}
    pending = [t for t in TARGETS if not args.only or t[0] in args.only]
    running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    status: dict[str, int] = {}
    started = time.monotonic()
    while pending or running:
        while pending and len(running) < args.jobs:
            name, node = pending.pop(0)
            (OUT / f"{name}.json").unlink(missing_ok=True)
            log = (OUT / f"{name}.log").open("wb")
            command = [
                sys.executable,
                # -P: `-m` would otherwise put the source tree first on the path.
                "-P",
                "-m",
                "pytest",
                "-q",
                # The servers log every refusal; at this many inputs the log is only noise.
                "-o",
                "log_level=CRITICAL",
                "-p",
                "no:cacheprovider",
                "-o",
                "timeout=0",
                node,
            ]
            proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
            running[name] = (proc, time.monotonic())
            print(f"started {name}", flush=True)
        for name, (proc, began) in list(running.items()):
            if proc.poll() is not None:
                status[name] = proc.returncode
                del running[name]
                took = time.monotonic() - began
                print(f"finished {name}: exit {proc.returncode} in {took:.0f}s", flush=True)
        time.sleep(0.5)
    wall = time.monotonic() - started
    # Targets not run this time keep the row of the run before (with --only).
    summary_path = OUT / "summary.json"
    before = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    previous = {row["target"]: row for row in before.get("targets", [])}
    rows = []
    for name, _ in TARGETS:
        if name not in status:
            if name in previous:
                rows.append(previous[name])
            continue
        path = OUT / f"{name}.json"
        stats = json.loads(path.read_text()) if path.exists() else {}
        rows.append({"target": name, "exit": status[name], **stats})
    summary = {
        "examples_per_target": args.examples,
        "jobs": args.jobs,
        "wall_seconds": round(wall, 1),
        "targets": rows,
    }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{'target':<22}{'inputs':>10}{'forgeries':>11}{'forged':>8}{'seconds':>9}  result")
    for row in rows:
        result = "ok" if row["exit"] == 0 else f"FAILED (see {OUT}/{row['target']}.log)"
        print(
            f"{row['target']:<22}{row.get('inputs', 0):>10}{row.get('forgeries_tried', 0):>11}"
            f"{row.get('forged_grants', 0):>8}{row.get('seconds', 0):>9}  {result}"
        )
    print(f"wall time {wall:.0f}s on {args.jobs} jobs")
    failed = any(r["exit"] != 0 or r.get("forged_grants", 0) for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
