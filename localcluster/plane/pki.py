"""A throw-away certificate authority for the local control plane.

One CA signs the API server's serving certificate, every component's client
certificate (the certificate's CN is the Kubernetes user, its O entries the groups, so
each component is a distinct RBAC subject), and the serving certificates of webhooks
and extenders under test, so a single ``caBundle`` works everywhere. Keys are ECDSA
P-256: fast to generate, and accepted by Go and OpenSSL alike.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)
# Clocks of child processes and this one agree, but a small backdate avoids
# "certificate not yet valid" when a cert is used within the same second.
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class KeyPair:
    cert_file: Path
    key_file: Path

    def cert_pem(self) -> bytes:
        return self.cert_file.read_bytes()


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


class CertificateAuthority:
    """Issues serving and client certificates into a directory."""

    def __init__(self, directory: Path, common_name: str = "tmi-localcluster-ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        self._name = name
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_file = directory / "ca.crt"
        self.cert_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._key, directory / "ca.key")

    def cert_pem(self) -> bytes:
        return self.cert_file.read_bytes()

    def _issue(
        self,
        stem: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        hosts: Sequence[str] = (),
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if hosts:
            builder = builder.add_extension(_san(hosts), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        pair.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key_file)
        return pair

    def issue_serving(
        self, stem: str, hosts: Sequence[str] = ("127.0.0.1", "localhost")
    ) -> KeyPair:
        """A TLS server certificate for ``hosts`` (IPs and DNS names)."""
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else stem)])
        return self._issue(stem, subject, ExtendedKeyUsageOID.SERVER_AUTH, hosts)

    def issue_client(self, stem: str, user: str, groups: Sequence[str] = ()) -> KeyPair:
        """A client certificate the API server maps to ``user`` in ``groups``."""
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        return self._issue(stem, x509.Name(attrs), ExtendedKeyUsageOID.CLIENT_AUTH)


def write_service_account_key(private_path: Path, public_path: Path) -> KeyPair:
    """The key pair the API server signs and verifies service-account tokens with.

    The public half goes in its own file because --service-account-key-file does not
    read PKCS#8 private keys ("data does not contain any valid RSA or ECDSA public
    keys"). Returned as KeyPair(cert_file=public key, key_file=private key).
    """
    key = ec.generate_private_key(ec.SECP256R1())
    _write_key(key, private_path)
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return KeyPair(public_path, private_path)
