"""An MCP server that authorises every request by its caller's key, built on
the official Python SDK (`mcp` 2.x, pinned in tests/python-mcp/requirements.txt)
and its own bearer-token support (`AuthSettings` + a `TokenVerifier`, the
SDK's `BearerAuthBackend` / `RequireAuthMiddleware`), for the per-user
credential tests in tests/all/per_user.rs.

`--keys FILE`: a JSON object of key -> subject, read again on every request
(so a test revokes a key by rewriting the file). A request without a valid
`Authorization: Bearer <key>` gets 401 from the SDK. Each subject sees its
own notes (`notes://<subject>/todo`, `notes://<subject>/plan`) and one
shared (`notes://shared/handbook`); reading another subject's note is
"not found"; reads say `ttlMs` 60 s, `cacheScope: private`. `--log FILE` gets one line per HTTP request: `auth <subject>`
(or `auth -` for a refused key), and one per read: `read <subject> <uri>`.
Streamable HTTP on 127.0.0.1, a free port written to `--port-file`.
"""

import argparse
import json
import os
import socket

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.shared.exceptions import MCPError

parser = argparse.ArgumentParser()
parser.add_argument("--keys", required=True)
parser.add_argument("--log", required=True)
parser.add_argument("--port-file", required=True)
args = parser.parse_args()


def log(line: str) -> None:
    with open(args.log, "a") as f:
        f.write(line + "\n")


class KeyFile:
    """The SDK's `TokenVerifier` protocol over the keys file."""

    async def verify_token(self, token: str):
        try:
            with open(args.keys) as f:
                keys = json.load(f)
        except (OSError, ValueError):
            keys = {}
        subject = keys.get(token)
        log(f"auth {subject or '-'}")
        if subject is None:
            return None
        return AccessToken(token=token, client_id="mcp-context", scopes=[], subject=subject)


def subject_of(ctx) -> str:
    user = ctx.request.user
    return user.access_token.subject


def notes(subject: str) -> list:
    return [
        types.Resource(uri=f"notes://{subject}/todo", name=f"{subject}'s todo", mime_type="text/plain"),
        types.Resource(uri=f"notes://{subject}/plan", name=f"{subject}'s plan", mime_type="text/plain"),
        types.Resource(uri="notes://shared/handbook", name="handbook", mime_type="text/plain"),
    ]


async def list_resources(ctx, params):
    return types.ListResourcesResult(resources=notes(subject_of(ctx)))


async def list_templates(ctx, params):
    # Each subject's own day notes, read by expanding the template (never listed).
    subject = subject_of(ctx)
    day = types.ResourceTemplate(uri_template=f"notes://{subject}/day/{{date}}", name="day", mime_type="text/plain")
    return types.ListResourceTemplatesResult(resource_templates=[day])


async def read_resource(ctx, params):
    subject = subject_of(ctx)
    uri = str(params.uri)
    log(f"read {subject} {uri}")
    if uri == "notes://shared/handbook":
        text = "The handbook everybody reads."
    elif uri in (f"notes://{subject}/todo", f"notes://{subject}/plan"):
        text = f"{subject}'s own {uri.rsplit('/', 1)[1]}: for {subject} only."
    elif uri.startswith(f"notes://{subject}/day/"):
        text = f"{subject}'s day {uri.rsplit('/', 1)[1]}: for {subject} only."
    else:
        modern = str(getattr(ctx, "protocol_version", "")) >= "2026-07-28"
        raise MCPError(code=-32602 if modern else -32002, message=f"no such resource {uri}", data={"uri": uri})
    # A minute, private to the caller (the hints a per-user server would give).
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=text)],
        ttl_ms=60_000,
        cache_scope="private",
    )


server = Server(
    "per-user-notes",
    version="0.1.0",
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
)


async def main() -> None:
    import uvicorn

    # IPPROTO_TCP named, so accepted sockets get TCP_NODELAY from asyncio (it sets it only when the
    # protocol is named): without it each response's second segment waits for a delayed ACK (~40 ms)
    # on any reused keep-alive connection.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    app = server.streamable_http_app(
        host="127.0.0.1",
        auth=AuthSettings(
            issuer_url="http://127.0.0.1:9",
            resource_server_url=f"http://127.0.0.1:{port}/mcp",
            # API keys name no audience: the key file is the whole check.
            validate_token_resource=False,
        ),
        token_verifier=KeyFile(),
    )
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(args.port_file + ".tmp", args.port_file)
    await uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[sock])


anyio.run(main)
