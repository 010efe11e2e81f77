"""Prometheus as a local process of the harness, to prove the chart's alerts and dashboards in a
real one rather than by the metric names they mention.

The binaries are Debian's (the `prometheus` package: /usr/bin/prometheus and /usr/bin/promtool),
installed when missing as the real node's Debian packages are (tools/k8sbin/build-node.sh): the
tests run as root on a development machine or CI, so a clean machine needs nothing by hand.

``LocalPrometheus`` runs one server in a temporary directory of its own (configuration, rules,
TSDB), on a free port, logging beside the plane's components so a failed test keeps its log. It
scrapes what ``podmonitor_scrape_configs`` makes of the chart's PodMonitors: the labels the
Prometheus Operator gives a PodMonitor's targets (``namespace``, ``pod``, ``container``,
``endpoint``, ``job``) and its ``honorLabels``, with each Pod played by a local process's
address. Its rules are the chart's alert groups (``chart_rule_groups``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from localcluster.plane.components import HOST
from localcluster.plane.kube import JSON
from localcluster.plane.process import (
    ComponentError,
    ManagedProcess,
    free_port,
    http_fetch,
    http_ok,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "charts" / "tmi" / "files" / "alerts.yaml"
PACKAGE = "prometheus"
PROMETHEUS = Path("/usr/bin/prometheus")
PROMTOOL = Path("/usr/bin/promtool")
START_TIMEOUT = 60.0
_PORT_RETRIES = 3


class PrometheusMissingError(RuntimeError):
    """The Debian package could not be installed; the message has apt-get's output."""


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(
        ["apt-get", *args], capture_output=True, text=True, check=False, env=env, timeout=600
    )


def prometheus_binaries() -> tuple[Path, Path]:
    """/usr/bin/prometheus and /usr/bin/promtool, from Debian's package installed when missing.

    Recommends are left out: the package recommends the node exporter, which nothing here
    scrapes. A machine whose package lists are empty or stale (a fresh image) gets them
    refreshed once, and the install is tried again.
    """
    if PROMETHEUS.exists() and PROMTOOL.exists():
        return PROMETHEUS, PROMTOOL
    install = ("install", "-y", "-q", "--no-install-recommends", PACKAGE)
    done = _apt_get(*install)
    if done.returncode != 0:
        _apt_get("update", "-q")
        done = _apt_get(*install)
    if done.returncode != 0 or not (PROMETHEUS.exists() and PROMTOOL.exists()):
        raise PrometheusMissingError(
            f"apt-get install {PACKAGE} failed (status {done.returncode}); install it as root:\n"
            f"{(done.stderr or done.stdout).strip()[-2000:]}"
        )
    return PROMETHEUS, PROMTOOL


def chart_rule_groups(for_: str | None = None) -> list[JSON]:
    """The chart's alert groups (charts/tmi/files/alerts.yaml, the PrometheusRule's spec), as a
    rule file holds them; with ``for_``, every rule's ``for`` is that duration instead."""
    groups: list[JSON] = yaml.safe_load(ALERTS.read_text())["groups"]
    if for_ is not None:
        for group in groups:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = for_
    return groups


@dataclass(frozen=True)
class ScrapedPod:
    """A local process standing in for one Pod a PodMonitor selects: the Pod's name, namespace
    and `app.kubernetes.io/name` label, and where its metrics are served. The harness serves a
    server's /metrics on its own port (HTTPS for the webhook and the extender, with the plane's
    CA), where the chart gives it a plain-HTTP port of its own."""

    name: str
    namespace: str
    app: str
    container: str
    address: str
    scheme: str = "http"
    ca_file: Path | None = None


def podmonitor_scrape_configs(
    podmonitors: Sequence[JSON], pods: Sequence[ScrapedPod], interval: str
) -> list[JSON]:
    """One scrape job per endpoint of each PodMonitor, over the ``pods`` it selects, with the
    target labels the Prometheus Operator gives them and the PodMonitor's own ``honorLabels``
    and path; ``interval`` replaces the chart's (a test cannot wait 30 s between scrapes)."""
    jobs: list[JSON] = []
    for monitor in podmonitors:
        meta, spec = monitor["metadata"], monitor["spec"]
        wanted = spec["selector"]["matchLabels"]
        assert set(wanted) == {"app.kubernetes.io/name"}, wanted
        selected = [p for p in pods if p.app == wanted["app.kubernetes.io/name"]]
        for index, endpoint in enumerate(spec["podMetricsEndpoints"]):
            job: JSON = {
                "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{index}",
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "metrics_path": endpoint.get("path", "/metrics"),
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "static_configs": [
                    {
                        "targets": [pod.address],
                        "labels": {
                            # What the Operator's relabelling writes from the Pod's metadata.
                            "namespace": pod.namespace,
                            "pod": pod.name,
                            "container": pod.container,
                            "endpoint": str(endpoint["port"]),
                            "job": f"{meta['namespace']}/{meta['name']}",
                        },
                    }
                    for pod in selected
                ],
            }
            schemes = {p.scheme for p in selected}
            assert len(schemes) <= 1, f"{meta['name']}: Pods served over {schemes}"
            if schemes == {"https"}:
                job["scheme"] = "https"
                job["tls_config"] = {"ca_file": str(selected[0].ca_file)}
            jobs.append(job)
    return jobs


