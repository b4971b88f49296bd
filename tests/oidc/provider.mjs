// A real OpenID Connect provider (panva's certified `oidc-provider`, pinned in package-lock.json) for
// tests/all/jwt.rs, on a loopback port. Tokens come from its token endpoint through a real grant:
// client_credentials, one confidential client per test user (`alice`, `bob`, `carol`), whose access tokens
// are JWTs (resourceIndicators, accessTokenFormat 'jwt') for the resource `urn:mcp-context` (or `urn:other`)
// carrying the user's `groups` (extraTokenClaims). The `sub` of such a token is the client id.
//
// Test hooks, not part of OIDC:
//   POST /__test/rotate  a new RS256 signing key; the JWKS then lists [new, old] and tokens are signed by the new one
//   GET  /__test/stats   {"jwks_fetches": N}: how many times the JWKS was served (to see a refresh is rate-limited)
//
// Usage: node provider.mjs  -> prints one line `{"issuer": "http://127.0.0.1:PORT"}` once listening.
import http from 'node:http';
import { generateKeyPair, exportJWK } from 'jose';
import Provider from 'oidc-provider';

const GROUPS = { alice: ['engineering', 'everyone'], bob: ['sales', 'everyone'], carol: [] };
const RESOURCES = ['urn:mcp-context', 'urn:other'];

async function newKey(n) {
  const { privateKey } = await generateKeyPair('RS256', { extractable: true, modulusLength: 2048 });
  return { ...(await exportJWK(privateKey)), kid: `key-${n}`, alg: 'RS256', use: 'sig' };
}

let keys = [await newKey(1)];
let jwksFetches = 0;
let issuer;

function makeProvider() {
  const clients = Object.keys(GROUPS).flatMap((user) => [
    { client_id: user, client_secret: `${user}-secret`, grant_types: ['client_credentials'], redirect_uris: [],
      response_types: [], token_endpoint_auth_method: 'client_secret_post', scope: 'api' },
  ]);
  // A client whose tokens expire after one second, for the expiry test.
  clients.push({ client_id: 'alice-short', client_secret: 'alice-short-secret', grant_types: ['client_credentials'],
    redirect_uris: [], response_types: [], token_endpoint_auth_method: 'client_secret_post', scope: 'api' });
  return new Provider(issuer, {
    clients,
    jwks: { keys },
    scopes: ['openid', 'api'],
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: (_ctx, _client, oneOf) => oneOf || 'urn:mcp-context',
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, resource, client) => {
          if (!RESOURCES.includes(resource)) throw new Error('unknown resource');
          return {
            scope: 'api',
            audience: resource,
            accessTokenFormat: 'jwt',
            accessTokenTTL: client.clientId === 'alice-short' ? 1 : 600,
            jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
    extraTokenClaims: (_ctx, token) => {
      const user = token.clientId === 'alice-short' ? 'alice' : token.clientId;
      return { groups: GROUPS[user] ?? [] };
    },
  });
}

let provider;
const server = http.createServer((req, res) => {
  if (req.url === '/__test/stats') {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ jwks_fetches: jwksFetches }));
    return;
  }
  if (req.url === '/__test/rotate' && req.method === 'POST') {
    newKey(keys.length + 1).then((k) => {
      keys = [k, ...keys];
      provider = makeProvider();
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ kid: k.kid }));
    });
    return;
  }
  if (req.url.startsWith('/jwks')) jwksFetches += 1;
  provider.callback()(req, res);
});
server.listen(0, '127.0.0.1', () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  provider = makeProvider();
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});
process.on('SIGTERM', () => process.exit(0));
