// A stdio MCP server built on the official TypeScript SDK v2's high-level
// server (`McpServer` from `@modelcontextprotocol/server`, pinned in
// package-lock.json), for the gate tests in tests/all/gate.rs. It mirrors
// tests/python-mcp/templates.py.
//
// Templates and listed resources are registered with the SDK's own
// `registerResource`, so the SDK matches URIs and templates the way it does
// for everyone (case-sensitively):
//
// * `users://{user}/profile` (JSON, priority 0.9): a different record per
//   user, and `Bob` and `bob` are two users;
// * `tickets://{id}` (declared `text/plain`): any ticket;
// * `tickets://AB` and `tickets://ab` (listed, `text/markdown`): two tickets.
//
// Every read is logged to `--record` (one URI a line, as the handler that
// served it was given it), so a test can tell what was actually read.

import { appendFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

import { McpServer, ResourceTemplate } from '@modelcontextprotocol/server';
import { serveStdio } from '@modelcontextprotocol/server/stdio';

const { values: args } = parseArgs({ options: { record: { type: 'string' } } });

const PROFILES = {
    Bob: { user: 'Bob', role: 'admin', salary: '150k' },
    bob: { user: 'bob', role: 'intern', salary: '30k' },
};

function log(line) {
    if (args.record) appendFileSync(args.record, line + '\n');
}

function factory() {
    const server = new McpServer({ name: 'ts-sdk-templates', version: '0.1.0' });
    server.registerResource(
        'profile',
        new ResourceTemplate('users://{user}/profile', { list: undefined }),
        {
            title: 'User profile',
            description: "One user's record",
            mimeType: 'application/json',
            annotations: { priority: 0.9 },
        },
        async (uri, { user }) => {
            log(uri.href);
            if (!(user in PROFILES)) throw new Error(`no such user ${user}`);
            return { contents: [{ uri: uri.href, mimeType: 'application/json', text: JSON.stringify(PROFILES[user]) }] };
        },
    );
    server.registerResource(
        'ticket',
        new ResourceTemplate('tickets://{id}', { list: undefined }),
        { mimeType: 'text/plain' },
        async (uri, { id }) => {
            log(uri.href);
            return { contents: [{ uri: uri.href, text: `ticket ${id}: printer on fire` }] };
        },
    );
    for (const [id, queue] of [
        ['AB', 'upper'],
        ['ab', 'lower'],
    ]) {
        server.registerResource(`ticket ${id}`, `tickets://${id}`, { mimeType: 'text/markdown' }, async uri => {
            log(uri.href);
            return { contents: [{ uri: uri.href, text: `# ticket ${id}: ${queue}-case queue` }] };
        });
    }
    return server;
}

serveStdio(factory, { onerror: e => process.stderr.write(`ts-templates: ${e.message}\n`) });
