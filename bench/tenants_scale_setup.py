"""How `bench_tenants_scale.py` installs its further tenants: the owner release upgraded once
with every tenant in `owner.tenants`, and each further tenant's engine Pod stored as that
tenant's own webhook would have stored it, without running that webhook.

`localcluster.install.tenants.add_tenant` adds one tenant with a webhook process of its own and
rolls the extender and the controller each time; for 99 tenants on 2 cores that would be 99 webhook
processes and 198 controller restarts. Here, instead, for every further tenant at once:

* its namespace, its installer identity (seed 001) and its profile, signed for its namespace by
  the same owner key as the measured tenant's, published by the owner;
* its `owner.tenants` entry, naming the address its webhook would listen on (nothing listens
  there); the owner part rendered once with every entry and applied as `helm upgrade` would
  (its parameters, Roles, RoleBindings, ResourceQuota, cleanup ClusterRole and binding), the
  namespace opted in, and the extender and the controller rolled once, a replica at a time;
* its engine Pod planned in this process by the webhook's own code (`webhook.admission.Reviewer`
  over a `PolicyStore` fed the tenant's published profile and the room figures the extender
  wrote into its namespace, with the settings the tenant part's Deployment would run with) and
  created, so planned, through the API server as the tenant's installer: the owner's admission
  policies check it as they check every Pod there;
* only then its MutatingWebhookConfiguration, exactly as rendered: with it in place and no
  process at its address, the API server would refuse (failurePolicy Fail) the create above.

`check_in_process` shows the in-process planning answers a review exactly as the measured
tenant's webhook process does; `stored_difference` what differs between the measured tenant's
stored engine Pod and a further tenant's.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jsonpatch

from inference_policy.base.wire import ENGINE_LABEL, PLAN_ANNOTATION
from inference_policy.planning.room import ROOM_CONFIGMAP
from kits.profilekit import Owner
from kits.stackkit import whole_h100_envelope
from kits.webhookkit import review
from localcluster import Kube, wait_until
from localcluster.install.install import (
    INSTALLER,
    Rendered,
    grant_installer,
    render_owner,
    wait_allowed,
)
from localcluster.install.stack import (
    CONTROLLER_DEPLOYMENT,
    EXTENDER_DEPLOYMENT,
    WEBHOOK_DEPLOYMENT,
    TenantStack,
    _apply,
    _owner_applied,
)
from localcluster.install.tenants import _ours
from localcluster.plane.controlplane import HOST
from localcluster.plane.kube import JSON, ApiError
from localcluster.plane.process import free_port
from localcluster.servers.admission_policies import policy_docs
from localcluster.servers.engine_pods import engine_pod
from localcluster.servers.extender_process import LOCAL_FLAGS
from localcluster.servers.server import START_TIMEOUT, LocalServer
from localcluster.servers.webhook import CONFIGURATION_NAME, publish_profile, set_opt_in
from webhook.admission import Reviewer
from webhook.config import settings_from_args
from webhook.profile_source import PolicyStore


class InProcessWebhook:
    """One tenant's webhook decisions, made here by the webhook's code: the settings its
    Deployment would run with (the tenant part's arguments and environment, rendered for the
    measured tenant; only POD_NAMESPACE names the namespace), and the ConfigMaps its informers
    would read (its profile, its room figures), read once from the API server."""

    def __init__(self, tenant_part: Rendered, namespace: str, kube: Kube) -> None:
        self.namespace = namespace
        part = Rendered(namespace, tenant_part.docs)
        environ = part.environment(WEBHOOK_DEPLOYMENT, WEBHOOK_DEPLOYMENT)
        args = part.args(WEBHOOK_DEPLOYMENT, replace=LOCAL_FLAGS)
        # TLS is the process's edge; nothing here serves, so the files are never opened.
        settings = settings_from_args([*args, "--cert=unused", "--key=unused"], environ)
        self.store = PolicyStore(settings.policy)
        for name in self.store.names:
            self.store.feed.read(name, _get(kube, namespace, name))
        self.store.room_read(_get(kube, namespace, ROOM_CONFIGMAP))
        if not self.store.ready or self.store.feed.snapshot.profile is None:
            raise SystemExit(f"{namespace}: the in-process webhook verified no profile")
        self.reviewer = Reviewer(self.store)

    def answer(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The AdmissionReview response object for a review body."""
        request = body["request"]
        outcome = self.reviewer.review(request, request["uid"], datetime.now(UTC))
        return dict(outcome.response)

    def planned(self, pod: JSON) -> JSON:
        """The Pod with the webhook's patch applied: what the API server would store."""
        response = self.answer(review(pod, namespace=self.namespace))
        if not response.get("allowed"):
            raise SystemExit(f"{self.namespace}: the webhook's code refused the Pod: {response}")
        ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        planned: JSON = jsonpatch.apply_patch(pod, ops)
        return planned


