"""Which credentials a `tmi` command talks to the API server with, in kubectl's order, so that an
owner's `tmi doctor` reaches the cluster their `kubectl` does: `--kubeconfig`, else the first
file of `$KUBECONFIG` that exists (kubectl merges them; one is read here), else
`~/.kube/config`, else the in-cluster service account (a Job or a helm hook's Pod). The servers
take only `--kubeconfig` or in-cluster (`serving.kube`)."""

from __future__ import annotations

import os
from pathlib import Path


def kubeconfig_for(given: str | None) -> str | None:
    """The kubeconfig file to load, or None for the in-cluster service account."""
    if given:
        return given
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        # kubectl skips the files of the list that do not exist (it merges the rest; the
        # first is taken here); when none does, the first is named in the error.
        return next((p for p in listed if Path(p).is_file()), listed[0])
    home = Path.home() / ".kube" / "config"
    return str(home) if home.is_file() else None


__all__ = ["kubeconfig_for"]
