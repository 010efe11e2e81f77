"""The tenant pod guard (manifests/guard) on a real 1.36 API server.

Requests are made as ``tmi-installer``, a user bound to the ``admin`` ClusterRole in
the kamiwaza namespace only, so a refusal proves the ValidatingAdmissionPolicy (not
RBAC) stopped it. Pods are created with a server-side dry run: admission runs in full
and nothing is left behind.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from inference_policy.tools.doctor import EXEC_GUARD, POD_GUARD
from localcluster import ApiError, ControlPlane, Kube
from localcluster.servers.guard import (
    apply_guard,
    dry_run_create,
    post_exec,
    privileged_probe_pod,
)

pytestmark = pytest.mark.e2e

NS = "kamiwaza"
INIT_MESSAGE = "NET_ADMIN and NET_RAW are allowed only for the Istio-injected istio-init"
SA_VOLUME = "kube-api-access-x7k2p"
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture(scope="module")
def installer(control_plane: ControlPlane) -> Iterator[Kube]:
    apply_guard(control_plane, NS)
    control_plane.grant_namespace_admin("tmi-installer", NS)
    kube = control_plane.kube("tmi-installer")
    # Not RBAC: the installer may create pods in the namespace.
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": NS, "verb": "create", "resource": "pods"}},
    }
    assert kube.request(
        "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review
    )["status"]["allowed"]
    yield kube


def _name() -> str:
    return f"probe-{uuid.uuid4().hex[:8]}"


def _pod(spec: dict[str, Any], namespace: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": _name(), "namespace": namespace},
        "spec": spec,
    }


def _app() -> dict[str, Any]:
    return {"name": "app", "image": "registry.example/inference:1"}


def istio_injected_pod() -> dict[str, Any]:
    """A pod as istiod's sidecar injector and the ServiceAccount admission plugin leave it.

    istio-init: the mesh's proxyv2 image with its own entrypoint, the istio-iptables
    subcommand, NET_ADMIN/NET_RAW added and ALL dropped, proxyMetadata copied in as
    literal env values, and only the kube-api-access-* token volume mounted read-only.
    """
    return _pod(
        {
            # Set by the ServiceAccount admission plugin together with the token
            # volume; pod validation refuses a token projection without it.
            "serviceAccountName": "default",
            "initContainers": [
                {
                    "name": "istio-init",
                    "image": "docker.io/istio/proxyv2:1.30.3",
                    "imagePullPolicy": "IfNotPresent",
                    "args": [
                        "istio-iptables",
                        "-p",
                        "15001",
                        "-z",
                        "15006",
                        "-u",
                        "1337",
                        "-m",
                        "REDIRECT",
                        "-i",
                        "*",
                        "-x",
                        "",
                        "-b",
                        "*",
                        "-d",
                        "15090,15021,15020",
                        "--log_output_level=default:info",
                    ],
                    "env": [
                        {"name": "ISTIO_META_DNS_CAPTURE", "value": "true"},
                        {"name": "ISTIO_META_DNS_AUTO_ALLOCATE", "value": "true"},
                    ],
                    "resources": {
                        "limits": {"cpu": "2", "memory": "1Gi"},
                        "requests": {"cpu": "10m", "memory": "40Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
                        "privileged": False,
                        "readOnlyRootFilesystem": False,
                        "runAsGroup": 0,
                        "runAsNonRoot": False,
                        "runAsUser": 0,
                    },
                    "volumeMounts": [{"name": SA_VOLUME, "mountPath": SA_MOUNT, "readOnly": True}],
                }
            ],
            "containers": [
                {
                    **_app(),
                    "volumeMounts": [{"name": SA_VOLUME, "mountPath": SA_MOUNT, "readOnly": True}],
                },
                {
                    "name": "istio-proxy",
                    "image": "docker.io/istio/proxyv2:1.30.3",
                    "args": ["proxy", "sidecar"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "runAsUser": 1337,
                        "runAsGroup": 1337,
                        "runAsNonRoot": True,
                    },
                    "volumeMounts": [{"name": SA_VOLUME, "mountPath": SA_MOUNT, "readOnly": True}],
                },
            ],
            "volumes": [
                {
                    "name": SA_VOLUME,
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                }
            ],
        }
    )


def _assert_refused(err: ApiError | None, policy: str, message: str) -> None:
    assert err is not None, "expected the guard to refuse, but the request was admitted"
    assert err.status == 403, err
    assert f"ValidatingAdmissionPolicy '{policy}'" in err.message, err.message
    assert message in err.message, err.message


# -- baseline controls --------------------------------------------------------


def test_privileged_pod_refused(installer: Kube) -> None:
    pod = _pod({"containers": [{**_app(), "securityContext": {"privileged": True}}]})
    _assert_refused(
        dry_run_create(installer, pod),
        POD_GUARD,
        "privileged containers are not allowed in the Kamiwaza tenant namespace: app",
    )


def test_host_path_refused(installer: Kube) -> None:
    pod = _pod(
        {
            "containers": [{**_app(), "volumeMounts": [{"name": "root", "mountPath": "/host"}]}],
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        }
    )
    _assert_refused(
        dry_run_create(installer, pod),
        POD_GUARD,
        "hostPath volumes are not allowed in the Kamiwaza tenant namespace: root",
    )


def test_host_pid_refused(installer: Kube) -> None:
    pod = _pod({"hostPID": True, "containers": [_app()]})
    _assert_refused(
        dry_run_create(installer, pod),
        POD_GUARD,
        "hostNetwork, hostPID and hostIPC are not allowed in the Kamiwaza tenant namespace.",
    )


def test_seed_probe_refused(installer: Kube) -> None:
    _assert_refused(
        dry_run_create(installer, privileged_probe_pod(NS, _name())),
        POD_GUARD,
        "not allowed in the Kamiwaza tenant namespace",
    )


def test_plain_pod_admitted(installer: Kube) -> None:
    assert dry_run_create(installer, _pod({"containers": [_app()]})) is None


def test_guard_binds_only_the_kamiwaza_namespaces(
    control_plane: ControlPlane, installer: Kube, new_namespace: Callable[[str], str]
) -> None:
    other = new_namespace("unguarded")
    pod = _pod({"containers": [{**_app(), "securityContext": {"privileged": True}}]}, other)
    assert dry_run_create(control_plane.kube("admin"), pod) is None


def test_namespace_admin_cannot_touch_the_policies(installer: Kube) -> None:
    for verb, path in (
        ("GET", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"),
        (
            "DELETE",
            f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{POD_GUARD}",
        ),
    ):
        with pytest.raises(ApiError) as denied:
            installer.request(verb, path)
        assert denied.value.status == 403


# -- the istio-init exception -------------------------------------------------


def test_istio_injected_shape_admitted(installer: Kube) -> None:
    assert dry_run_create(installer, istio_injected_pod()) is None


def _init(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["initContainers"][0]
    return container


def _other_image(pod: dict[str, Any]) -> None:
    _init(pod)["image"] = "docker.io/istio/proxyv2-evil:1.30.3"


def _lookalike_registry(pod: dict[str, Any]) -> None:
    _init(pod)["image"] = "docker.io/istio/proxyv2.evil.example/x:1"


def _command(pod: dict[str, Any]) -> None:
    _init(pod)["command"] = ["/bin/sh", "-c"]


def _not_iptables(pod: dict[str, Any]) -> None:
    _init(pod)["args"] = ["sh", "-c", "sleep 1d"]


def _ld_preload(pod: dict[str, Any]) -> None:
    _init(pod)["env"].append({"name": "LD_PRELOAD", "value": "/tmp/x.so"})


def _path(pod: dict[str, Any]) -> None:
    _init(pod)["env"].append({"name": "PATH", "value": "/tmp"})


def _xtables(pod: dict[str, Any]) -> None:
    _init(pod)["env"].append({"name": "XTABLES_LIBDIR", "value": "/tmp"})


def _value_from(pod: dict[str, Any]) -> None:
    _init(pod)["env"].append(
        {
            "name": "ISTIO_META_CLUSTER_ID",
            "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}},
        }
    )


def _env_from(pod: dict[str, Any]) -> None:
    _init(pod)["envFrom"] = [{"configMapRef": {"name": "x"}}]


def _extra_volume(pod: dict[str, Any]) -> None:
    pod["spec"]["volumes"].append({"name": "scratch", "emptyDir": {}})
    _init(pod)["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"})


def _writable_token_mount(pod: dict[str, Any]) -> None:
    _init(pod)["volumeMounts"][0]["readOnly"] = False


def _token_volume_other_configmap(pod: dict[str, Any]) -> None:
    sources = pod["spec"]["volumes"][0]["projected"]["sources"]
    sources[1]["configMap"]["name"] = "attacker-files"


def _restart_always(pod: dict[str, Any]) -> None:
    _init(pod)["restartPolicy"] = "Always"


def _escalation_allowed(pod: dict[str, Any]) -> None:
    _init(pod)["securityContext"]["allowPrivilegeEscalation"] = True


def _sys_admin(pod: dict[str, Any]) -> None:
    _init(pod)["securityContext"]["capabilities"]["add"].append("SYS_ADMIN")


@pytest.mark.parametrize(
    "mutate",
    [
        _other_image,
        _lookalike_registry,
        _command,
        _not_iptables,
        _ld_preload,
        _path,
        _xtables,
        _value_from,
        _env_from,
        _extra_volume,
        _writable_token_mount,
        _token_volume_other_configmap,
        _restart_always,
        _escalation_allowed,
        _sys_admin,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
def test_istio_init_refused_when_one_detail_differs(
    installer: Kube, mutate: Callable[[dict[str, Any]], None]
) -> None:
    pod = copy.deepcopy(istio_injected_pod())
    mutate(pod)
    _assert_refused(dry_run_create(installer, pod), POD_GUARD, INIT_MESSAGE)


def test_container_merely_named_istio_init_gets_nothing(installer: Kube) -> None:
    pod = _pod(
        {
            "initContainers": [
                {
                    "name": "istio-init",
                    "image": "busybox:1.37",
                    "args": ["sh", "-c", "ip link"],
                    "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}},
                }
            ],
            "containers": [_app()],
        }
    )
    _assert_refused(dry_run_create(installer, pod), POD_GUARD, INIT_MESSAGE)


def test_net_admin_in_a_regular_container_refused(installer: Kube) -> None:
    pod = istio_injected_pod()
    # The exact istio-init container, but as a regular container: no exception.
    pod["spec"]["containers"].append({**_init(pod), "name": "istio-init"})
    pod["spec"]["initContainers"] = []
    _assert_refused(
        dry_run_create(installer, pod),
        POD_GUARD,
        "containers may add only the Pod Security baseline capabilities",
    )


# -- exec and attach ----------------------------------------------------------

EXEC_MESSAGE = "exec and attach into istio-init are not allowed in the Kamiwaza tenant namespace."


def test_exec_into_istio_init_refused(installer: Kube) -> None:
    _assert_refused(
        post_exec(installer, NS, "kamiwaza-exec-guard-probe", "istio-init"),
        EXEC_GUARD,
        EXEC_MESSAGE,
    )


def test_attach_into_istio_init_refused(installer: Kube) -> None:
    path = f"/api/v1/namespaces/{NS}/pods/kamiwaza-exec-guard-probe/attach"
    with pytest.raises(ApiError) as denied:
        installer.request("POST", path, query=[("container", "istio-init"), ("stdout", "true")])
    _assert_refused(denied.value, EXEC_GUARD, EXEC_MESSAGE)


@pytest.mark.parametrize("container", ["app", None])
def test_exec_into_other_containers_passes_the_guard(
    installer: Kube, container: str | None
) -> None:
    # Past admission the API server looks the pod up; NotFound proves the guard let
    # it through (and that RBAC allowed it).
    err = post_exec(installer, NS, "kamiwaza-exec-guard-probe", container)
    assert err is not None
    assert err.status == 404, err
