"""The serving certificate, reloaded when its files change, without a restart or a dropped request.

cert-manager renews the serving certificate in place: the kubelet swaps the Secret volume's files
atomically and nothing restarts the process, and the callers (the API server for the webhook,
kube-scheduler for the extender) keep trusting the same CA. The listening socket keeps one
`SSLContext` for its whole life; its `sni_callback` runs at the start of every handshake (with or
without SNI) and moves the new connection onto the newest context. A connection already
established keeps the certificate it was made with, and a new one gets the new certificate.

A new context is built whole, and only swapped in once it loaded without error, so a half-written
file (key of the new pair, certificate of the old) keeps the previous pair in service and is
tried again at the next check, instead of leaving a context that fails every handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

from cryptography import x509

log = logging.getLogger(__name__)


class CertificateError(ValueError):
    """The certificate or key files cannot be loaded; the message says which and why."""


def build_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise CertificateError(f"cannot load {cert_file} with {key_file}: {exc}") from None
    return context


class CertificateReloader:
    """Owns the listening context and swaps the certificate behind it when the files change."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        on_reload: Callable[[str], None] | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.on_reload = on_reload or (lambda result: None)
        fingerprint, cert_pem = self._read()
        self.context = build_context(cert_file, key_file)
        self.context.sni_callback = self._select
        self._current = self.context
        self._fingerprint = fingerprint
        self.serial, self.not_after = _describe(cert_pem)
        self.reloads = 0

    @property
    def current(self) -> ssl.SSLContext:
        return self._current

    def _select(
        self, ssl_object: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        current = self._current
        if ssl_object.context is not current:
            ssl_object.context = current

    def _read(self) -> tuple[str, bytes]:
        try:
            cert = Path(self.cert_file).read_bytes()
            key = Path(self.key_file).read_bytes()
        except OSError as exc:
            raise CertificateError(f"cannot read the certificate or key: {exc}") from None
        return hashlib.sha256(cert + b"\0" + key).hexdigest(), cert

    def reload(self) -> bool:
        """Load the files again if they changed; True when a new certificate is now served."""
        try:
            fingerprint, cert_pem = self._read()
            if fingerprint == self._fingerprint:
                return False
            context = build_context(self.cert_file, self.key_file)
            # The context is loaded from the paths, which may have been replaced since they
            # were read: keep it only if the files are still the ones fingerprinted, else the
            # serial and fingerprint recorded here would describe another pair. The next
            # check picks up the newer files.
            if self._read()[0] != fingerprint:
                return False
            serial, not_after = _describe(cert_pem)
        except (CertificateError, ValueError) as exc:
            log.warning("serving certificate not reloaded, keeping the current one: %s", exc)
            self.on_reload("failed")
            return False
        self._current = context
        self._fingerprint = fingerprint
        self.serial, self.not_after = serial, not_after
        self.reloads += 1
        log.info("serving certificate reloaded: serial %x, valid until %s", serial, not_after)
        self.on_reload("loaded")
        return True

    async def watch(self, interval: float) -> None:
        """Check the files every `interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            await asyncio.to_thread(self.reload)


@contextlib.asynccontextmanager
async def reloading(reloader: CertificateReloader | None, interval: float) -> AsyncIterator[None]:
    """Look for a new certificate every `interval` seconds while inside; without a reloader
    (plain HTTP) or with an interval of 0, never."""
    task: asyncio.Task[None] | None = None
    if reloader is not None and interval > 0:
        task = asyncio.create_task(reloader.watch(interval))
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _describe(cert_pem: bytes) -> tuple[int, datetime]:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CertificateError(f"the certificate is not PEM: {exc}") from None
    return cert.serial_number, cert.not_valid_after_utc
