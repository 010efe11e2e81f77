"""The images the real node runs, assembled here and imported into its containerd (no registry).

* ``pause``: the Pod sandbox (``tmi-probe pause``), named in containerd's configuration;
* ``probe``: the engine stand-in (``tmi-probe``), which prints the environment the runtime gave
  it. Like NVIDIA's CUDA base images it sets ``NVIDIA_VISIBLE_DEVICES=all`` in its own
  configuration, so every test on the real node also proves that what reaches the process is
  the device plugin's allocation or the shield's ``void``, never the image's value;
* ``kube-scheduler``: the owner's second scheduler for the chart's Deployment, the binary the
  control plane runs;
* ``tmi``: the project's image as ``localcluster.install.image`` assembles it (the
  Dockerfile's parts).

Each is an OCI layout written by ``tmi-oci``; ``import_into`` tars it, imports it with ``ctr``
under its tag and also names it by digest, as a registry pull would, so digest-pinned
references (the engine image map, the chart's ``image.digest``) resolve on the node.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from localcluster.install.image import app_layer, assemble, base_layer, debian_closure
from localcluster.plane.binaries import bin_dir
from policy_io.catalog import packaged_catalog

REGISTRY = "tmi.local"
PAUSE = f"{REGISTRY}/pause:1"
PROBE = f"{REGISTRY}/probe:1"
SCHEDULER_REPOSITORY = f"{REGISTRY}/kube-scheduler"
TMI_REPOSITORY = f"{REGISTRY}/tmi"
TMI_TAG = "local"
# What NVIDIA's CUDA base images set, and what the runtime must not let through.
IMAGE_ENV = ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")


class NodeImageError(RuntimeError):
    """An image could not be written or imported; the message has the command's output."""


@dataclass(frozen=True)
class NodeImage:
    """One image: its tag, manifest digest and layout directory."""

    tag: str
    digest: str
    layout: Path

    @property
    def repository(self) -> str:
        return self.tag.rsplit(":", 1)[0]

    @property
    def pinned(self) -> str:
        return f"{self.repository}@{self.digest}"


def engine_image_map(probe: NodeImage) -> tuple[tuple[str, str], ...]:
    """Every catalog image mapped to the probe by digest (the chart's engineImageMap, relocation
    rule 1): on the real node every engine Pod runs the probe."""
    return tuple(sorted({(row[4], probe.pinned) for row in packaged_catalog().rows()}))


def _run(args: Sequence[str]) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NodeImageError(f"{' '.join(args[:4])}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _file_layer(dest: Path, files: Mapping[str, Path]) -> Path:
    """An uncompressed layer holding ``files`` (path in image -> file here), mode 0755, owned
    by root, dated 0: the same bytes for the same binaries."""
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for name in sorted(files):
            parts = name.strip("/").split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in dirs:
                    dirs.add(directory)
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            data = files[name].read_bytes()
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return dest


def _oci(
    layout: Path, tag: str, layers: Sequence[Path], *, user: str, cmd: str, env: Sequence[str]
) -> NodeImage:
    args = [str(bin_dir() / "tmi-oci"), f"-out={layout}", f"-tag={tag}", f"-user={user}"]
    args += [f"-env={e}" for e in env] + [f"-cmd={cmd}"]
    digest = _run([*args, *map(str, layers)]).strip()
    return NodeImage(tag, digest, layout)


def probe_images(workdir: Path, node_bins: Path) -> tuple[NodeImage, NodeImage]:
    """The sandbox image and the engine stand-in, from one layer with ``tmi-probe``."""
    workdir.mkdir(parents=True, exist_ok=True)
    layer = _file_layer(workdir / "probe.tar", {"usr/bin/tmi-probe": node_bins / "tmi-probe"})
    pause = _oci(
        workdir / "pause",
        PAUSE,
        [layer],
        user="65535:65535",
        cmd="/usr/bin/tmi-probe,pause",
        env=(),
    )
    probe = _oci(
        workdir / "probe",
        PROBE,
        [layer],
        user="65532:65532",
        cmd="/usr/bin/tmi-probe,-listen=:8080",
        env=("PATH=/usr/bin:/bin", *IMAGE_ENV),
    )
    return pause, probe


def scheduler_image(workdir: Path, version: str) -> NodeImage:
    """kube-scheduler on PATH, as registry.k8s.io's image has it."""
    workdir.mkdir(parents=True, exist_ok=True)
    layer = _file_layer(
        workdir / "kube-scheduler.tar",
        {"usr/local/bin/kube-scheduler": bin_dir() / "kube-scheduler"},
    )
    return _oci(
        workdir / "kube-scheduler",
        f"{SCHEDULER_REPOSITORY}:{version}",
        [layer],
        user="65532:65532",
        cmd="kube-scheduler,--help",
        env=("PATH=/usr/local/bin:/usr/bin:/bin",),
    )


def tmi_image(workdir: Path) -> NodeImage:
    """The project's image from its two layers (``localcluster.install.image``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    base = base_layer(workdir / "base.tar", debian_closure())
    app = app_layer(workdir / "app.tar", workdir / "build")
    tag = f"{TMI_REPOSITORY}:{TMI_TAG}"
    digest = assemble(workdir / "tmi", [base, app], tag=tag)
    return NodeImage(tag, digest, workdir / "tmi")


def import_into(ctr: Sequence[str], image: NodeImage) -> None:
    """Import ``image`` into containerd's CRI namespace under its tag and its digest."""
    archive = image.layout.with_suffix(".oci.tar")
    with tarfile.open(archive, "w") as tar:
        for path in sorted(image.layout.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(image.layout)), recursive=False)
    _run([*ctr, "images", "import", str(archive)])
    known = set(_run([*ctr, "images", "ls", "-q"]).split())
    if image.pinned not in known:
        _run([*ctr, "images", "tag", image.tag, image.pinned])
