"""`tmi capacity`: what a list of deployments would get on a profile and a fleet, before any is
deployed.

The owner gives the signed profile and its trust (the flags of `tmi plan`), the deployments (a
JSON list of `{"name", "request"}`, engine Pods as `kubectl get pods -o json` prints them, read by
their request annotation, or a namespace's engine Pods read through the API server) and the
fleet (`kubectl get nodes -o json`, a list of Nodes, or the cluster's Nodes read through the API
server: GFD labels and allocatable are what count). The replay is
`inference_policy.tools.capacity`'s: the servers' own planning and placement, in order, tenants kept
apart on accounted shares as the extender keeps them: a Pod's tenant is its namespace, a `{"name",
"request"}` item's its `tenant` (by default the profile's namespace). Given each tenant's quota
(`--quota`, or the profile namespace's read from the API), each tenant's quota admits first, as its
webhook would at create (`inference_policy.tools.quota_replay`), and each tenant's headroom is
shown. Prints a table, or with `-o json` the report, with which tenant holds each physical GPU.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from inference_policy.base.pod_view import ObjectView, PodView
from inference_policy.base.wire import ENGINE_LABEL, REQUEST_ANNOTATION
from inference_policy.placing.quota import QUOTA_NAME, Quota, QuotaError, parse_quota
from inference_policy.tools.capacity import Deployment, Report, replay
from inference_policy.tools.quota_replay import QuotaPass, TenantHeadroom, within_quotas
from policy_io.files import read_json
from tmi_cli.kubeconfig import kubeconfig_for
from tmi_cli.policy_args import (
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    add_policy_arguments,
    now_from,
    policy_snapshot,
)
from tmi_cli.progress import progress
from tmi_cli.report_capacity import capacity_page
from tmi_cli.report_page import check_writable, write_page


def list_from_api(kubeconfig: str | None, what: str, namespace: str | None = None) -> Any:
    """The namespace's engine Pods, or with no namespace the Nodes, read through the API server
    (the kubeconfig, else $KUBECONFIG, ~/.kube/config or in-cluster credentials)."""
    import kubernetes.client  # noqa: PLC0415 - only this path needs the client

    from serving.kube import ClientConfigError, load_configuration  # noqa: PLC0415

    try:
        configuration = load_configuration(kubeconfig_for(kubeconfig))
    except ClientConfigError as exc:
        raise CommandError(str(exc)) from None
    # The official client is only partly typed; it is used through one untyped handle.
    kube: Any = kubernetes.client
    client = kube.ApiClient(configuration)
    api = kube.CoreV1Api(client)
    try:
        if namespace is None:
            response = api.list_node(_preload_content=False)
        else:
            response = api.list_namespaced_pod(
                namespace, label_selector=ENGINE_LABEL, _preload_content=False
            )
    except kube.ApiException as exc:
        raise CommandError(f"cannot list {what}: HTTP {exc.status} {exc.reason}") from None
    except OSError as exc:
        raise CommandError(f"cannot list {what}: {exc}") from None
    finally:
        client.close()
    return orjson.loads(response.data)


def quota_from_api(kubeconfig: str | None, namespace: str) -> Any:
    """The namespace's ResourceQuota tmi-quota, read through the API server (a tenant may read
    its own), or None when there is none."""
    import kubernetes.client  # noqa: PLC0415 - only this path needs the client

    from serving.kube import ClientConfigError, load_configuration  # noqa: PLC0415

    try:
        configuration = load_configuration(kubeconfig_for(kubeconfig))
    except ClientConfigError as exc:
        raise CommandError(str(exc)) from None
    kube: Any = kubernetes.client
    client = kube.ApiClient(configuration)
    try:
        response = kube.CoreV1Api(client).read_namespaced_resource_quota(
            QUOTA_NAME, namespace, _preload_content=False
        )
    except kube.ApiException as exc:
        if exc.status == 404:
            return None
        what = f"ResourceQuota {QUOTA_NAME} in namespace {namespace}"
        raise CommandError(f"cannot read {what}: HTTP {exc.status} {exc.reason}") from None
    except OSError as exc:
        raise CommandError(f"cannot read ResourceQuota {QUOTA_NAME}: {exc}") from None
    finally:
        client.close()
    return orjson.loads(response.data)


def _quotas(args: argparse.Namespace) -> dict[str, Quota]:
    """Each tenant's quota by namespace: the tmi-quota objects of --quota (one, a list, or
    `kubectl get resourcequota -A -o json`), or the profile namespace's read from the API."""
    if args.quota_from_api:
        found = quota_from_api(args.kubeconfig, args.namespace)
        if found is None:
            sys.stderr.write(f"note: namespace {args.namespace} has no {QUOTA_NAME}: no quota\n")
        documents = [] if found is None else [found]
        where = f"the API's ResourceQuota {QUOTA_NAME}"
    elif args.quota:
        document = read_json(args.quota, "quota")
        documents = [document] if isinstance(document, dict) and "spec" in document else []
        documents = documents or _items(document, "quota", args.quota)
        where = args.quota
    else:
        return {}
    quotas: dict[str, Quota] = {}
    for item in documents:
        if not isinstance(item, dict) or item.get("kind", "ResourceQuota") != "ResourceQuota":
            continue
        quota = ObjectView(item)
        if quota.name != QUOTA_NAME:
            continue  # not the owner's quota object (tmi-no-cross-namespace-affinity, ...)
        try:
            quotas[str(quota.namespace or args.namespace)] = parse_quota(item)
        except QuotaError as exc:
            raise CommandError(f"quota {where}: {exc}", EXIT_USAGE) from None
    return quotas


