"""Progress of the binary builds (tools/k8sbin/build.sh, build-node.sh, build-fakedra.sh): each
component's turn, the time spent so far and an estimate of what is left.

A first build compiles Kubernetes, etcd, containerd and the rest from source, about a quarter
of an hour on two cores, with nothing on the screen for minutes at a time; a person cannot tell
a slow build from a stuck one. So each step says which component it is on, how long that one
took last time and how long the rest should take. The estimate is the last build's recorded time
of each component, kept in the cache beside the binaries (`~/.cache/tmi/build-times.json`, or
`$TMI_CACHE_DIR`), else the typical figure below, and the line says which it used.

The scripts run before the project's environment may exist, so this file needs the standard
library alone and is run by its path (`python3 .../build_progress.py step ...`, see
tools/k8sbin/lib.sh), never imported through the `localcluster` package there. Progress goes to
standard error: the scripts' standard output is the directory they built, read by the harness.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "TYPICAL_SECONDS",
    "BuildTimes",
    "Estimate",
    "duration",
    "estimate",
    "main",
    "records_path",
]

# Seconds each component takes to build from a cold Go cache on two cores (the development
# machines' and CI's size), rounded; used until a build here has recorded its own.
TYPICAL_SECONDS: Mapping[str, Mapping[str, float]] = {
    "controlplane": {
        "kubernetes": 420,  # kube-apiserver, kube-scheduler, kube-controller-manager, kubectl
        "etcd": 90,
        "kwok": 90,
        "helm": 100,
        "kustomize": 60,
        "tmi-oci": 30,
    },
    "node": {
        "kubelet": 240,  # with kube-proxy
        "containerd": 120,
        "runc": 45,
        "cni": 45,
        "nodetools": 30,
    },
    "fakedra": {"tmi-fakedra": 120},
}
# A component with neither a record nor a typical figure (one added since this table).
UNKNOWN_SECONDS = 60.0
RECORDS = "build-times.json"


def records_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the last build's times are kept: beside the cached binaries."""
    env = os.environ if environ is None else environ
    base = env.get("TMI_CACHE_DIR") or str(Path(env.get("HOME") or "~").expanduser() / ".cache/tmi")
    return Path(base) / RECORDS


class BuildTimes:
    """The recorded seconds of each build's components; an unreadable file reads as empty
    (it only ever improves an estimate)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, dict[str, float]] = {}
        try:
            raw: Any = json.loads(path.read_text())
        except (OSError, ValueError):
            raw = {}
        for build, components in raw.items() if isinstance(raw, dict) else ():
            if isinstance(components, dict):
                self.seconds[str(build)] = {
                    str(name): float(value)
                    for name, value in components.items()
                    if isinstance(value, int | float) and math.isfinite(value) and value >= 0
                }

    def record(self, build: str, component: str, seconds: float) -> None:
        """Keep `seconds` as the component's time, written in one rename (two builds running at
        once may each lose the other's figure, never corrupt the file)."""
        self.seconds.setdefault(build, {})[component] = round(seconds, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{RECORDS}.")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(self.seconds, handle, indent=1, sort_keys=True)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


class Estimate:
    """How long a component should take, and where the figure comes from."""

    def __init__(self, seconds: float, source: str) -> None:
        self.seconds = seconds
        self.source = source  # "last build", "typical" or "guess"


def estimate(build: str, component: str, times: BuildTimes) -> Estimate:
    recorded = times.seconds.get(build, {}).get(component)
    if recorded is not None:
        return Estimate(recorded, "last build")
    typical = TYPICAL_SECONDS.get(build, {}).get(component)
    if typical is not None:
        return Estimate(typical, "typical")
    return Estimate(UNKNOWN_SECONDS, "guess")


def duration(seconds: float) -> str:
    """ "45s", "3m05s", "1h02m" — what a person reads at a glance."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _sources(estimates: Sequence[Estimate]) -> str:
    used = sorted({e.source for e in estimates})
    return " and ".join(
        {"last build": "the last build's times", "typical": "typical figures", "guess": "guesses"}[
            source
        ]
        for source in used
    )


def plan_line(build: str, components: Sequence[str], times: BuildTimes) -> str:
    """What the build will do and about how long it takes, before it starts."""
    if not components:
        return f">> {build}: nothing to build"
    estimates = [estimate(build, c, times) for c in components]
    total = sum(e.seconds for e in estimates)
    return (
        f">> {build}: building {len(components)} component(s) ({', '.join(components)}), "
        f"about {duration(total)} ({_sources(estimates)})"
    )


def step_line(
    build: str,
    index: int,
    count: int,
    component: str,
    what: str,
    elapsed: float,
    later: Sequence[str],
    times: BuildTimes,
) -> str:
    """The line a step starts with: its turn, its estimate, the time spent and what is left
    (this component and the ones after it)."""
    this = estimate(build, component, times)
    left = this.seconds + sum(estimate(build, c, times).seconds for c in later)
    return (
        f">> [{index}/{count}] building {what}: about {duration(this.seconds)} ({this.source}); "
        f"{duration(elapsed)} elapsed, about {duration(left)} left"
    )


def done_line(build: str, component: str, seconds: float, times: BuildTimes) -> str:
    """The line a step ends with (the caller then records the time, for the next estimate)."""
    before = estimate(build, component, times)
    return (
        f">> {component} built in {duration(seconds)} "
        f"(estimated {duration(before.seconds)}, {before.source})"
    )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """`plan BUILD COMPONENT...`, `step BUILD INDEX COUNT ELAPSED COMPONENT WHAT [LATER...]`,
    `done BUILD COMPONENT SECONDS`, `finish BUILD SECONDS`: one line each, on standard error."""
    args = list(sys.argv[1:] if argv is None else argv)
    stream = sys.stderr if out is None else out
    times = BuildTimes(records_path())
    try:
        command, build, rest = args[0], args[1], args[2:]
        record: tuple[str, float] | None = None
        if command == "plan":
            line = plan_line(build, rest, times)
        elif command == "step":
            index, count, elapsed, component, what, *later = rest
            line = step_line(build, int(index), int(count), component, what,
                             float(elapsed), later, times)  # fmt: skip
        elif command == "done":
            component, seconds = rest
            line = done_line(build, component, float(seconds), times)
            record = (component, float(seconds))
        elif command == "finish":
            line = f">> {build}: built in {duration(float(rest[0]))}"
        else:
            raise ValueError(command)
    except (IndexError, ValueError):
        stream.write(f"build_progress: cannot read {' '.join(args)!r}\n")
        return 2
    stream.write(line + "\n")
    stream.flush()
    if record is not None:
        try:
            times.record(build, *record)
        except OSError as exc:
            # The build goes on; only the next build's estimate is lost.
            stream.write(f"build_progress: cannot keep the build time: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
