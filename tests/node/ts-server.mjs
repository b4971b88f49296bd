// A stdio MCP server built on the official TypeScript SDK v2
// (`@modelcontextprotocol/server`, pinned in package-lock.json), for the
// interop tests in tests/all/sdk.rs. It mirrors tests/python-mcp/server.py.
//
// It serves `fx://doc/N` (text, listed over pages of `--page-size`),
// `fx://live` (the text of the `--live` file; a change is pushed as
// `notifications/resources/updated`) and `fx://blob` (a PNG blob).
// `serveStdio` answers both revisions from one factory: 2026-07-28
// (`server/discover`, `subscriptions/listen`, served by the SDK's entry
// itself) and 2025-11-25 (`initialize`, `resources/subscribe`, served by our
// handlers). Every read is logged to `--record` (its URI, one a line), and
// so are `subscribe URI` (2025) and `listen URI...` (2026, seen on the
// transport, since the SDK's entry answers it before any handler), so a
// test can tell that no read was sent and which path a push took.
// Cache hints: `--read-ttl-ms N` (public), `--private` (60 s, private),
// else one hour, public. A miss is the SDK's `ResourceNotFoundError`
// (-32602 with `data.uri` on every revision, as the SDK documents).

import { appendFileSync, readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

import { ResourceNotFoundError, Server } from '@modelcontextprotocol/server';
import { serveStdio, StdioServerTransport } from '@modelcontextprotocol/server/stdio';

const { values: args } = parseArgs({
    options: {
        n: { type: 'string', default: '3' },
        'page-size': { type: 'string', default: '2' },
        record: { type: 'string' },
        live: { type: 'string' },
        'read-ttl-ms': { type: 'string' },
        private: { type: 'boolean', default: false },
    },
});
const n = Number(args.n);
const pageSize = Number(args['page-size']);

function log(line) {
    if (args.record) appendFileSync(args.record, line + '\n');
}

function liveText() {
    try {
        return readFileSync(args.live, 'utf8');
    } catch {
        return '';
    }
}

function listing() {
    const items = [];
    for (let i = 0; i < n; i++) items.push({ uri: `fx://doc/${i}`, name: `doc ${i}`, mimeType: 'text/plain' });
    if (args.live) items.push({ uri: 'fx://live', name: 'live', mimeType: 'text/plain' });
    items.push({ uri: 'fx://blob', name: 'blob', mimeType: 'image/png' });
    return items;
}

function hints() {
    if (args.private) return { ttlMs: 60_000, cacheScope: 'private' };
    if (args['read-ttl-ms'] !== undefined) return { ttlMs: Number(args['read-ttl-ms']), cacheScope: 'public' };
    return { ttlMs: 3_600_000, cacheScope: 'public' };
}

// Every instance the factory made, with its era and (2025) the URIs its
// client subscribed to: the watcher pushes on each.
const instances = new Set();

function factory({ era }) {
    const server = new Server(
        { name: 'ts-sdk-fixture', version: '0.1.0' },
        { capabilities: { resources: { subscribe: true, listChanged: true } } },
    );
    const entry = { server, era, subscribed: new Set() };
    instances.add(entry);
    server.onclose = () => instances.delete(entry);

    server.setRequestHandler('resources/list', async request => {
        const start = Number(request.params?.cursor ?? 0);
        const items = listing();
        const end = start + pageSize;
        return { resources: items.slice(start, end), ...(end < items.length && { nextCursor: String(end) }) };
    });
    server.setRequestHandler('resources/templates/list', async () => ({ resourceTemplates: [] }));
    server.setRequestHandler('resources/read', async request => {
        const uri = request.params.uri;
        log(uri);
        const doc = /^fx:\/\/doc\/(\d+)$/.exec(uri);
        let contents;
        if (doc && Number(doc[1]) < n) {
            contents = [{ uri, mimeType: 'text/plain', text: `Document ${doc[1]}. ` }];
        } else if (uri === 'fx://live' && args.live) {
            contents = [{ uri, mimeType: 'text/plain', text: liveText() }];
        } else if (uri === 'fx://blob') {
            contents = [{ uri, mimeType: 'image/png', blob: 'iVBORw0KGgo=' }];
        } else {
            throw new ResourceNotFoundError(uri, `no such resource ${uri}`);
        }
        return { contents, ...hints() };
    });
    server.setRequestHandler('resources/subscribe', async request => {
        log(`subscribe ${request.params.uri}`);
        entry.subscribed.add(request.params.uri);
        return {};
    });
    server.setRequestHandler('resources/unsubscribe', async request => {
        entry.subscribed.delete(request.params.uri);
        return {};
    });
    return server;
}

// The SDK's stdio transport, observed: `subscriptions/listen` is answered by
// `serveStdio` itself, so it is logged here on its way in.
const inner = new StdioServerTransport();
const wire = {
    start: () => inner.start(),
    send: (message, options) => inner.send(message, options),
    close: () => inner.close(),
    get onclose() {
        return inner.onclose;
    },
    set onclose(f) {
        inner.onclose = f;
    },
    get onerror() {
        return inner.onerror;
    },
    set onerror(f) {
        inner.onerror = f;
    },
    get onmessage() {
        return inner.onmessage;
    },
    set onmessage(f) {
        inner.onmessage = (message, extra) => {
            if (message.method === 'subscriptions/listen') {
                const uris = message.params?.notifications?.resourceSubscriptions ?? [];
                log(`listen ${uris.join(' ')}`.trimEnd());
            }
            f(message, extra);
        };
    },
};

serveStdio(factory, { transport: wire, onerror: e => process.stderr.write(`ts-server: ${e.message}\n`) });

// Polls the live file and pushes a change: a modern instance's notification
// is routed by the SDK onto the open `subscriptions/listen` streams that
// asked for the URI; a 2025 instance sends it to a client that subscribed.
if (args.live) {
    let last = liveText();
    setInterval(() => {
        const now = liveText();
        if (now === last) return;
        last = now;
        for (const { server, era, subscribed } of instances) {
            if (era === 'modern' || subscribed.has('fx://live')) {
                server.sendResourceUpdated({ uri: 'fx://live' }).catch(() => {});
            }
        }
    }, 20).unref();
}
