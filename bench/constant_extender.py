"""A scheduler extender that answers at once, for the scheduling benchmark's floor.

Configured exactly as `tmi-extender` is (the rendered KubeSchedulerConfiguration's filter and
prioritize verbs, `nodeCacheCapable`, its own process on uvloop, plain HTTP on loopback or HTTPS
with `--cert`/`--key` as the chart serves `tmi`'s), it passes every node the scheduler offers
and scores none. It separates what consulting *any* extender costs a Pod (two HTTP calls a
cycle, the scheduler encoding the Pod and the node names for each and decoding the answers) from
what *this* extender's decisions cost.

    python bench/constant_extender.py --port P [--cert C --key K]
"""

from __future__ import annotations

import argparse
import ssl

import orjson
import uvloop
from aiohttp import web


def make_app() -> web.Application:
    async def filter_handler(request: web.Request) -> web.Response:
        args = orjson.loads(await request.read())
        result: dict[str, object] = {
            "NodeNames": args.get("NodeNames") or [],
            "FailedNodes": {},
            "Error": "",
        }
        return web.Response(body=orjson.dumps(result), content_type="application/json")

    async def prioritize_handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"[]", content_type="application/json")

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/filter", filter_handler)
    app.router.add_post("/prioritize", prioritize_handler)
    app.router.add_get("/readyz", ready)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", default=None)
    parser.add_argument("--key", default=None)
    args = parser.parse_args()
    context = None
    if args.cert and args.key:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.cert, args.key)
    uvloop.install()
    web.run_app(
        make_app(),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        ssl_context=context,
    )


if __name__ == "__main__":
    main()
