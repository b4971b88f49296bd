"""A stdio MCP server built on the official Python SDK's high-level server
(`MCPServer`, FastMCP's name since `mcp` 2.x, pinned in requirements.txt),
for the gate tests in tests/all/gate.rs. It mirrors tests/node/ts-templates.mjs.

Templates and listed resources are the SDK's own decorators, so the SDK
matches URIs and templates the way it does for everyone (case-sensitively):

* `users://{user}/profile` (JSON, priority 0.9): a different record per
  user, and `Bob` and `bob` are two users;
* `tickets://{id}` (declared `text/plain`): any ticket;
* `tickets://AB` and `tickets://ab` (listed, `text/markdown`): two tickets.

Every read is logged to `--record` (one URI a line, as the handler that
served it saw it), so a test can tell what was actually read.
"""

import argparse
import json

import mcp_types as types
from mcp.server.mcpserver import MCPServer

parser = argparse.ArgumentParser()
parser.add_argument("--record")
args = parser.parse_args()

PROFILES = {
    "Bob": {"user": "Bob", "role": "admin", "salary": "150k"},
    "bob": {"user": "bob", "role": "intern", "salary": "30k"},
}


def log(line: str) -> None:
    if args.record:
        with open(args.record, "a") as f:
            f.write(line + "\n")


server = MCPServer("python-sdk-templates", version="0.1.0")


@server.resource(
    "users://{user}/profile",
    name="profile",
    title="User profile",
    description="One user's record",
    mime_type="application/json",
    annotations=types.Annotations(priority=0.9),
)
def profile(user: str) -> str:
    log(f"users://{user}/profile")
    if user not in PROFILES:
        raise ValueError(f"no such user {user!r}")
    return json.dumps(PROFILES[user])


@server.resource("tickets://{id}", name="ticket", mime_type="text/plain")
def ticket(id: str) -> str:
    log(f"tickets://{id}")
    return f"ticket {id}: printer on fire"


@server.resource("tickets://AB", name="ticket AB", mime_type="text/markdown")
def ticket_upper() -> str:
    log("tickets://AB")
    return "# ticket AB: upper-case queue"


@server.resource("tickets://ab", name="ticket ab", mime_type="text/markdown")
def ticket_lower() -> str:
    log("tickets://ab")
    return "# ticket ab: lower-case queue"


server.run("stdio")