def _get(kube: Kube, namespace: str, name: str) -> JSON | None:
    try:
        return kube.get("v1", "ConfigMap", name, namespace)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _process_answer(url: str, ca_file: str, body: Mapping[str, Any]) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=ca_file)
    request = urllib.request.Request(
        f"{url}/mutate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as resp:
        answer: dict[str, Any] = json.loads(resp.read())["response"]
    return answer


def check_in_process(stack: TenantStack, pod: JSON) -> dict[str, Any]:
    """The same review answered by the measured tenant's webhook process and by its code here:
    whether the answers (allowed, patch) are the same, and the plan each wrote."""
    assert stack.webhook is not None and stack.tenant is not None
    namespace = stack.settings.namespace
    body = review(pod, namespace=namespace)
    here = InProcessWebhook(stack.tenant, namespace, stack.plane.kube("admin")).answer(body)
    there = _process_answer(stack.webhook.url, str(stack.plane.ca_file), body)

    def plan(response: Mapping[str, Any]) -> str | None:
        ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        patched = jsonpatch.apply_patch(pod, ops)
        return (patched["metadata"].get("annotations") or {}).get(PLAN_ANNOTATION)

    same = (here.get("allowed"), here.get("patch")) == (there.get("allowed"), there.get("patch"))
    return {"same_answer": same, "plan_in_process": plan(here), "plan_by_process": plan(there)}


_VOLATILE_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "managedFields",
    "generation",
)


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_leaves(item, f"{path}/{key}"))
        return out
    if isinstance(value, list):
        out = {}
        for index, item in enumerate(value):
            out.update(_leaves(item, f"{path}/{index}"))
        return out
    return {path: value}


def _comparable(pod: JSON) -> JSON:
    metadata = {k: v for k, v in pod["metadata"].items() if k not in _VOLATILE_METADATA}
    labels = dict(metadata.get("labels") or {})
    labels.pop(ENGINE_LABEL, None)
    annotations = dict(metadata.get("annotations") or {})
    plan = json.loads(annotations.pop(PLAN_ANNOTATION, "{}"))
    metadata.update(labels=labels, annotations=annotations)
    spec = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
    return {"metadata": metadata, "spec": spec, "plan": plan}


def stored_difference(measured: JSON, further: JSON) -> dict[str, Any]:
    """Where the measured tenant's stored engine Pod (planned by its webhook process) and a
    further tenant's (planned here) differ, names, uids, node and deployment id aside; the
    ServiceAccount token volume's random suffix is the API server's own."""
    a, b = _leaves(_comparable(measured)), _leaves(_comparable(further))
    differing = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    token = [k for k in differing if "kube-api-access-" in str(a.get(k)) + str(b.get(k))]
    return {
        "differing_paths": [k for k in differing if k not in token],
        "token_volume_name_paths": token,
    }


