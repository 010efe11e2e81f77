"""Representative Pods of a tenant namespace, for the guard that holds the owner parts to the
tenant-input inventory (`tests/integration/serving/test_tenant_inputs_read.py`).

An engine Pod of every plan path (whole GPU, MIG slice, VRAM share, DRA claim, CPU), Pending
and bound and verified; one changed after its plan in every way the checks look at; plans that
place nothing or grant no device while the Pod reaches; a malformed plan, an unknown revision,
an unschedulable Pod, a terminating one, a finished one, one whose label was removed, one in no
tenant's namespace; plain Pods, reaching or pinned to a node. Each carries what the inventory
says no owner part reads (`with_unread`), so a read of any of it would be recorded.
"""

from __future__ import annotations

import copy
import json
import uuid
from datetime import timedelta
from typing import Any

from inference_policy.base.wire import ALLOCATION_VERIFIED, ENGINE_LABEL, PLAN_ANNOTATION
from inference_policy.trust.dra_claims import CLAIM_NAME
from kits.extenderkit import NAMESPACE, block, bound, plan_for, planned_pod, request
from kits.profilekit import NOW, NOW_TEXT, Owner

DRA_BINDING = "h100-dra"
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
EARLIER = (NOW - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")

# What a tenant may set that no owner part should read: on the Pod, on each container.
UNREAD_METADATA = {
    "generateName": "engine-",
    "finalizers": ["example.com/hold"],
    "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": str(uuid.uuid4())}
    ],
    "managedFields": [{"manager": "tenant", "operation": "Update"}],
}
UNREAD_SPEC: dict[str, Any] = {
    "affinity": {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [{"key": ENGINE_LABEL, "operator": "Exists"}]
                    },
                    "namespaceSelector": {},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    },
    "tolerations": [{"operator": "Exists"}],
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
    ],
    "priorityClassName": "system-cluster-critical",
    "priority": 2000000000,
    "preemptionPolicy": "PreemptLowerPriority",
    "schedulingGates": [{"name": "example.com/gate"}],
    "volumes": [{"name": "scratch", "emptyDir": {}}],
    "serviceAccountName": "tenant",
    "automountServiceAccountToken": False,
    "imagePullSecrets": [{"name": "pull"}],
    "dnsPolicy": "ClusterFirst",
    "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["x"]}],
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 3600,
    "activeDeadlineSeconds": 86400,
    "os": {"name": "linux"},
    "hostUsers": False,
    "shareProcessNamespace": True,
    "securityContext": {"runAsNonRoot": True},
}
UNREAD_CONTAINER: dict[str, Any] = {
    "command": ["serve"],
    "args": ["--port", "8080"],
    "ports": [{"containerPort": 8080}],
    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "volumeDevices": [{"name": "block", "devicePath": "/dev/xvda"}],
    "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
    "startupProbe": {"httpGet": {"path": "/ready", "port": 8080}},
    "lifecycle": {"preStop": {"exec": {"command": ["stop"]}}},
    "workingDir": "/srv",
    "securityContext": {"allowPrivilegeEscalation": False},
}
SIDECARS: list[dict[str, Any]] = [
    {
        "name": "metrics",
        "image": "registry.invalid/exporter:1",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "env": [VOID],
    }
]
INITS: list[dict[str, Any]] = [
    {
        "name": "proxy",
        "image": "registry.invalid/proxy:1",
        "restartPolicy": "Always",
        "resources": {"requests": {"cpu": "100m"}},
        "env": [VOID],
    },
    {"name": "fetch", "image": "registry.invalid/fetch:1", "env": [VOID]},
]
STATUS = {
    "hostIP": "10.0.0.2",
    "podIP": "10.1.0.2",
    "startTime": EARLIER,
    "qosClass": "Burstable",
    "message": "tenant",
    "reason": "Tenant",
    "containerStatuses": [
        {"name": "engine", "containerID": "containerd://" + "a" * 64, "ready": True}
    ],
    "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": EARLIER},
        {"type": "example.com/Warm", "status": "True", "lastTransitionTime": EARLIER},
    ],
}


