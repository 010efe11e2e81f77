"""`tmi doctor`: the install's preflight, as the owner (or the installer) would run it by hand.

Each check is read here and judged in the core (`inference_policy.tools.doctor`): a line per check
with pass / fail / skip, what was found and the fix, or `-o json`; exit 0 when nothing failed,
1 otherwise. As the owner (the default) it reviews the installer's rights with
SubjectAccessReviews and dry-runs the seed's privileged probe impersonating the installer; with
`--as-installer` the kubeconfig is the installer's own, so it asks SelfSubjectAccessReviews and
skips what an installer may not read (Nodes, RuntimeClasses, CRDs, the TenantAdmission that
names the allocation controller, whose rights in the namespace the owner's run reviews).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from inference_policy.base.pod_view import ObjectView
from inference_policy.granting.owner_rights import (
    CONTROLLER_RIGHTS,
    SERVICE_ACCOUNT_PREFIX,
    Right,
    review_allowed,
    subject_access_review,
)
from inference_policy.tools.doctor import (
    EXEC_GUARD,
    INSTALLER_RIGHTS,
    POD_GUARD,
    Check,
    controller_rights_check,
    crd_check,
    gpu_node_checks,
    guard_checks,
    installer_check,
    namespace_checks,
    privileged_probe,
    runtime_class_check,
    serves,
)
from inference_policy.trust.rollback import API_VERSION, PLURAL
from tmi_cli.kubeconfig import kubeconfig_for
from tmi_cli.output import emit
from tmi_cli.policy_args import EXIT_FAILED, EXIT_OK, CommandError

Subparsers = Any
_CERT_MANAGER_CRD = "certificates.cert-manager.io"
_ADMISSION = "/apis/admissionregistration.k8s.io/v1"


class _Api:
    """The official client's ApiClient, asked by path; an answer is (status, body)."""

    def __init__(self, kubeconfig: str | None) -> None:
        import kubernetes.client  # noqa: PLC0415 - only the commands that talk to a cluster

        from serving.kube import ClientConfigError, load_configuration  # noqa: PLC0415

        try:
            configuration = load_configuration(kubeconfig_for(kubeconfig))
        except ClientConfigError as exc:
            raise CommandError(str(exc)) from None
        self._kube: Any = kubernetes.client
        self._client = self._kube.ApiClient(configuration)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: list[tuple[str, str]] | None = None,
        impersonate: str | None = None,
    ) -> tuple[int, Any]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if impersonate:
            headers["Impersonate-User"] = impersonate
        try:
            method, url, headers, data, post = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(
                method, url, header_params=headers, body=data, post_params=post
            )
            response.read()
        except self._kube.ApiException as exc:
            return int(exc.status), _decoded(exc.body)
        except OSError as exc:
            raise CommandError(f"cannot reach the API server: {exc}") from None
        status = int(response.status)
        return status, _decoded(response.data)

    def get(self, path: str) -> tuple[int, Any]:
        return self.call("GET", path)

    def close(self) -> None:
        self._client.close()


def _decoded(data: Any) -> Any:
    try:
        return orjson.loads(data or b"null")
    except orjson.JSONDecodeError:
        return {"message": data.decode(errors="replace") if isinstance(data, bytes) else data}


def _access(api: _Api, args: argparse.Namespace) -> Check:
    answers = []
    for verb, group, resource, expected in INSTALLER_RIGHTS:
        attributes: dict[str, Any] = {"verb": verb, "group": group, "resource": resource}
        if resource == "deployments":
            attributes["namespace"] = args.namespace
        spec: dict[str, Any] = {"resourceAttributes": attributes}
        if args.as_installer:
            kind = "SelfSubjectAccessReview"
        else:
            kind = "SubjectAccessReview"
            spec["user"] = args.installer
            if args.installer.startswith("system:serviceaccount:"):
                spec["groups"] = [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{args.installer.split(':')[2]}",
                    "system:authenticated",
                ]
            else:
                spec["groups"] = ["system:authenticated"]
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": kind, "spec": spec}
        plural = kind.lower() + "s"
        status, answer = api.call("POST", f"/apis/authorization.k8s.io/v1/{plural}", body)
        if status >= 300:
            return Check(
                "installer-namespace-scoped",
                "skip",
                f"{kind} refused (HTTP {status}): {answer.get('message', '')}",
            )
        allowed = bool(ObjectView(answer).status.get("allowed"))
        answers.append((verb, group, resource, expected, allowed))
    who = "this identity" if args.as_installer else args.installer
    return installer_check(who, answers)


