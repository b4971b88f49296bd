"""An MCP server that authorises every request with a JWT bearer token, on
the official Python SDK (`mcp` 2.x, pinned in requirements.txt) and its own
auth support, for tests/all/oauth.rs (issue 35: per-user upstream
credentials).

It is an OAuth protected resource: the SDK publishes its protected resource
metadata (RFC 9728) at `/.well-known/oauth-protected-resource/mcp`, naming
`--issuer` as its authorization server, and answers a request without a
valid token `401` with `WWW-Authenticate: Bearer resource_metadata=...`.
A token is valid when it is an RS256 JWT signed by a key of `--jwks`, issued
by `--issuer`, unexpired, and whose `aud` is this server's URL
(`http://127.0.0.1:PORT/mcp`). Each subject sees its own resources:
`drive://<sub>/notes` and `drive://<sub>/plan` plus `drive://shared/handbook`.

Every token presented is logged to `--record`, one JSON object a line:
`{"sub": ..., "aud": ..., "ok": true}` or `{"ok": false, "why": ...}` (never
the token itself), so a test can tell whose token reached this server and
that no token for another audience did.

`--deny FILE` lists subjects whose (otherwise valid) tokens are refused.

Usage: bearer.py --jwks URL --issuer URL --record FILE --port-file FILE [--deny FILE]
"""

import argparse
import json
import os
import socket

import anyio
import jwt
import mcp_types as types
import uvicorn
from mcp.server import Server
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.shared.exceptions import MCPError

parser = argparse.ArgumentParser()
parser.add_argument("--jwks", required=True)
parser.add_argument("--issuer", required=True)
parser.add_argument("--record", required=True)
parser.add_argument("--port-file", required=True)
# Subjects whose tokens are refused (one per line, read on every request), as a
# server that revoked a user's access would.
parser.add_argument("--deny")
args = parser.parse_args()

# IPPROTO_TCP named, so accepted sockets get TCP_NODELAY from asyncio (it sets it only when the
# protocol is named): without it each response's second segment waits for a delayed ACK (~40 ms)
# on any reused keep-alive connection.
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.bind(("127.0.0.1", 0))
sock.listen(64)
PORT = sock.getsockname()[1]
RESOURCE = f"http://127.0.0.1:{PORT}/mcp"
jwks = jwt.PyJWKClient(args.jwks)


def record(entry: dict) -> None:
    with open(args.record, "a") as f:
        f.write(json.dumps(entry) + "\n")


class JwtVerifier:
    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            key = jwks.get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key.key, algorithms=["RS256"], audience=RESOURCE, issuer=args.issuer)
        except Exception as e:  # every refusal is logged, with its reason only
            try:
                aud = jwt.decode(token, options={"verify_signature": False}).get("aud")
            except Exception:
                aud = None
            record({"ok": False, "why": type(e).__name__, "aud": aud})
            return None
        if claims["sub"] in denied():
            record({"ok": False, "why": "denied", "sub": claims["sub"], "aud": claims["aud"]})
            return None
        record({"ok": True, "sub": claims["sub"], "aud": claims["aud"]})
        return AccessToken(
            token=token,
            client_id=claims.get("client_id", ""),
            scopes=str(claims.get("scope", "")).split(),
            expires_at=claims.get("exp"),
            resource=RESOURCE,
            subject=claims["sub"],
        )


def denied() -> list:
    try:
        with open(args.deny) as f:
            return f.read().split()
    except (OSError, TypeError):
        return []


def subject() -> str:
    token = get_access_token()
    return token.subject if token and token.subject else ""


def names(sub: str) -> list:
    return [f"drive://{sub}/notes", f"drive://{sub}/plan", "drive://shared/handbook"]


async def list_resources(ctx, params):
    items = [types.Resource(uri=u, name=u.split("//")[1], mime_type="text/plain") for u in names(subject())]
    return types.ListResourcesResult(resources=items)


async def list_templates(ctx, params):
    return types.ListResourceTemplatesResult(resource_templates=[])


async def read_resource(ctx, params):
    uri = str(params.uri)
    sub = subject()
    if uri not in names(sub):
        raise MCPError(code=-32002, message=f"no such resource {uri}", data={"uri": uri})
    text = "The handbook, for everyone." if uri.endswith("handbook") else f"{uri.split('/')[-1]} of {sub}."
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=text)],
        ttl_ms=0,
        cache_scope="private",
    )


server = Server(
    "bearer-fixture",
    version="0.1.0",
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
)


async def main() -> None:
    app = server.streamable_http_app(
        host="127.0.0.1",
        auth=AuthSettings(
            issuer_url=args.issuer,
            resource_server_url=RESOURCE,
            required_scopes=["mcp"],
            validate_token_resource=True,
        ),
        token_verifier=JwtVerifier(),
    )
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(PORT))
    os.replace(args.port_file + ".tmp", args.port_file)
    await uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[sock])


anyio.run(main)
