"""`tmi ping`: does a tmi server answer, over its real TLS, as its callers reach it.

The chart's `helm test` Pods run it against the webhook's plan API and the extender, trusting
the CA in their certificate Secrets: a server that is up but unreachable through its Service,
or whose certificate its callers would refuse, fails here as it would fail them. An answer is
any JSON (or `ok`) below 500: a plan refused with 422 is the webhook answering.
"""

from __future__ import annotations

import argparse
import ssl
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import orjson

from tmi_cli.output import emit
from tmi_cli.policy_args import EXIT_FAILED, EXIT_OK, CommandError

Subparsers = Any


def _context(ca_file: str | None, server_name: str | None) -> ssl.SSLContext:
    """A client context that checks the server's certificate against the CA, and against
    `server_name` when given (the URL then names an address, as without cluster DNS)."""
    kind: type[ssl.SSLContext] = ssl.SSLContext
    if server_name:

        class Pinned(ssl.SSLContext):
            def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
                kwargs["server_hostname"] = server_name
                return super().wrap_socket(*args, **kwargs)

        kind = Pinned
    context = kind(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        if ca_file:
            context.load_verify_locations(cafile=ca_file)
        else:
            context.load_default_certs()
    except (OSError, ssl.SSLError) as exc:
        raise CommandError(f"--ca-file {ca_file}: {exc}") from None
    return context


def cmd_ping(args: argparse.Namespace) -> int:
    url = args.url
    if urlsplit(url).scheme != "https":
        raise CommandError(f"{url} is not an https URL")
    body = args.json.encode() if args.json is not None else None
    # https only (checked above), so no file: or custom scheme reaches urllib.
    request = urllib.request.Request(  # noqa: S310
        url,
        data=body,
        method="POST" if body is not None else "GET",
        headers={"Content-Type": "application/json"} if body is not None else {},
    )
    context = _context(args.ca_file, args.server_name)
    try:
        with urllib.request.urlopen(  # noqa: S310
            request, timeout=args.timeout, context=context
        ) as answer:
            status, text = answer.status, answer.read(1 << 20)
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read(1 << 20)
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        emit({"url": url, "answered": False, "error": str(reason)}, args)
        return EXIT_FAILED
    try:
        parsed: Any = orjson.loads(text)
    except orjson.JSONDecodeError:
        parsed = text.decode(errors="replace").strip()
    answered = status < 500 and (isinstance(parsed, dict | list) or parsed == "ok")
    emit({"url": url, "answered": answered, "status": status, "body": parsed}, args)
    return EXIT_OK if answered else EXIT_FAILED


def add_ping_parser(sub: Subparsers) -> None:
    p = sub.add_parser("ping", help="check that a tmi server answers over its TLS")
    p.add_argument("url", help="https://HOST:PORT/PATH of the server")
    p.add_argument("--ca-file", metavar="FILE", help="the CA its certificate is checked against")
    p.add_argument(
        "--server-name",
        metavar="NAME",
        help="check the certificate against NAME (the URL names an address)",
    )
    p.add_argument("--json", metavar="BODY", help="POST this JSON body (else GET)")
    p.add_argument(
        "--timeout", type=float, default=10.0, metavar="SECONDS", help="give up after (10)"
    )
    p.set_defaults(func=cmd_ping)


__all__ = ["add_ping_parser"]
