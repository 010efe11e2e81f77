"""`tmi remove-webhooks`: the tenant release's pre-delete hook, so no webhook entry outlives its
server.

The owner's MutatingWebhookConfiguration for a tenant namespace calls the webhook the tenant
release runs. Uninstalling the tenant part would leave it calling nothing, and every engine Pod
of the namespace refused until the tenant part is back. The tenant chart's pre-delete Job runs
this command first: of the configurations it is given by name (the chart names the ones that can
be this namespace's), it deletes each one whose every entry selects this namespace alone, which
the owner release lets the Job's ServiceAccount read and delete for that namespace's
configuration and no other (a name it may not delete is not its namespace's, and is skipped,
asked with a SelfSubjectAccessReview rather than tried).
Without it the namespace's engine Pods are not planned, and the owner's admission policies still
shield them and refuse any reach for a device: the grant never rested on the configuration.
After reinstalling the tenant part, upgrading the owner release restores it.

`--best-effort` (the hook's) reports a failure and exits 0, so a missing grant (an owner part
older than this hook) never blocks an uninstall.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from tmi_cli.kubeconfig import kubeconfig_for

EXIT_OK, EXIT_FAILED = 0, 1
NAME_KEY = "kubernetes.io/metadata.name"


def selects_only(configuration: Mapping[str, Any], namespace: str) -> bool:
    """Does every entry of the configuration select exactly `namespace` by name?"""
    entries = configuration.get("webhooks") or []
    if not entries:
        return False
    for entry in entries:
        expressions = ((entry.get("namespaceSelector") or {}).get("matchExpressions")) or []
        names = [e for e in expressions if e.get("key") == NAME_KEY]
        if names != [{"key": NAME_KEY, "operator": "In", "values": [namespace]}]:
            return False
    return True


def _remove(namespace: str, names: list[str], kubeconfig: str | None) -> list[str]:
    import kubernetes.client  # noqa: PLC0415 - only this command needs the client

    from serving.kube import load_configuration  # noqa: PLC0415

    # The official client is only partly typed; it is used through one untyped handle.
    kube: Any = kubernetes.client
    client = kube.ApiClient(load_configuration(kubeconfig_for(kubeconfig)))
    api = kube.AdmissionregistrationV1Api(client)
    reviews = kube.AuthorizationV1Api(client)
    removed: list[str] = []
    for name in names:
        # Asked first, so that a name that is another tenant's costs no forbidden request.
        review = reviews.create_self_subject_access_review(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "group": "admissionregistration.k8s.io",
                        "resource": "mutatingwebhookconfigurations",
                        "verb": "delete",
                        "name": name,
                    }
                },
            }
        )
        if not review.status.allowed:
            continue
        try:
            found = api.read_mutating_webhook_configuration(name)
        except kube.ApiException as exc:
            if exc.status in (403, 404):
                continue
            raise
        if not selects_only(client.sanitize_for_serialization(found), namespace):
            continue
        try:
            api.delete_mutating_webhook_configuration(name)
        except kube.ApiException as exc:
            if exc.status != 404:
                raise
        removed.append(name)
    return removed


def cmd_remove_webhooks(args: argparse.Namespace) -> int:
    import kubernetes.client  # noqa: PLC0415

    from serving.kube import ClientConfigError  # noqa: PLC0415

    kube: Any = kubernetes.client
    try:
        removed = _remove(args.namespace, args.configuration, args.kubeconfig)
    except (ClientConfigError, kube.ApiException, OSError) as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        status = getattr(exc, "status", None)
        message = (
            f"could not remove the webhook configurations of namespace {args.namespace!r}: "
            + (f"HTTP {status} {reason}" if status else str(reason))
        )
        sys.stderr.write(("warning: " if args.best_effort else "error: ") + message + "\n")
        return EXIT_OK if args.best_effort else EXIT_FAILED
    for name in removed:
        sys.stdout.write(f"removed MutatingWebhookConfiguration {name}\n")
    if not removed:
        sys.stdout.write(f"no webhook configuration selects namespace {args.namespace!r} alone\n")
    return EXIT_OK


def add_cleanup_parser(sub: Any) -> None:
    p = sub.add_parser(
        "remove-webhooks",
        help="delete the webhook configurations that call this tenant namespace's webhook "
        "(the tenant release's pre-delete hook)",
    )
    p.add_argument("--namespace", required=True, metavar="NAME", help="the tenant namespace")
    p.add_argument(
        "--configuration",
        action="append",
        required=True,
        metavar="NAME",
        help="a MutatingWebhookConfiguration that may be this namespace's (repeatable)",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="default: $KUBECONFIG, ~/.kube/config, else the in-cluster account",
    )
    p.add_argument(
        "--best-effort",
        action="store_true",
        help="report a failure but exit 0 (a hook must not block an uninstall)",
    )
    p.set_defaults(func=cmd_remove_webhooks)


__all__ = ["add_cleanup_parser", "selects_only"]
