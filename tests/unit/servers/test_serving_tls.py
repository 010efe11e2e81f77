"""Certificate reload: what is recorded always describes the pair that is served."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509

from serving import tls


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _issue(ca: trustme.CA, cert: Path, key: Path) -> int:
    leaf = ca.issue_cert("127.0.0.1")
    _write(key, leaf.private_key_pem.bytes())
    _write(cert, b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    return x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number


def test_files_replaced_during_a_reload_are_taken_on_the_next_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = trustme.CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first = _issue(ca, cert, key)
    reloader = tls.CertificateReloader(str(cert), str(key))
    results: list[str] = []
    reloader.on_reload = results.append
    second = _issue(ca, cert, key)
    real_build = tls.build_context
    third: list[int] = []

    def build_while_replaced(cert_file: str, key_file: str) -> Any:
        # The pair is replaced after it was read and before it is loaded.
        if not third:
            third.append(_issue(ca, cert, key))
        return real_build(cert_file, key_file)

    monkeypatch.setattr(tls, "build_context", build_while_replaced)
    assert reloader.reload() is False
    assert reloader.serial == first
    assert results == []
    assert reloader.reload() is True
    assert reloader.serial == third[0] != second
    assert results == ["loaded"]
    assert reloader.reload() is False
    assert results == ["loaded"]
