"""Assemble the tmi image as an OCI layout without a registry, and unpack it to run from.

No image registry is reachable from the machines that build and test tmi, so ``docker build``
cannot fetch the base. The image is proven instead from its two parts, the way the Dockerfile
puts them together: a base layer with Python 3.11 from the Debian bookworm packages installed
on the machine (the python3.11 package and its dependency closure, file by file as dpkg lists
them), and the application layer the Dockerfile's build stage makes (a virtual environment at
/opt/tmi from uv.lock, the packages the Dockerfile copies and nothing else, the lock file and a
CycloneDX SBOM). ``tmi-oci``
(go-containerregistry, built by tools/k8sbin/build.sh) writes the OCI layout; ``unpack`` lays
its layers out as a root filesystem a test runs the servers from.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from localcluster.plane.binaries import bin_dir

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
# The interpreter, and what the relocatable environment's console scripts start with (a POSIX
# shell, realpath and dirname), as the Debian base image has them.
BASE_PACKAGES = ("python3.11", "dash", "coreutils")
INTERPRETER = Path("/usr/bin/python3.11")
APP = Path("opt/tmi")
USER = "65532:65532"
ENV = ("PATH=/opt/tmi/bin:/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1")
# Merged /usr: these top-level names are links into /usr, as on the Debian base image.
MERGED_USR = ("bin", "lib", "lib64", "sbin")


class ImageError(RuntimeError):
    """A step of the assembly failed; the message has the command's output."""


def _run(args: list[str], **kwargs: object) -> str:
    done = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise ImageError(f"{' '.join(args[:3])}: {done.stderr.strip() or done.stdout.strip()}")
    return str(done.stdout)


def _installed(package: str) -> bool:
    status = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
    )
    return "install ok installed" in status.stdout


def _require(packages: tuple[str, ...], why: str = "") -> None:
    """ImageError naming the first of `packages` that is not installed, and how to install it."""
    for package in packages:
        if not _installed(package):
            reason = f": {why}" if why else ""
            raise ImageError(
                f"Debian package {package} is not installed (apt-get install {package}){reason}"
            )


def debian_closure(packages: tuple[str, ...] = BASE_PACKAGES) -> list[str]:
    """The installed packages and everything they (pre-)depend on, recursively, sorted; of each
    alternative the first one installed."""
    _require(packages)
    seen: set[str] = set()
    todo = list(packages)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        fields = _run(["dpkg-query", "-W", "-f=${Pre-Depends}, ${Depends}", name])
        for clause in filter(None, (c.strip() for c in fields.split(","))):
            for alternative in clause.split("|"):
                dep = alternative.strip().split(" ")[0].split(":")[0]
                if _installed(dep):
                    todo.append(dep)
                    break
    return sorted(seen)


