"""Which Pod a host process belongs to, from its cgroup: the link between NVML's pids and Pods.

NVML and nvidia-smi name processes by host pid; Kubernetes names Pods by uid. The kubelet puts
every container in a cgroup whose path carries the Pod uid, so `/proc/<pid>/cgroup` joins the
two without asking the container runtime. The path has four shapes, by cgroup version and the
kubelet's cgroup driver:

* systemd driver: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, "_"
  for "-">.slice/cri-containerd-<container id>.scope` (`crio-<id>.scope`, `docker-<id>.scope`);
  a Guaranteed Pod has no QoS level (`kubepods-pod<uid>.slice`);
* cgroupfs driver: `/kubepods/burstable/pod<uid>/<container id>`, `/kubepods/pod<uid>/<id>`.

cgroup v1 lists one line per hierarchy (`4:memory:/kubepods/...`), v2 one line `0::/...`. A
reader in a cgroup namespace of its own sees the path relative to its own root
(`0::/../../kubepods-...`), so the Pod segment is searched anywhere in the path. A process
outside `kubepods` (a host process, a container started beside the kubelet) belongs to no Pod.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from inference_policy.evidence import ProcessOwner

__all__ = ["owner_from_cgroup", "read_owners"]

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# A static Pod's uid is the 32-hex hash of its manifest, without dashes.
_POD = re.compile(rf"(?:^|[/-])pod(?P<uid>{_UID}|[0-9a-f]{{32}})(?:\.slice)?(?:/|$)")
_CONTAINER = re.compile(
    r"(?:^|/)(?:cri-containerd-|crio-|docker-|containerd-|cri-o-)?(?P<id>[0-9a-f]{64})"
    r"(?:\.scope)?$"
)


def owner_from_cgroup(text: str) -> ProcessOwner:
    """The Pod uid and container id in a `/proc/<pid>/cgroup` file's text."""
    fallback = ""
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2]
        fallback = fallback or path
        if "kubepods" not in path:
            continue
        pod = _POD.search(path)
        if pod is None:
            continue
        container = _CONTAINER.search(path)
        return ProcessOwner(
            pod_uid=pod.group("uid").replace("_", "-"),
            container_id=container.group("id") if container else None,
            cgroup=path,
        )
    return ProcessOwner(pod_uid=None, cgroup=fallback)


def read_owners(
    pids: Iterable[int],
    read: Callable[[str], str] | None = None,
    proc: str = "/proc",
) -> dict[int, ProcessOwner]:
    """Each pid's owner; a pid whose cgroup cannot be read (it exited, or another PID namespace
    hides it) is left out, and the report calls its process unattributed."""
    reader = read if read is not None else _read_text
    owners: dict[int, ProcessOwner] = {}
    for pid in set(pids):
        try:
            text = reader(f"{proc}/{pid}/cgroup")
        except OSError:
            continue
        owners[pid] = owner_from_cgroup(text)
    return owners


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()