_STAMP = re.compile(r"(?P<head>[^.]{19})(?:\.(?P<fraction>\d+))?(?P<zone>.*)")


def api_time(stamp: str) -> float:
    """A Unix time from the API's RFC 3339 stamps, whose nanoseconds Python cannot read."""
    parts = _STAMP.fullmatch(stamp)
    if parts is None:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    zone = "+00:00" if parts["zone"] == "Z" else parts["zone"]
    fraction = (parts["fraction"] or "0")[:6]
    return datetime.fromisoformat(f"{parts['head']}.{fraction}{zone}").timestamp()


@dataclass
class LocalPrometheus:
    """One Prometheus process: ``start`` it, ask its HTTP API, ``stop`` it (which removes its
    directory). Evaluation and scrapes every ``interval``."""

    logs_dir: Path
    scrape_configs: list[JSON]
    rule_groups: list[JSON]
    interval: str = "1s"
    port: int = 0
    process: ManagedProcess | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tmi-prom-")))

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.logs_dir / "prometheus.log"

    def _write_files(self) -> Path:
        rules = self.workdir / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": self.rule_groups}, sort_keys=False))
        config = self.workdir / "prometheus.yml"
        settings = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(rules)],
            "scrape_configs": self.scrape_configs,
        }
        config.write_text(yaml.safe_dump(settings, sort_keys=False))
        return config

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the server and wait until /-/ready answers (its rules and TSDB loaded), on
        another free port if the one found was taken before Prometheus bound it."""
        binary, _ = prometheus_binaries()
        config = self._write_files()
        for attempt in range(_PORT_RETRIES):
            self.port = free_port()
            argv = [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address={HOST}:{self.port}",
                "--log.level=info",
            ]
            self.process = ManagedProcess("prometheus", argv, self.log_file, cwd=self.workdir)
            try:
                wait_until(
                    lambda: http_ok(f"{self.url}/-/ready"),
                    timeout=timeout,
                    what=f"{self.url}/-/ready",
                    proc=self.process,
                )
            except ComponentError:
                self.process.stop()
                in_use = "address already in use" in self.process.log_tail(80).lower()
                if attempt + 1 < _PORT_RETRIES and in_use:
                    continue
                raise
            return

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalPrometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- its HTTP API ----------------------------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a GET on /api/v1/<path>; ComponentError unless it answered success."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        status, body = http_fetch(f"{self.url}/api/v1/{path}{query}")
        answer = json.loads(body) if body.startswith("{") else {}
        if status != 200 or answer.get("status") != "success":
            raise ComponentError(f"Prometheus /api/v1/{path}{query} answered {status}: {body}")
        return answer["data"]

    def query(self, expr: str) -> list[JSON]:
        """An instant query's series (a vector's elements; a scalar is one series)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[JSON] = data["result"]
        return result

    def alerts(self) -> list[JSON]:
        """Every pending or firing alert, with its labels, annotations and state."""
        alerts: list[JSON] = self.api("alerts")["alerts"]
        return alerts

    def active(self, name: str, state: str | None = None) -> list[JSON]:
        """The alerts called ``name`` (in ``state``, if given: pending or firing)."""
        return [
            a
            for a in self.alerts()
            if a["labels"].get("alertname") == name and state in (None, a["state"])
        ]

    def wait_firing(
        self, name: str, timeout: float, match: Mapping[str, str] | None = None
    ) -> list[JSON]:
        """Until alert ``name`` fires (with labels including ``match``); its firing alerts."""
        wanted = dict(match or {})

        def firing() -> list[JSON]:
            return [
                a
                for a in self.active(name, "firing")
                if all(a["labels"].get(k) == v for k, v in wanted.items())
            ]

        return wait_until(
            firing, timeout=timeout, what=f"alert {name} {wanted or ''} firing", proc=self.process
        )

    def wait_targets_up(self, count: int, timeout: float = 30.0) -> list[JSON]:
        """Until ``count`` targets are scraped and every one is up; the targets."""

        def up() -> list[JSON]:
            targets: list[JSON] = self.api("targets", state="active")["activeTargets"]
            healthy = len(targets) == count and all(t["health"] == "up" for t in targets)
            return targets if healthy else []

        return wait_until(up, timeout=timeout, what=f"{count} targets up", proc=self.process)

    def wait_evaluated_since(self, since: float, timeout: float = 30.0) -> None:
        """Until every target has been scraped after ``since`` (a Unix time) and then every rule
        group evaluated: what an alert then says holds what was true at ``since``."""

        def scraped() -> bool:
            targets = self.api("targets", state="active")["activeTargets"]
            return bool(targets) and all(api_time(t["lastScrape"]) > since for t in targets)

        wait_until(scraped, timeout=timeout, what=f"scrapes after {since:.0f}", proc=self.process)
        # The API gives each target's last scrape only, so "after them all" is after now.
        after = time.time()

        def evaluated() -> bool:
            groups = self.api("rules", type="alert")["groups"]
            return all(api_time(g["lastEvaluation"]) > after for g in groups)

        wait_until(
            evaluated,
            timeout=timeout,
            what=f"rule evaluations after {after:.0f}",
            proc=self.process,
        )


__all__ = [
    "ALERTS",
    "LocalPrometheus",
    "PrometheusMissingError",
    "ScrapedPod",
    "api_time",
    "chart_rule_groups",
    "podmonitor_scrape_configs",
    "prometheus_binaries",
]
