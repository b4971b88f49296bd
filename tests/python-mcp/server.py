"""A stdio MCP server built on the official Python SDK (`mcp` 2.x, pinned in
requirements.txt), for the interop tests in tests/all/sdk.rs.

It serves the same shapes as the Rust fixture: `fx://doc/N` (text, listed
over pages), `fx://live` (the text of the `--live` file; a change is pushed
as `notifications/resources/updated`), `fx://blob` (a PNG blob). The SDK
answers every revision from the same server: 2026-07-28 (`server/discover`,
`subscriptions/listen`) and 2025-11-25 (`initialize`, `resources/subscribe`).
Every read is logged to `--record` (one URI a line), so a test can tell that
no read was sent. Cache hints: `--read-ttl-ms N` (public), `--private`
(60 s, private), else one hour, public. Not found is `-32602` to a
2026-07-28 client and `-32002` to older ones, as the spec says.
"""

import argparse
import contextlib

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError

parser = argparse.ArgumentParser()
parser.add_argument("--n", type=int, default=3)
parser.add_argument("--page-size", type=int, default=2)
parser.add_argument("--record")
parser.add_argument("--live")
parser.add_argument("--read-ttl-ms", type=int)
parser.add_argument("--private", action="store_true")
# The legacy HTTP+SSE transport (2024-11-05) instead of stdio: serve
# `GET /sse` and `POST /messages/` on 127.0.0.1, a free port written to
# this file once listening.
parser.add_argument("--sse-port-file")
# Streamable HTTP (`/mcp`, the SDK's own app) on 127.0.0.1, a free port
# written to this file: the same server, to compare transports.
parser.add_argument("--http-port-file")
# One more resource, `fx://big`, of this many bytes of text (large SSE events).
parser.add_argument("--big", type=int, default=0)
args = parser.parse_args()

bus = InMemorySubscriptionBus()
# (uri, session) of legacy `resources/subscribe` requests.
legacy_subscriptions: list = []


def log(line: str) -> None:
    if args.record:
        with open(args.record, "a") as f:
            f.write(line + "\n")


def live_text() -> str:
    try:
        with open(args.live) as f:
            return f.read()
    except (OSError, TypeError):
        return ""


def listing() -> list:
    items = [types.Resource(uri=f"fx://doc/{i}", name=f"doc {i}", mime_type="text/plain") for i in range(args.n)]
    if args.live:
        items.append(types.Resource(uri="fx://live", name="live", mime_type="text/plain"))
    items.append(types.Resource(uri="fx://blob", name="blob", mime_type="image/png"))
    if args.big:
        items.append(types.Resource(uri="fx://big", name="big", mime_type="text/plain"))
    return items


def big_text() -> str:
    line = "The quick brown fox jumps over the lazy dog 0123456789.\n"
    return (line * (args.big // len(line) + 1))[: args.big]


async def list_resources(ctx, params):
    start = int(params.cursor) if params is not None and params.cursor else 0
    items = listing()
    end = start + args.page_size
    return types.ListResourcesResult(resources=items[start:end], next_cursor=str(end) if end < len(items) else None)


async def list_templates(ctx, params):
    return types.ListResourceTemplatesResult(resource_templates=[])


async def read_resource(ctx, params):
    uri = str(params.uri)
    log(uri)
    if uri.startswith("fx://doc/") and uri[len("fx://doc/") :].isdigit() and int(uri[len("fx://doc/") :]) < args.n:
        contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text=f"Document {uri[9:]}. ")]
    elif uri == "fx://live" and args.live:
        contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text=live_text())]
    elif uri == "fx://big" and args.big:
        contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text=big_text())]
    elif uri == "fx://blob":
        contents = [types.BlobResourceContents(uri=uri, mime_type="image/png", blob="iVBORw0KGgo=")]
    else:
        modern = str(getattr(ctx, "protocol_version", "")) >= "2026-07-28"
        raise MCPError(code=-32602 if modern else -32002, message=f"no such resource {uri}", data={"uri": uri})
    if args.private:
        hints = {"ttl_ms": 60_000, "cache_scope": "private"}
    elif args.read_ttl_ms is not None:
        hints = {"ttl_ms": args.read_ttl_ms, "cache_scope": "public"}
    else:
        hints = {"ttl_ms": 3_600_000, "cache_scope": "public"}
    return types.ReadResourceResult(contents=contents, **hints)


async def subscribe(ctx, params):
    log(f"subscribe {params.uri}")
    legacy_subscriptions.append((str(params.uri), ctx.session))
    return types.EmptyResult()


async def unsubscribe(ctx, params):
    return types.EmptyResult()


async def watch() -> None:
    """Polls the live file and pushes a change on both revisions' paths."""
    last = live_text()
    while True:
        await anyio.sleep(0.02)
        now = live_text()
        if now != last:
            last = now
            for uri, session in list(legacy_subscriptions):
                if uri == "fx://live":
                    with contextlib.suppress(Exception):
                        await session.send_resource_updated(uri)
            await bus.publish(ResourceUpdated(uri="fx://live"))


@contextlib.asynccontextmanager
async def lifespan(server):
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        yield {}
        tg.cancel_scope.cancel()


server = Server(
    "python-sdk-fixture",
    version="0.1.0",
    lifespan=lifespan,
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
    on_subscriptions_listen=ListenHandler(bus),
)


async def main() -> None:
    async with stdio_server() as (read_stream, write_stream):
        options = server.create_initialization_options(NotificationOptions(resources_changed=True))
        await server.run(read_stream, write_stream, options)


async def main_sse() -> None:
    from mcp.server.sse import SseServerTransport
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Mount, Route

    sse = SseServerTransport("/messages/")

    async def handle_sse(request):
        async with sse.connect_sse(request.scope, request.receive, request._send) as (read_stream, write_stream):
            options = server.create_initialization_options(NotificationOptions(resources_changed=True))
            await server.run(read_stream, write_stream, options)
        return Response()

    app = Starlette(
        routes=[Route("/sse", endpoint=handle_sse, methods=["GET"]), Mount("/messages/", app=sse.handle_post_message)]
    )
    await serve_on_free_port(app, args.sse_port_file)


async def serve_on_free_port(app, port_file: str) -> None:
    import os
    import socket

    import uvicorn

    # IPPROTO_TCP named, so accepted sockets get TCP_NODELAY from asyncio (it sets it only when the
    # protocol is named): without it each response's second segment waits for a delayed ACK (~40 ms)
    # on any reused keep-alive connection.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(sock.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    config = uvicorn.Config(app, log_level="warning")
    await uvicorn.Server(config).serve(sockets=[sock])


async def main_http() -> None:
    app = server.streamable_http_app(host="127.0.0.1")
    await serve_on_free_port(app, args.http_port_file)


anyio.run(main_sse if args.sse_port_file else main_http if args.http_port_file else main)
