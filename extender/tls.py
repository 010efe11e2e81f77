"""The extender's serving certificate, reloaded when its files change, without a restart.

cert-manager renews the certificate in place (the kubelet swaps the Secret volume's files), and
kube-scheduler keeps connecting with the CA in its `tlsConfig.caData`. The listening context's
`sni_callback` moves every new handshake onto the newest context; a new context is only swapped
in once it loaded whole, so a half-written pair keeps the previous one in service.

This is the webhook's mechanism (`webhook.tlsreload`) in small: the servers may not import one
another, and the extender needs neither its metrics hooks nor its certificate description.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from pathlib import Path

log = logging.getLogger(__name__)


class CertificateError(ValueError):
    """The certificate or key files cannot be loaded; the message says which and why."""


def _context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise CertificateError(f"cannot load {cert_file} with {key_file}: {exc}") from None
    return context


class CertificateReloader:
    """Owns the listening context and swaps the certificate behind it when the files change."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._fingerprint = self._read()
        self.context = _context(cert_file, key_file)
        self.context.sni_callback = self._select
        self._current = self.context
        self.reloads = 0

    def _select(
        self, ssl_object: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        if ssl_object.context is not self._current:
            ssl_object.context = self._current

    def _read(self) -> str:
        try:
            data = Path(self.cert_file).read_bytes() + b"\0" + Path(self.key_file).read_bytes()
        except OSError as exc:
            raise CertificateError(f"cannot read the certificate or key: {exc}") from None
        return hashlib.sha256(data).hexdigest()

    def reload(self) -> bool:
        """Load the files again if they changed; True when a new certificate is now served."""
        try:
            fingerprint = self._read()
            if fingerprint == self._fingerprint:
                return False
            context = _context(self.cert_file, self.key_file)
        except CertificateError as exc:
            log.warning("serving certificate not reloaded, keeping the current one: %s", exc)
            return False
        self._current = context
        self._fingerprint = fingerprint
        self.reloads += 1
        log.info("serving certificate reloaded")
        return True

    async def watch(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await asyncio.to_thread(self.reload)