def base_layer(dest: Path, packages: list[str]) -> Path:
    """A layer with every file the packages install, the merged-/usr links, /tmp and /run."""
    files: set[str] = set()
    for name in packages:
        for line in _run(["dpkg-query", "-L", name]).splitlines():
            path = Path(line)
            if line.startswith("/") and (path.is_file() or path.is_symlink()):
                files.add(line)
    added: set[str] = set()
    with tarfile.open(dest, "w") as tar:
        for name in MERGED_USR:
            link = Path("/") / name
            if link.is_symlink():
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(link)
                tar.addfile(info)
        for name, mode in (("tmp", 0o1777), ("run", 0o755), ("proc", 0o555), ("dev", 0o755)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for line in sorted(files):
            # Paths under a merged-/usr link go in under their real location.
            real = Path(line)
            head = real.parts[1] if len(real.parts) > 1 else ""
            if len(real.parts) == 2 and head in MERGED_USR:
                continue  # the link itself, added above
            if head in MERGED_USR and Path("/", head).is_symlink():
                real = Path("/usr", *real.parts[1:])
            arcname = str(real).lstrip("/")
            if arcname in added:
                continue
            added.add(arcname)
            tar.add(line, arcname=arcname, recursive=False)
    return dest


def copied_sources() -> list[str]:
    """What the Dockerfile's build stage copies into /src, in order."""
    build = DOCKERFILE.read_text().split("\nFROM ", 2)[1]
    sources: list[str] = []
    for line in build.splitlines():
        match = re.match(r"COPY (?!--)(.+) \S+$", line.strip())
        if match:
            sources.extend(match.group(1).split())
    return sources


def app_layer(dest: Path, workdir: Path) -> Path:
    """The build stage's result: /opt/tmi from uv.lock and the copied packages, with the lock
    file and its SBOM in /opt/tmi/share/tmi."""
    src, stage = workdir / "src", workdir / "stage"
    shutil.rmtree(workdir, ignore_errors=True)
    src.mkdir(parents=True)
    for name in copied_sources():
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, src / name)
    venv = stage / APP
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    # Relocatable: the console scripts find their interpreter relative to themselves, so the
    # environment works at /opt/tmi although it is made elsewhere.
    _run([uv, "venv", "--relocatable", "--python", str(INTERPRETER), str(venv)])
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    _run([uv, "sync", "--frozen", "--no-dev", "--no-install-project", "--active"], cwd=src, env=env)
    # As the build stage: the copied packages built into one wheel the environment installs.
    wheels = workdir / "wheels"
    _run([uv, "build", "--wheel", "--python", str(INTERPRETER), "-o", str(wheels)], cwd=src)
    [wheel] = wheels.glob("tmi-*.whl")
    _run([uv, "pip", "install", "--no-deps", "--python", str(venv / "bin" / "python"), str(wheel)])
    share = venv / "share" / "tmi"
    share.mkdir(parents=True)
    shutil.copy2(src / "uv.lock", share / "uv.lock")
    _run(
        [
            uv,
            "export",
            "--frozen",
            "--no-dev",
            "--format",
            "cyclonedx1.5",
            "--preview-features",
            "sbom-export",
            "--output-file",
            str(share / "sbom.cdx.json"),
        ],
        cwd=src,
    )
    for cache in venv.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    with tarfile.open(dest, "w") as tar:
        tar.add(stage / "opt", arcname="opt")
    return dest


def assemble(layout: Path, layers: list[Path], tag: str = "tmi:local") -> str:
    """Write the OCI layout; returns the image manifest's digest."""
    args = [str(bin_dir() / "tmi-oci"), f"-out={layout}", f"-tag={tag}", f"-user={USER}"]
    args += [f"-env={e}" for e in ENV]
    args += ["-cmd=tmi,--help", "-label=org.opencontainers.image.title=tmi"]
    return _run([*args, *map(str, layers)]).strip()


@dataclass(frozen=True)
class Layout:
    """An OCI image layout's one image: its manifest, config and layer blob paths."""

    path: Path
    manifest: dict[str, object]
    config: dict[str, object]
    layers: list[Path]

    @classmethod
    def read(cls, path: Path) -> Layout:
        index = json.loads((path / "index.json").read_text())
        (entry,) = index["manifests"]

        def blob(digest: str) -> Path:
            algorithm, _, hexa = digest.partition(":")
            return path / "blobs" / algorithm / hexa

        manifest = json.loads(blob(entry["digest"]).read_text())
        config = json.loads(blob(manifest["config"]["digest"]).read_text())
        layers = [blob(layer["digest"]) for layer in manifest["layers"]]
        return cls(path, manifest, config, layers)

    def unpack(self, rootfs: Path) -> Path:
        """Apply the layers in order (no whiteouts: the layers here add files only)."""
        rootfs.mkdir(parents=True, exist_ok=True)
        for layer in self.layers:
            with gzip.open(layer) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
                tar.extractall(rootfs, filter="tar")
        return rootfs

    def names(self) -> set[str]:
        """Every path in every layer."""
        names: set[str] = set()
        for layer in self.layers:
            with gzip.open(layer) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
                names.update(member.name for member in tar)
        return names


__all__ = [
    "BASE_PACKAGES",
    "USER",
    "ImageError",
    "Layout",
    "app_layer",
    "assemble",
    "base_layer",
    "copied_sources",
    "debian_closure",
]
