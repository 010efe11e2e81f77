"""One real node a machine: the lock a test run or the demo holds while its node runs.

The kubelet's device-plugin directory and the Pod network's bridge are the machine's, not a
run's: two runs that each started a node would share, then remove, each other's. So a run takes
this lock from its node plane's start to its end, and a second run on the machine (two
`make test` at once) waits its turn rather than failing.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

LOCK = Path("/run/lock/tmi-realnode.lock")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
# How long a second run waits for the real node another run holds: a whole `make test`.
LOCK_WAIT_SECONDS = 2400.0


class RealNodeError(RuntimeError):
    """The node could not start or answer; the message says which part and where its log is."""


# This process's hold on LOCK, if it has one: a run that holds the machine for its node's control
# plane (the Pod network's bridge is the machine's too) starts the node itself without waiting.
_HELD: list[IO[str]] = []


def hold_machine() -> IO[str] | None:
    """Take the machine's real-node lock for this process, or None when it holds it already.

    One real node a machine: the kubelet's device-plugin directory and the Pod network's bridge
    are the machine's. A second test run (two `make test` at once) waits its turn, for as long
    as a whole run holds the node (`LOCK_WAIT_SECONDS`, or `TMI_REALNODE_LOCK_WAIT`), then fails
    saying why."""
    if _HELD:
        return None
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    handle = LOCK.open("w")
    limit = float(os.environ.get("TMI_REALNODE_LOCK_WAIT", LOCK_WAIT_SECONDS))
    deadline = time.monotonic() + limit
    told = False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.close()
                raise RealNodeError(
                    f"another real node runs on this machine ({LOCK} stayed locked for "
                    f"{limit:.0f} s): the kubelet's device-plugin directory "
                    f"{DEVICE_PLUGIN_DIR} and the Pod network's bridge are one per machine"
                ) from None
            if not told:
                print(f"waiting for {LOCK}: another run holds this machine's real node")
                told = True
            # A lock has no readiness to watch; flock's blocking form cannot time out.
            time.sleep(1.0)
    _HELD.append(handle)
    return handle


def release_machine(handle: IO[str] | None) -> None:
    """Let go of what `hold_machine` took (None: nothing was taken)."""
    if handle is not None:
        _HELD.remove(handle)
        handle.close()