def with_unread(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` with everything of the tenant's that no owner part should read."""
    out = copy.deepcopy(pod)
    meta = out["metadata"]
    meta.update(copy.deepcopy(UNREAD_METADATA))
    meta.setdefault("labels", {})["app.kubernetes.io/name"] = "engine"
    meta.setdefault("annotations", {})["example.com/note"] = "tenant"
    meta["creationTimestamp"] = EARLIER
    meta["resourceVersion"] = str(uuid.uuid4().int % 10**9)
    meta.setdefault("uid", str(uuid.uuid4()))
    spec = out["spec"]
    spec.update(copy.deepcopy(UNREAD_SPEC))
    spec.setdefault("nodeSelector", {})["example.com/pool"] = "a"
    spec["containers"] += copy.deepcopy(SIDECARS)
    spec["initContainers"] = copy.deepcopy(INITS)
    for container in spec["containers"] + spec["initContainers"]:
        container.update(copy.deepcopy(UNREAD_CONTAINER))
    status = out.setdefault("status", {})
    for key, value in copy.deepcopy(STATUS).items():
        status.setdefault(key, value)
    return out


def with_verdict(pod: dict[str, Any], status: str = "True") -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["status"]["conditions"].append(
        {"type": ALLOCATION_VERIFIED, "status": status, "reason": "Verified", "message": "ok"}
    )
    return out


def plain_pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"plain-{uuid.uuid4().hex[:6]}", "namespace": NAMESPACE},
        "spec": {
            "containers": [{"name": "app", "image": "registry.invalid/app:1", "env": [VOID]}],
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def corpus(owner: Owner, envelope: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every representative Pod by name, as the API server stores them."""
    plans = {
        "whole": plan_for(owner, envelope, request(inferenceResources=block("nvidia-whole"))),
        "mig": plan_for(owner, envelope, request(inferenceResources=block("nvidia-mig-3g40gb"))),
        "share": plan_for(owner, envelope, request(inferenceResources=block("nvidia-vram-share"))),
        "dra": plan_for(owner, envelope, request(inferenceResources=block("nvidia-dra"))),
        "cpu": plan_for(owner, envelope, request(config__force_cpu=True)),
    }
    pods: dict[str, dict[str, Any]] = {}
    for path, plan in plans.items():
        pending = with_unread(planned_pod(plan))
        pods[f"{path}-pending"] = pending
        running = with_unread(bound(planned_pod(plan), "h100-8"))
        pods[f"{path}-running"] = with_verdict(running)
    pods["dra-running"]["status"]["resourceClaimStatuses"] = [
        {"name": CLAIM_NAME, "resourceClaimName": "dra-claim"}
    ]
    forged = copy.deepcopy(pods["whole-running"])
    engine = forged["spec"]["containers"][0]
    engine["image"] = "registry.invalid/other:1"
    engine["resources"]["limits"]["nvidia.com/gpu"] = "8"
    engine["envFrom"] = [{"configMapRef": {"name": "devices"}}]
    forged["spec"].pop("runtimeClassName", None)
    forged["spec"]["nodeSelector"]["kubernetes.io/arch"] = "arm64"
    forged["spec"]["containers"].append({"name": "unshielded", "image": "registry.invalid/u:1"})
    forged["metadata"]["annotations"]["cdi.k8s.io/devices"] = "nvidia.com/gpu=all"
    pods["forged-running"] = forged
    external = copy.deepcopy(pods["whole-pending"])
    external["metadata"]["annotations"][PLAN_ANNOTATION] = json.dumps(
        {"status": 200, "path": "external", "derived": True, "engine": "llamacpp"}
    )
    pods["external-reaching"] = external
    cpu_reaching = copy.deepcopy(pods["cpu-pending"])
    cpu_reaching["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    pods["cpu-reaching"] = cpu_reaching
    malformed = copy.deepcopy(pods["whole-pending"])
    malformed["metadata"]["annotations"][PLAN_ANNOTATION] = "{not json"
    pods["malformed-plan"] = malformed
    unknown = copy.deepcopy(pods["whole-running"])
    plan = json.loads(unknown["metadata"]["annotations"][PLAN_ANNOTATION])
    plan["bundle"]["sha256"] = "0" * 64
    unknown["metadata"]["annotations"][PLAN_ANNOTATION] = json.dumps(plan)
    pods["unknown-revision"] = unknown
    late = copy.deepcopy(pods["whole-pending"])
    late["status"]["conditions"][0] = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/11 nodes are available",
    }
    pods["unschedulable"] = late
    pods["whole-running"]["spec"]["overhead"] = {"cpu": "250m", "memory": "120Mi"}
    pods["terminating"] = copy.deepcopy(pods["whole-running"])
    pods["terminating"]["metadata"]["deletionTimestamp"] = NOW_TEXT
    pods["succeeded"] = copy.deepcopy(pods["whole-running"])
    pods["succeeded"]["status"]["phase"] = "Succeeded"
    departed = copy.deepcopy(pods["whole-running"])
    del departed["metadata"]["labels"][ENGINE_LABEL]
    pods["departed"] = departed
    elsewhere = copy.deepcopy(pods["whole-pending"])
    elsewhere["metadata"]["namespace"] = "elsewhere"
    pods["elsewhere"] = elsewhere
    pods["plain"] = with_unread(plain_pod())
    debug = {"name": "debug", "image": "registry.invalid/debug:1", "env": [VOID]}
    for name in ("plain", "whole-running"):
        pods[name]["spec"]["ephemeralContainers"] = [{**debug, **copy.deepcopy(UNREAD_CONTAINER)}]
    pods["plain-reaching"] = with_unread(
        plain_pod(resources={"limits": {"nvidia.com/gpu": "1"}}, runtimeClassName="nvidia")
    )
    pods["plain-pinned"] = with_unread(plain_pod(nodeName="h100-8"))
    for name, pod in pods.items():
        pod["metadata"]["name"] = name
    return pods