def render_headroom(headroom: list[TenantHeadroom]) -> str:
    """Each tenant's quota after the replay, as a table."""
    rows: list[tuple[str, ...]] = [("NAMESPACE", "QUOTA", "LIMIT", "HELD", "LEFT")]
    for tenant in headroom:
        for item in tenant.items:
            rows.append(
                (tenant.namespace, item.item, str(item.limit), str(item.held), str(item.left))
            )
    return "quota headroom\n" + (_table(rows) if len(rows) > 1 else "(no limit set)")


def _items(document: Any, what: str, path: str) -> list[Any]:
    if isinstance(document, dict) and isinstance(document.get("items"), list):
        return list(document["items"])
    if isinstance(document, list):
        return document
    raise CommandError(f"{what} {path} must be a JSON list or an object with items", EXIT_USAGE)


def _deployments(document: Any, path: str) -> list[Deployment]:
    out: list[Deployment] = []
    for i, item in enumerate(_items(document, "deployments", path)):
        if not isinstance(item, dict):
            raise CommandError(f"deployments {path}: item {i} is not an object", EXIT_USAGE)
        if item.get("kind") == "Pod":
            pod = PodView(item)
            text = pod.annotation(REQUEST_ANNOTATION)
            if text is None:
                raise CommandError(
                    f"deployments {path}: Pod {pod.name} has no {REQUEST_ANNOTATION}",
                    EXIT_USAGE,
                )
            try:
                request = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                raise CommandError(
                    f"deployments {path}: Pod {pod.name}'s request is not JSON: {exc}",
                    EXIT_USAGE,
                ) from None
            name = pod.label(ENGINE_LABEL) or pod.name or f"#{i}"
            out.append(Deployment(name, request, pod.namespace or ""))
        elif isinstance(item.get("name"), str) and "request" in item:
            tenant = item.get("tenant", "")
            if not isinstance(tenant, str):
                raise CommandError(
                    f"deployments {path}: item {i}: tenant is not a string", EXIT_USAGE
                )
            out.append(Deployment(item["name"], item["request"], tenant))
        else:
            raise CommandError(
                f'deployments {path}: item {i} is neither a Pod nor {{"name", "request"}}',
                EXIT_USAGE,
            )
    return out


def _nodes(document: Any, path: str) -> list[dict[str, Any]]:
    nodes = _items(document, "fleet", path)
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or not ObjectView(node).name:
            raise CommandError(f"fleet {path}: item {i} is not a named Node", EXIT_USAGE)
    return nodes


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def render(report: Report) -> str:
    """The report as the tables a person reads."""
    parts = []
    rows: list[tuple[str, ...]]
    if report.placed:
        rows = [("DEPLOYMENT", "NODE", "BINDING", "GRANTED")]
        for p in report.placed:
            granted = ",".join(f"{k}={v}" for k, v in sorted(p.resources.items())) or "-"
            rows.append((p.name, p.node, p.binding, granted))
        parts.append("placed\n" + _table(rows))
    if report.waiting:
        rows = [("DEPLOYMENT", "BINDING", "CODE", "WHY")]
        rows += [(w.name, w.binding, w.code, w.reason) for w in report.waiting]
        parts.append("waiting\n" + _table(rows))
    if report.refused:
        rows = [("DEPLOYMENT", "STATUS", "CODE", "DETAIL")]
        rows += [(r.name, str(r.status), r.code or "-", r.detail) for r in report.refused]
        parts.append("refused at admission\n" + _table(rows))
    if report.external:
        parts.append("external (no local resources): " + ", ".join(report.external))
    rows = [("NODE", "FREE")]
    for node, left in sorted(report.left.items()):
        rows.append((node, ",".join(f"{k}={v}" for k, v in left.items())))
    parts.append("left free\n" + (_table(rows) if len(rows) > 1 else "(none)"))
    if report.held:
        rows = [("NODE", "GPU", "RESOURCE", "TENANTS")]
        for h in report.held:
            # An isolating resource's devices are counted, not told apart: no GPU index.
            gpu = h.gpu if h.gpu is not None else "-"
            tenants = ",".join(f"{t or '-'}={units}" for t, units in sorted(h.tenants.items()))
            rows.append((h.node, gpu, h.resource, tenants))
        parts.append("held by tenant\n" + _table(rows))
    if report.stranded:
        stranded = ", ".join(f"{k}={v}" for k, v in sorted(report.stranded.items()))
        parts.append(f"stranded (free while a deployment waited for it): {stranded}")
    return "\n\n".join(parts)


