"""`make demo`: the owner's workflow through the `tmi` CLI, then the local control plane.

The first half runs the owner tool as an owner would (a new key, the example envelope filled in
and signed, verified, and the example deployments planned) and prints the decisions as a table.
The second half starts the real control plane with fake GPU nodes and shows the pod guard.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from localcluster import demo_guard

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NOW = "2026-11-29T12:00:00Z"
TMI = [sys.executable, "-m", "tmi_cli"]


def _tmi(*args: str, check: bool = True) -> tuple[int, Any]:
    result = subprocess.run([*TMI, *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise SystemExit(f"tmi {args[0]} failed: {result.stderr.strip()}")
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else None


def _catalog_image(engine: str, vendor: str, cuda: str) -> str:
    rows = subprocess.run([*TMI, "catalog"], capture_output=True, text=True, check=True).stdout
    for line in rows.splitlines():
        cells = line.split("\t")
        if cells[:4] == [engine, vendor, "amd64", cuda]:
            return cells[4]
    raise SystemExit(f"catalog has no {engine} {vendor} image")


def _short(image: str | None) -> str:
    if not image:
        return "-"
    repo, _, digest = image.partition("@")
    return f"{repo.rsplit('/', 1)[-1]}@{digest[7:19]}"


def owner_workflow(work: Path) -> None:
    print("== the owner: key, envelope, signature, verification", flush=True)
    key = work / "owner-ed25519-private.pem"
    _, identity = _tmi("keygen", "--private-key-out", str(key))
    print(f"keyId {identity['keyId']}")
    template = (EXAMPLES / "profile-envelope.template.json").read_text()
    envelope = (
        template.replace("<KEY_ID>", identity["keyId"])
        .replace("<LLAMACPP_CPU_IMAGE>", _catalog_image("llamacpp", "cpu", "-"))
        .replace("<LLAMACPP_CUDA_IMAGE>", _catalog_image("llamacpp", "nvidia", "13"))
    )
    (work / "envelope.json").write_text(envelope)
    _, configmap = _tmi(
        "sign", "--envelope", str(work / "envelope.json"), "--private-key", str(key), "--now", NOW
    )
    bundle = work / "profile-configmap.json"
    bundle.write_text(json.dumps(configmap))
    print(
        f"signed ConfigMap {configmap['metadata']['name']}, immutable, "
        f"bundle.sha256 {configmap['data']['bundle.sha256'][:16]}..."
    )
    common = [
        "--owner-public-key",
        identity["publicKey"],
        "--cluster-binding-id",
        "demo-cluster",
        "--namespace",
        "kamiwaza",
        "--now",
        NOW,
    ]
    _, summary = _tmi("verify", "--bundle", str(bundle), *common)
    print(
        f"verified: version {summary['version']}, profiles "
        f"{', '.join(p['name'] for p in summary['profiles'])}"
    )

    print("\n== deployments planned by `tmi plan` (the webhook decides the same way)", flush=True)
    rows = [("request", "status", "path", "binding", "image", "grant / reason")]
    for path in sorted(EXAMPLES.glob("request-*.json")):
        _, body = _tmi(
            "plan", "--bundle", str(bundle), "--request", str(path), *common, check=False
        )
        if body["status"] == 200:
            grant = body.get("resources", {}).get("limits") or body.get("resources", {}).get(
                "requests", {}
            )
            rows.append(
                (
                    path.stem[8:],
                    "200",
                    body["path"],
                    body.get("bindingId") or "-",
                    _short(body.get("image")),
                    ",".join(f"{k}={v}" for k, v in grant.items()) or "-",
                )
            )
        else:
            rows.append((path.stem[8:], str(body["status"]), "-", "-", "-", body["detail"]))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])) + "  " + row[5])


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tmi-demo-") as tmp:
        owner_workflow(Path(tmp))
    return demo_guard.main()


if __name__ == "__main__":
    sys.exit(main())
