"""An MCP host on the official Python SDK (`mcp` 2.x, pinned in
requirements.txt): connects to an MCP server over Streamable HTTP with a
bearer token and runs a list of operations, printing one JSON line per
operation, for tests/all/mcp_endpoint.rs (issue 51: `serve` as one MCP server
of each user's resources).

Operations (a JSON list on --ops):
  ["list"]                    every page of resources/list
  ["templates"]               resources/templates/list
  ["read", URI]               resources/read
  ["prompt", QUERY or null]   prompts/get context
  ["subscribe", URI]          resources/subscribe (2025-11-25 sessions)
  ["touch", FILE, TEXT]       write TEXT to FILE (a fixture's live file)
  ["wait", SECONDS]           wait, then print the notifications received so far

Each line is {"op": ..., "ok": true, "result": ...} or
{"op": ..., "ok": false, "code": ..., "message": ..., "data": ...}.

Usage: host.py --url URL [--token TOKEN] [--mode legacy|2026-07-28] --ops JSON
"""

import argparse
import json

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

parser = argparse.ArgumentParser()
parser.add_argument("--url", required=True)
parser.add_argument("--token")
parser.add_argument("--mode", default="legacy")
parser.add_argument("--ops", required=True)
args = parser.parse_args()

notifications = []


async def on_message(message) -> None:
    root = getattr(message, "root", message)
    method = getattr(root, "method", None)
    if method is None:
        return
    params = getattr(root, "params", None)
    uri = getattr(params, "uri", None) if params is not None else None
    notifications.append({"method": method, "uri": None if uri is None else str(uri)})


def dump(x):
    return x.model_dump(mode="json", by_alias=True, exclude_none=True)


async def run(client: Client, op: list):
    kind = op[0]
    if kind == "list":
        items, cursor, pages = [], None, 0
        while True:
            page = await client.list_resources(cursor=cursor)
            pages += 1
            items.extend(dump(r) for r in page.resources)
            cursor = page.next_cursor
            if not cursor:
                return {"resources": items, "pages": pages}
    if kind == "templates":
        return dump(await client.list_resource_templates())
    if kind == "read":
        return dump(await client.read_resource(op[1]))
    if kind == "prompt":
        arguments = {} if op[1] is None else {"query": op[1]}
        return dump(await client.get_prompt("context", arguments))
    if kind == "subscribe":
        return dump(await client.subscribe_resource(op[1]))
    if kind == "touch":
        with open(op[1], "w") as f:
            f.write(op[2])
        return {}
    if kind == "wait":
        await anyio.sleep(op[1])
        return {"notifications": list(notifications)}
    raise ValueError(f"unknown operation {kind}")


async def main() -> None:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    http = create_mcp_http_client(headers=headers)
    transport = streamable_http_client(args.url, http_client=http)
    async with Client(transport, mode=args.mode, cache=None, message_handler=on_message) as client:
        for op in json.loads(args.ops):
            try:
                line = {"op": op[0], "ok": True, "result": await run(client, op)}
            except MCPError as e:
                line = {"op": op[0], "ok": False, "code": e.code, "message": e.message, "data": e.data}
            print(json.dumps(line), flush=True)


anyio.run(main)