def _controller_rights(api: _Api, args: argparse.Namespace) -> Check:
    """The owner part's controller for the namespace (its TenantAdmission names it), if its
    ServiceAccount exists, and the reviews of its rights there."""
    namespace = args.namespace
    status, admission = api.get(f"/apis/{API_VERSION}/{PLURAL}/{namespace}")
    identity = ObjectView(admission).spec.get("allocationController")
    if status in (401, 403):
        why = f"TenantAdmission {namespace} may not be read with this identity (the owner's is)"
        return controller_rights_check(namespace, None, None, why)
    if status != 200 or not isinstance(identity, str):
        return controller_rights_check(namespace, None, None)
    owner, _, account = identity.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
    if identity.startswith(SERVICE_ACCOUNT_PREFIX):
        found, _ = api.get(f"/api/v1/namespaces/{owner}/serviceaccounts/{account}")
        if found == 404:
            why = f"{identity} does not exist (the owner part runs no allocation controller)"
            return controller_rights_check(namespace, None, None, why)
    answers: dict[Right, bool | None] = {}
    for right in CONTROLLER_RIGHTS:
        review = subject_access_review(identity, right, namespace)
        code, answer = api.call(
            "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review
        )
        if code >= 300:
            why = f"SubjectAccessReview refused (HTTP {code}): {(answer or {}).get('message', '')}"
            return controller_rights_check(namespace, identity, None, why)
        answers[right] = review_allowed(answer)
    return controller_rights_check(namespace, identity, answers)


def _guard(api: _Api, args: argparse.Namespace) -> list[Check]:
    present: dict[str, bool | None] = {}
    for name in (POD_GUARD, EXEC_GUARD):
        for kind in ("validatingadmissionpolicies", "validatingadmissionpolicybindings"):
            present[f"{kind}/{name}"], _ = _optional(api, f"{_ADMISSION}/{kind}/{name}")
    status, answer = api.call(
        "POST",
        f"/api/v1/namespaces/{args.namespace}/pods",
        privileged_probe(args.namespace),
        query=[("dryRun", "All")],
        impersonate=None if args.as_installer else args.installer,
    )
    refusal = str(answer.get("message", "")) if status >= 300 else None
    return guard_checks(present, refusal, status < 300)


def _optional(api: _Api, path: str) -> tuple[bool | None, Any]:
    """(present, document), present None when this identity may not read it."""
    status, answer = api.get(path)
    if status in (401, 403):
        return None, None
    return status == 200, answer if status == 200 else None


def cmd_doctor(args: argparse.Namespace) -> int:
    api = _Api(args.kubeconfig)
    try:
        checks: list[Check] = []
        status, namespace = api.get(f"/api/v1/namespaces/{args.namespace}")
        listed, hooks = api.get(f"{_ADMISSION}/mutatingwebhookconfigurations")
        served = serves(hooks["items"] if listed == 200 else None, args.namespace)
        checks += namespace_checks(args.namespace, namespace if status == 200 else None, served)
        checks.append(_access(api, args))
        checks.append(_controller_rights(api, args))
        checks += _guard(api, args)
        if args.cert_manager:
            present, _ = _optional(
                api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{_CERT_MANAGER_CRD}"
            )
            checks.append(
                crd_check(
                    "cert-manager",
                    present,
                    f"CustomResourceDefinition {_CERT_MANAGER_CRD}",
                    "install cert-manager, or set tenant.certManager=false and "
                    "owner.extender.certManager=false and provide the TLS Secrets",
                )
            )
        present, runtime_class = _optional(api, "/apis/node.k8s.io/v1/runtimeclasses/nvidia")
        checks.append(runtime_class_check(runtime_class, readable=present is not None))
        status, nodes = api.get("/api/v1/nodes")
        checks += gpu_node_checks(nodes["items"] if status == 200 else None)
    finally:
        api.close()
    failed = [c for c in checks if c.status == "fail"]
    if args.output == "json":
        emit({"ok": not failed, "checks": [c.wire() for c in checks]}, args)
    else:
        for check in checks:
            sys.stdout.write(f"{check.status.upper():4}  {check.name}: {check.found}\n")
            if check.fix:
                sys.stdout.write(f"      fix: {check.fix}\n")
        sys.stdout.write(
            f"{len(checks) - len(failed)} of {len(checks)} checks did not fail; "
            f"{'the install can proceed' if not failed else 'fix the failures first'}\n"
        )
    return EXIT_FAILED if failed else EXIT_OK


def add_doctor_parser(sub: Subparsers) -> None:
    p = sub.add_parser("doctor", help="check a cluster for a tenant-mode inference install")
    p.add_argument("--namespace", default="kamiwaza", metavar="NS", help="the tenant namespace")
    p.add_argument(
        "--installer",
        default="system:serviceaccount:kamiwaza:kamiwaza-installer",
        metavar="USER",
        help="the installer identity whose rights are checked (as the owner)",
    )
    p.add_argument(
        "--as-installer",
        action="store_true",
        help="the kubeconfig is the installer's: check its own rights, skip owner-only reads",
    )
    p.add_argument(
        "--no-cert-manager",
        dest="cert_manager",
        action="store_false",
        help="the install provides its TLS Secrets (tenant.certManager=false)",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="the identity to check as (else $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="the report's form (default table)",
    )
    p.set_defaults(func=cmd_doctor)


__all__ = ["add_doctor_parser"]
