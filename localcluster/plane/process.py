"""Child-process supervision for the control-plane components.

Every component runs in its own process group with its output in a log file, so
teardown can signal the whole group (terminate, then kill) and a failing test can
show or keep the log. A registry of live processes is cleaned up at interpreter exit
and on SIGTERM/SIGHUP, and on Linux the children also get SIGKILL if this process
dies without running any Python cleanup, so an interrupted test run leaves nothing
behind holding ports.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()
_HANDLERS_INSTALLED = False


class ComponentError(RuntimeError):
    """A component failed to start or become ready; the message carries its log tail."""


def http_fetch(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """The status and body of a GET on a local server's fixed URL, an error status included.

    urllib raises an error status as an HTTPError that holds the open response; one dropped
    unclosed (a readiness probe's 503 while a server starts) leaks its socket, so every answer is
    read and closed here.
    """
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:  # noqa: S310 - fixed local URL
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        with err:
            return int(err.code), err.read().decode("utf-8", "replace")


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    """Does a GET on the URL answer 200 (a readiness probe)?"""
    return http_fetch(url, context)[0] == 200


def http_get(url: str, context: ssl.SSLContext | None = None) -> str:
    """The body of a GET that must answer 2xx."""
    status, body = http_fetch(url, context)
    if not 200 <= status < 300:
        raise ComponentError(f"GET {url} answered {status}: {body[:200]}")
    return body


def free_port() -> int:
    """A currently unused TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def python_module(module: str) -> list[str]:
    """The command that runs one of tmi's packages (`python -m webhook`) as the servers run.

    `-P`: the package comes from the environment's path (PYTHONPATH, then the install), never
    from the working directory, which `-m` would put first; so a server runs the same package
    the test that started it imported."""
    return [sys.executable, "-P", "-m", module]


def _set_pdeathsig() -> None:
    # Runs in the forked child before exec. PR_SET_PDEATHSIG is tied to the thread
    # that forked, which is why ManagedProcess only asks for it from the main thread.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _child_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    # A proxy from the developer's shell would capture the API server's calls to
    # webhooks and extenders on 127.0.0.1.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env.pop(name, None)
        env.pop(name.lower(), None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    if extra:
        env.update(extra)
    return env


def _cleanup_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    # Signal every group first so the components shut down in parallel.
    for proc in live:
        if proc.running():
            proc._signal_group(signal.SIGTERM)
    deadline = time.monotonic() + 3.0
    for proc in live:
        proc.stop(grace=max(0.1, deadline - time.monotonic()))


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _cleanup_all()
    # Re-raise the default behaviour so the exit status still says "killed by signal".
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED  # noqa: PLW0603 - one-time process-wide setup
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_cleanup_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGHUP):
        # Leave handlers someone else installed alone; atexit still covers a
        # SystemExit they raise.
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, _on_signal)


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<log unavailable: {exc}>"
    return "\n".join(data.splitlines()[-lines:])


class ManagedProcess:
    """One component process: started in a new session, logged to a file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_file: Path,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_file = log_file
        _install_handlers()
        log_file.parent.mkdir(parents=True, exist_ok=True)
        in_main_thread = threading.current_thread() is threading.main_thread()
        with log_file.open("ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=_child_env(env),
                start_new_session=True,
                preexec_fn=_set_pdeathsig if (in_main_thread and sys.platform == "linux") else None,  # noqa: PLW1509 - only calls prctl
            )
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> int | None:
        return self._popen.poll()

    def running(self) -> bool:
        return self._popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_file, lines)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self._popen.pid, signum)
        except OSError as exc:
            # ESRCH: the group is already gone. EPERM can happen on macOS for a
            # zombie group leader; fall back to the leader itself.
            if exc.errno == errno.EPERM:
                with contextlib.suppress(OSError):
                    self._popen.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL the process group at once, as a crash or an OOM kill would end it."""
        try:
            if self._popen.poll() is None:
                self._signal_group(signal.SIGKILL)
                self._popen.wait(timeout=10)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
        try:
            if self._popen.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    self._popen.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self._popen.wait(timeout=10)
            # Children that outlived the leader share its group id.
            self._signal_group(signal.SIGKILL)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    max_interval: float = 1.0,
    proc: ManagedProcess | None = None,
) -> T:
    """Poll ``probe`` until it answers: the first truthy value it returns.

    "Not yet" is None, False or anything empty (an empty list of Pods is a Pod not made yet,
    not an answer), as in `kits.polling.eventually`; a probe whose answer may itself be
    empty or zero returns it wrapped (a tuple, a dataclass). Exceptions from the probe count
    as "not yet"; the last one is reported on timeout. When ``proc`` is given, its early exit
    fails fast and the error includes the tail of its log.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = probe()
        except Exception as exc:  # probes talk to half-started servers
            last_error = exc
            result = None
        if result:
            return result
        if proc is not None and not proc.running():
            raise ComponentError(
                f"{proc.name} exited with status {proc.poll()} while waiting for {what}; "
                f"log {proc.log_file}:\n{proc.log_tail()}"
            )
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            log = f"; log {proc.log_file}:\n{proc.log_tail()}" if proc is not None else ""
            raise ComponentError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{log}")
        time.sleep(interval)
        interval = min(interval * 1.5, max_interval)
