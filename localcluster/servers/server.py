"""One local process for each tmi server the harness runs: the webhook, the extender and each
allocation controller replica.

They share one lifecycle: a command line and environment of their own, a port chosen once and
kept across restarts (the API server's webhook configuration and the scheduler's extender
configuration name it), a log file under the plane's logs, readiness proven by polling the
server's /readyz, and a stop (SIGTERM), a kill (SIGKILL, as a crash) and a restart. ``LocalServer``
holds that lifecycle; each server's class only says how it is run.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import ClassVar

from localcluster.plane.components import HOST
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.metrics import Sample, parse_metrics
from localcluster.plane.process import (
    ComponentError,
    ManagedProcess,
    free_port,
    http_get,
    http_ok,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0
_PORT_RETRIES = 3


def blank_tmi() -> dict[str, str]:
    """Every TMI_* variable of the calling shell, blanked.

    A server reads an empty TMI_* variable as unset, so with these in its environment only the
    settings the harness gives it (flags, or the chart's environment) are in force.
    """
    return {name: "" for name in os.environ if name.startswith("TMI_")}


@dataclass
class LocalServer:
    """A tmi server run as a local process; subclasses give its name, argv and environment."""

    plane: ControlPlane
    _: KW_ONLY
    port: int = 0
    process: ManagedProcess | None = None

    # Whether it serves TLS (a certificate from the plane's CA) or plain HTTP.
    scheme: ClassVar[str] = "https"

    @property
    def process_name(self) -> str:
        """The process's name, which also names its log file."""
        raise NotImplementedError

    def argv(self) -> list[str]:
        """The command line for the next start; ``port`` is chosen by then."""
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        """Variables added to the harness's own environment for the next start."""
        return None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.plane.logs_dir / f"{self.process_name}.log"

    def _context(self) -> ssl.SSLContext | None:
        if self.scheme != "https":
            return None
        return ssl.create_default_context(cafile=str(self.plane.ca_file))

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    # -- starting ----------------------------------------------------------------------------

    def spawn(self) -> None:
        """Start the process without waiting for it (on a free port the first time)."""
        if self.running():
            raise ComponentError(f"{self.process_name} is already running")
        if self.port == 0:
            self.port = free_port()
        self.process = ManagedProcess(
            self.process_name, self.argv(), self.log_file, cwd=ROOT, env=self.environment()
        )

    def ready(self) -> bool:
        return http_ok(f"{self.url}/readyz", self._context())

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until /readyz answers (each server says there what it has read first)."""
        wait_until(self.ready, timeout=timeout, what=f"{self.url}/readyz", proc=self.process)

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the process and wait until it is ready.

        A port found free can be taken by someone else before the server binds it, so a first
        start that fails with "address already in use" is retried on another port; a port the
        server ran on before is kept, since others are configured with it.
        """
        fixed = self.port != 0
        for attempt in range(_PORT_RETRIES):
            self.spawn()
            try:
                self.wait_ready(timeout)
            except ComponentError:
                assert self.process is not None
                self.process.stop()
                in_use = "address already in use" in self.process.log_tail(80).lower()
                if attempt + 1 < _PORT_RETRIES and in_use and not fixed:
                    self.port = 0
                    continue
                raise
            return

    # -- stopping ----------------------------------------------------------------------------

    def stop_process(self) -> None:
        """SIGTERM the process (SIGKILL after a grace period), as a Pod's deletion would."""
        if self.process is not None:
            self.process.stop()

    def kill(self) -> None:
        """SIGKILL the process at once, as a crash or an OOM kill would end it."""
        if self.process is not None:
            self.process.kill()

    def stop(self) -> None:
        self.stop_process()

    def restart(self) -> None:
        self.stop()
        self.start()

    # -- what it serves ----------------------------------------------------------------------

    def get(self, path: str) -> str:
        """The body of a GET on the server's port."""
        return http_get(f"{self.url}{path}", self._context())

    def metrics_text(self) -> str:
        """The process's /metrics exposition."""
        return self.get("/metrics")

    def metrics(self) -> list[Sample]:
        return parse_metrics(self.metrics_text())
