#!/usr/bin/env python3
"""Write a development CA and a webhook serving certificate (`make certs`).

For running `python -m webhook` on a workstation or against the local control plane, where
cert-manager is not there to issue one. The CA is kept when it already exists, so running the
script again re-issues only the serving certificate: that is a certificate rotation, which the
running webhook picks up without a restart. Everything written here is ignored by git.

    certs/make-dev-certs.py [DIR]           # DIR/ca.crt, ca.key, tls.crt, tls.key (DIR: certs/)
    certs/make-dev-certs.py --new-ca        # start over with a new CA as well
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import ipaddress
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HERE = Path(__file__).resolve().parent


def _write(path: Path, data: bytes, private: bool = False) -> None:
    # Write then rename, so a running webhook never reads half a file.
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tmi development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def make_ca(out: Path, now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("tmi development CA"))
        .issuer_name(_name("tmi development CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(out / "ca.key", _key_pem(key), private=True)
    _write(out / "ca.crt", cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def load_ca(out: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise SystemExit(f"error: {out / 'ca.key'} is not an EC key; rerun with --new-ca")
    return cert, key


def make_serving(
    out: Path,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    hosts: list[str],
    days: int,
    now: dt.datetime,
) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    # Key first, then certificate: the webhook keeps the old pair until both match.
    _write(out / "tls.key", _key_pem(key), private=True)
    _write(
        out / "tls.crt",
        cert.public_bytes(serialization.Encoding.PEM)
        + ca_cert.public_bytes(serialization.Encoding.PEM),
    )
    return cert


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "out", nargs="?", type=Path, default=HERE, help="output directory (default: certs/)"
    )
    parser.add_argument("--service", default="tmi-webhook", help="Service name")
    parser.add_argument("--namespace", default="kamiwaza", help="the webhook's namespace")
    parser.add_argument("--host", action="append", default=[], help="extra DNS name or IP")
    parser.add_argument("--days", type=int, default=30, help="serving certificate lifetime")
    parser.add_argument("--new-ca", action="store_true", help="replace an existing CA")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    if args.new_ca or not (out / "ca.crt").exists() or not (out / "ca.key").exists():
        ca_cert, ca_key = make_ca(out, now)
        made = "new CA"
    else:
        ca_cert, ca_key = load_ca(out)
        made = "existing CA"
    service, namespace = args.service, args.namespace
    hosts = [
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        f"{service}.{namespace}",
        service,
        "localhost",
        "127.0.0.1",
        "::1",
        *args.host,
    ]
    cert = make_serving(out, ca_cert, ca_key, hosts, args.days, now)
    ca_b64 = base64.b64encode(ca_cert.public_bytes(serialization.Encoding.PEM)).decode()
    sys.stdout.write(
        f"wrote {out}/tls.crt and tls.key (serial {cert.serial_number:x}, {made} {out}/ca.crt)\n"
        f"caBundle for the MutatingWebhookConfiguration:\n{ca_b64}\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