def cmd_capacity(args: argparse.Namespace) -> int:
    if args.html and (problem := check_writable(args.html)):
        raise CommandError(problem, EXIT_USAGE)
    now = now_from(args.now)
    if args.deployments:
        deployments = _deployments(read_json(args.deployments, "deployments"), args.deployments)
    else:
        ns = args.deployments_from_namespace
        listed = list_from_api(args.kubeconfig, f"the engine Pods of namespace {ns}", ns)
        # Each Pod's kind is implied by the list it came in.
        pods = [{**pod, "kind": "Pod"} for pod in listed.get("items") or []]
        deployments = _deployments(pods, f"namespace {ns}")
    if args.fleet:
        nodes = _nodes(read_json(args.fleet, "fleet"), args.fleet)
    else:
        nodes = _nodes(list_from_api(args.kubeconfig, "Nodes"), "the API's Nodes")
    snapshot = policy_snapshot(args, now)
    ctx = snapshot.context(now)
    quotas = _quotas(args)
    # Each tenant's quota admits first, as its webhook would at create
    # (inference_policy.placing.quota).
    options = snapshot.options
    passed = (
        within_quotas(deployments, ctx, quotas, options) if quotas else QuotaPass(list(deployments))
    )
    with progress("replaying the deployments", len(passed.admitted)) as done:
        report = replay(passed.admitted, nodes, ctx, options, lambda _: done())
    report.refused.extend(passed.refused)
    body = report.to_json()
    if args.quota or args.quota_from_api:
        body["quotas"] = [tenant.to_json() for tenant in passed.headroom]
    if args.html:
        names = [str(ObjectView(node).name) for node in nodes]
        write_page(args.html, capacity_page(body, names))
    if args.output == "json":
        sys.stdout.buffer.write(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        asked = args.quota or args.quota_from_api
        extra = "\n\n" + render_headroom(passed.headroom) if asked else ""
        sys.stdout.write(render(report) + extra + "\n")
    sys.stdout.flush()
    return EXIT_OK


def add_capacity_parser(sub: Any) -> None:
    p = sub.add_parser(
        "capacity",
        help="replay deployment requests against a profile and a fleet: what is placed where, "
        "what waits and why, and the capacity left stranded",
    )
    add_policy_arguments(p)
    deployments = p.add_mutually_exclusive_group(required=True)
    deployments.add_argument(
        "--deployments", metavar="FILE", help="the deployments, in order (JSON or YAML)"
    )
    deployments.add_argument(
        "--deployments-from-namespace",
        metavar="NS",
        help="the engine Pods of NS, read through the API server (the tenant may)",
    )
    fleet = p.add_mutually_exclusive_group(required=True)
    fleet.add_argument(
        "--fleet", metavar="FILE", help="the Nodes (kubectl get nodes -o json, or a list)"
    )
    fleet.add_argument(
        "--fleet-from-api",
        action="store_true",
        help="the cluster's Nodes, read through the API server (the owner may; a tenant may not)",
    )
    quota = p.add_mutually_exclusive_group()
    quota.add_argument(
        "--quota",
        metavar="FILE",
        help=f"each tenant's quota: ResourceQuota {QUOTA_NAME} objects (kubectl get "
        "resourcequota -A -o json); deployments past it are refused as the webhook refuses "
        "them, and each tenant's headroom is shown",
    )
    quota.add_argument(
        "--quota-from-api",
        action="store_true",
        help=f"the quota of --namespace: its ResourceQuota {QUOTA_NAME}, read through the API "
        "server (the tenant may)",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="for the API reads (else $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    p.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="output (table)"
    )
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write the replay as one self-contained HTML page: the fleet's nodes and "
        "devices, who holds each, what is free and stranded, why each waiting deployment waits "
        "(the -o json report inside)",
    )
    p.set_defaults(func=cmd_capacity)
