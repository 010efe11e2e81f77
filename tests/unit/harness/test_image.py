"""The Dockerfile's promises, checked without a registry or a container runtime.

No image registry is reachable from the machines the tests run on, so the image cannot be built
here; what can be held is the Dockerfile itself: a multi-stage build from a base pinned by
digest, a non-root final stage, every application package copied (the ones pyproject.toml
ships, so a new package cannot be forgotten) and the test harness not, and the lock file and
its SBOM in the final image. `make image-lint` runs hadolint on the same file.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
HARNESS = {"localcluster", "kits", "tests", "bench", "tools"}
# Build steps run from a checkout (`make chart`): neither in the image nor in its build context.
BUILD_STEPS = {"chart_tools"}


def instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    out: list[tuple[str, str]] = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for word, rest in instructions():
        if word == "FROM":
            result.append([])
        if result:
            result[-1].append((word, rest))
    return result


def base_default() -> str:
    for word, rest in instructions():
        if word == "ARG" and rest.startswith("PYTHON_BASE="):
            return rest.split("=", 1)[1]
    raise AssertionError("no PYTHON_BASE argument")


def test_every_stage_starts_from_the_base_pinned_by_digest() -> None:
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base_default())
    froms = [rest.split()[0] for word, rest in instructions() if word == "FROM"]
    assert len(froms) >= 2
    assert set(froms) == {"${PYTHON_BASE}"}


def test_the_final_stage_runs_as_a_non_root_user() -> None:
    users = [rest for word, rest in stages()[-1] if word == "USER"]
    assert users
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_the_application_packages_and_nothing_of_the_harness_are_copied() -> None:
    shipped = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    copied = {
        rest.split()[0]
        for stage in stages()
        for word, rest in stage
        if word == "COPY" and not rest.startswith("--from")
    }
    assert shipped - HARNESS - BUILD_STEPS <= copied
    assert not copied & (HARNESS | BUILD_STEPS)
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert ignored >= HARNESS | BUILD_STEPS


def test_the_final_image_holds_the_lock_file_and_its_sbom() -> None:
    build = " ".join(rest for word, rest in stages()[0] if word == "RUN")
    assert "uv sync --frozen" in build
    assert "cp uv.lock /opt/tmi/share/tmi/uv.lock" in build
    assert "--format cyclonedx1.5" in build and "/opt/tmi/share/tmi/sbom.cdx.json" in build
    final = stages()[-1]
    assert ("COPY", "--from=build /opt/tmi /opt/tmi") in final


def test_the_build_stage_installs_the_plain_source_as_one_wheel() -> None:
    build = stages()[0]
    runs = " ".join(rest for word, rest in build if word == "RUN")
    # What ships is the source the tests ran: no compiler, no build-only environment.
    assert "uv build --wheel -o /wheels" in runs
    assert "uv pip install --no-deps --python /opt/tmi/bin/python /wheels/tmi-*.whl" in runs
    assert "--extra dev" not in runs
    assert "gcc" not in runs and "TMI_COMPILE" not in runs