def _wait_owner_rbac(stack: TenantStack, namespace: str) -> None:
    """Until the owner's Roles in the namespace let its servers in (no tenant part is installed
    for a further tenant here, so its webhook's grants are not waited for)."""
    owner_ns = stack.settings.scheduler_namespace
    account = "system:serviceaccount:{}:{}".format
    wait_allowed(
        stack.plane,
        account(owner_ns, CONTROLLER_DEPLOYMENT),
        [{"resource": "pods", "subresource": "status", "verb": "patch", "namespace": namespace}],
    )
    wait_allowed(
        stack.plane,
        account(owner_ns, EXTENDER_DEPLOYMENT),
        [{"resource": "configmaps", "verb": "create", "namespace": namespace}],
    )


def _roll(server: LocalServer) -> None:
    """Stop the server and start it again with its new settings, as a rollout replaces a Pod;
    one that does not get ready in time is left running, for its /readyz to say why."""
    server.stop()
    server.spawn()
    server.wait_ready(START_TIMEOUT)


@dataclass
class FurtherTenants:
    """The further tenants installed by `install_further`: their namespaces, the owner part
    rendered for all of them, and their engine Pods' names."""

    namespaces: list[str]
    owner: Rendered
    pods: dict[str, str]


def install_further(
    stack: TenantStack, owner: Owner, namespaces: Sequence[str], request: Mapping[str, Any]
) -> FurtherTenants:
    """Every further tenant as the module docstring says; with none, the same upgrade (the
    owner part rendered again, applied, the extender and the controller rolled), so both runs'
    owner processes have the same history."""
    assert stack.extender is not None and stack.controller is not None
    plane, settings = stack.plane, stack.settings
    owner_ns = settings.scheduler_namespace
    admin = plane.kube("admin")
    for ns in namespaces:
        plane.create_namespace(ns)
        grant_installer(plane, ns)
        publish_profile(
            plane, owner.sign(whole_h100_envelope(owner, ns), name=settings.bundle_configmap)
        )
        url = f"https://{HOST}:{free_port()}/mutate"
        stack.further_tenants.append(
            {
                "namespace": ns,
                "ownerPublicKey": ",".join(settings.owner_public_keys),
                "clusterBindingId": settings.cluster_binding_id,
                "bundleConfigMap": settings.bundle_configmap,
                "webhook": {"url": url, "caBundle": plane.ca_bundle},
            }
        )
    part = render_owner(stack.values(), owner_ns)
    _apply(stack, _owner_applied(part))
    wanted = set(namespaces)
    params = [
        d
        for d in policy_docs(part)
        if d["kind"] != "CustomResourceDefinition" and any(_ours(d, ns) for ns in wanted)
    ]
    _apply(stack, params)
    for ns in namespaces:
        set_opt_in(plane, ns, True)
        _wait_owner_rbac(stack, ns)
    stack.owner = part
    stack.extender.install = part
    _roll(stack.extender)
    stack.controller.set_install(part)
    for replica in stack.controller.replicas:
        _roll(replica)
    stack.controller.wait_leader()
    # The room figures the extender now writes into each namespace, as a webhook would read them.
    for ns in namespaces:
        wait_until(
            lambda n=ns: _get(admin, n, ROOM_CONFIGMAP) is not None,  # type: ignore[misc]
            timeout=60,
            what=f"the extender's room figures in {ns}",
        )
    installer = plane.kube(INSTALLER)
    pods: dict[str, str] = {}
    assert stack.tenant is not None
    for ns in namespaces:
        name = f"engine-{uuid.uuid4().hex[:6]}"
        pod = engine_pod(ns, request, name=name)
        installer.create(InProcessWebhook(stack.tenant, ns, admin).planned(pod))
        pods[ns] = name
    for ns in namespaces:
        configuration = part.get("MutatingWebhookConfiguration", f"{CONFIGURATION_NAME}-{ns}")
        _apply(stack, [configuration])
    return FurtherTenants(list(namespaces), part, pods)


__all__ = [
    "FurtherTenants",
    "InProcessWebhook",
    "check_in_process",
    "install_further",
    "stored_difference",
]
