"""A mutating webhook that answers every review with a prepared answer, for the Pod-create bench.

Registered exactly as `tmi` is (the shipped MutatingWebhookConfiguration, TLS, uvloop, its own
process), it separates what *any* webhook costs a Pod create (the API server's call, TLS, the
patch applied) from what *this* webhook's decisions cost. It reads only the uid (to echo it) and
whether the Pod carries the engine label, and returns `tmi`'s own answer for that kind of Pod,
prepared once by the benchmark, so the API server applies the same patch in both modes.

    python bench/constant_webhook.py --cert C --key K --port P --answers FILE
"""

from __future__ import annotations

import argparse
import base64
import ssl
from pathlib import Path

import orjson
import uvloop
from aiohttp import web

ENGINE_LABEL = b'"kamiwaza.ai/deployment-id"'


def _uid(body: bytes) -> bytes:
    # The API server writes the request's uid first: {"kind":...,"request":{"uid":"...".
    start = body.index(b'"uid":"') + 7
    return body[start : body.index(b'"', start)]


def make_app(answers: dict[str, dict[str, object]]) -> web.Application:
    engine = answers["engine"]
    tenant = answers["tenant"]
    hits = {"count": 0}

    async def mutate(request: web.Request) -> web.Response:
        body = await request.read()
        hits["count"] += 1
        answer = engine if ENGINE_LABEL in body else tenant
        response = dict(answer)
        response["uid"] = _uid(body).decode()
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }
        return web.Response(body=orjson.dumps(review), content_type="application/json")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=f"constant_webhook_reviews_total {hits['count']}\n")

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/readyz", ready)
    return app


def answer_from_patch(ops: list[dict[str, object]]) -> dict[str, object]:
    """The response object for an allowed review with these JSON Patch operations."""
    response: dict[str, object] = {"allowed": True}
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(ops)).decode("ascii")
    return response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--answers", required=True, help="JSON: {engine: answer, tenant: answer}")
    args = parser.parse_args()
    answers = orjson.loads(Path(args.answers).read_bytes())
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    uvloop.install()
    web.run_app(make_app(answers), host="127.0.0.1", port=args.port, ssl_context=context)


if __name__ == "__main__":
    main()
