"""Talking to the API server: the client configuration, its errors and retry delays.

Every server reads its credentials the same way, from a kubeconfig file (a person debugging, the
local test cluster) or from the in-cluster service account, and loads them when it starts, so
that a bad kubeconfig is exit status 2 rather than an informer failing forever
(`serving.credentials`; the official client's loader here, for the CLI and for a kubeconfig
only it understands). The requests themselves are made on the event loop
(`serving.apiserver`), and a failed one is an `ApiError` whatever sent it, so the informer and
the controller's writes tell a 410 or a 409 apart the same way against the real API server and
against the in-memory one the tests use.
"""

from __future__ import annotations

import random
from typing import Any

import yaml


class ClientConfigError(ValueError):
    """The Kubernetes client configuration (kubeconfig or in-cluster) cannot be loaded."""


def load_configuration(kubeconfig: str | None) -> Any:
    """A `kubernetes.client.Configuration` from a kubeconfig file, or the in-cluster account.

    The official client is imported here, not with the module: the servers read their
    credentials with `serving.credentials` and import it only for a kubeconfig that needs it
    (about 9 MiB of resident memory beyond what a server shares with it); the CLI's commands
    use it for their requests."""
    import kubernetes.client  # noqa: PLC0415
    import kubernetes.config  # noqa: PLC0415

    # The official client is only partly typed; it is used through this one untyped handle.
    _kube: Any = kubernetes
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


class ApiError(Exception):
    """A non-2xx answer, with the HTTP status and the `Status` reason and message."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    """404: the object does not exist (any more)."""


class Conflict(ApiError):
    """409: the object changed since it was read, or already exists."""


class Gone(ApiError):
    """410: the resourceVersion (or list continue token) asked for is older than the API server
    keeps."""


def api_error(status: int, reason: str = "", message: str = "") -> ApiError:
    """The most specific ApiError for a status code."""
    kind = {404: NotFound, 409: Conflict, 410: Gone}.get(status, ApiError)
    return kind(status, reason, message)


def not_permitted(exc: BaseException) -> str | None:
    """Why a read was refused when the API server refused this server's credentials or Role
    (401 or 403), else None.

    For a profile or recipe-catalog ConfigMap this is the owner's install, not a server fault:
    every server turns it into a profile that did not arrive, with this reason, so the tenant's
    refusal says what to fix and the server stays ready to give it. Any other failure is retried
    with backoff while the server stays unready."""
    if isinstance(exc, ApiError) and exc.status in (401, 403):
        return f"may not be read (HTTP {exc.status}; check the Role)"
    return None


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
