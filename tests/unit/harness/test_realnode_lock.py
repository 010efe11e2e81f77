"""One real node a machine: a second run waits its turn for the node's lock, then fails saying
why, rather than failing at once when two test runs share a machine."""

from __future__ import annotations

import fcntl
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from localcluster.nodes import machine_lock
from localcluster.nodes.machine_lock import RealNodeError, hold_machine, release_machine
from localcluster.nodes.realnode import RealNode


def _node() -> RealNode:
    # Only the lock is exercised: nothing else of the node is read.
    fields: dict[str, Any] = dict.fromkeys(
        ("plane", "name", "workdir", "bins", "fixture", "network")
    )
    return RealNode(**fields)


@pytest.fixture
def lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "run" / "tmi-realnode.lock"
    monkeypatch.setattr(machine_lock, "LOCK", path)
    # This process's own hold, as an e2e session in the same run may have one already.
    monkeypatch.setattr(machine_lock, "_HELD", [])
    return path


def test_a_second_node_waits_for_the_first_to_let_go(
    lock: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TMI_REALNODE_LOCK_WAIT", "45")
    lock.parent.mkdir(parents=True)
    holder = lock.open("w")
    fcntl.flock(holder, fcntl.LOCK_EX)
    released = threading.Event()

    def let_go() -> None:
        # Once the waiter has said it waits, the first run ends (in any case within the
        # waiter's limit, so a waiter that never says so fails rather than hangs).
        deadline = time.monotonic() + 30
        while "waiting for" not in capsys.readouterr().out and time.monotonic() < deadline:
            released.wait(0.05)
        holder.close()
        released.set()

    thread = threading.Thread(target=let_go)
    thread.start()
    node = _node()
    node._take_lock()
    thread.join()
    assert released.is_set() and node._lock is not None
    release_machine(node._lock)


def test_a_node_held_too_long_fails_naming_the_lock(
    lock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMI_REALNODE_LOCK_WAIT", "0")
    lock.parent.mkdir(parents=True)
    holder = lock.open("w")
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(RealNodeError, match="stayed locked for 0 s"):
            _node()._take_lock()
    finally:
        holder.close()


def test_a_run_that_holds_the_machine_starts_its_node_without_waiting(lock: Path) -> None:
    held = hold_machine()
    assert held is not None
    try:
        node = _node()
        node._take_lock()
        assert node._lock is None
    finally:
        release_machine(held)
    again = hold_machine()
    assert again is not None
    release_machine(again)
