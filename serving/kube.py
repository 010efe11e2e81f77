"""Talking to the API server: the client configuration, list items, errors and retry delays.

Every server reads its credentials the same way, from a kubeconfig file (a person debugging, the
local test cluster) or from the in-cluster service account, and loads them when it starts, so
that a bad kubeconfig is exit status 2 rather than a reader thread failing forever. The webhook
and the extender then use the official client on reader threads; the controller uses the loaded
configuration for requests of its own on the event loop.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import kubernetes.client
import kubernetes.config
import yaml

# The official client is only partly typed; it is used through this one untyped handle.
_kube: Any = kubernetes


class ClientConfigError(ValueError):
    """The Kubernetes client configuration (kubeconfig or in-cluster) cannot be loaded."""


def load_configuration(kubeconfig: str | None) -> Any:
    """A `kubernetes.client.Configuration` from a kubeconfig file, or the in-cluster account."""
    configuration = _kube.client.Configuration()
    try:
        if kubeconfig:
            _kube.config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            _kube.config.load_incluster_config(client_configuration=configuration)
    except (_kube.config.ConfigException, OSError, TypeError, ValueError, yaml.YAMLError) as exc:
        where = kubeconfig or "the in-cluster service account"
        raise ClientConfigError(
            f"cannot load the Kubernetes client configuration from {where}: {exc}"
        ) from None
    return configuration


def kubernetes_api(kubeconfig: str | None) -> Callable[[], Any]:
    """A maker of `CoreV1Api` clients; the configuration is loaded now, so a bad kubeconfig
    fails the start, not a reader thread."""
    configuration = load_configuration(kubeconfig)
    return lambda: _kube.client.CoreV1Api(_kube.client.ApiClient(configuration))


def as_configmap(item: Any) -> dict[str, Any] | None:
    """An item of a ConfigMap list as a whole object; None for what is not an object."""
    # Items of a List come without kind and apiVersion, and the verifier insists on them.
    if not isinstance(item, dict):
        return None
    item.setdefault("apiVersion", "v1")
    item.setdefault("kind", "ConfigMap")
    return item


def describe_error(exc: BaseException) -> str:
    """A failed call in a few words for the log: the HTTP status, else the exception."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"


class Backoff:
    """Waits between retries of a failing call: doubling from `base` up to `ceiling`, each
    jittered by ±50% so that replicas and readers do not retry in step."""

    def __init__(self, base: float, ceiling: float) -> None:
        self.base = base
        self.ceiling = ceiling
        self.delay = base

    def reset(self) -> None:
        """The call succeeded: the next failure waits `base` again."""
        self.delay = self.base

    def next(self) -> float:
        """The wait before this retry (`delay`, jittered); the one after it is doubled."""
        wait = self.delay * (0.5 + random.random())  # noqa: S311 - jitter, not security
        self.delay = min(self.delay * 2, self.ceiling)
        return wait
