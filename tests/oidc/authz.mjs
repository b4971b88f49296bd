// A real OAuth 2.1 authorization server (panva's certified `oidc-provider`, pinned in package-lock.json) for
// tests/all/oauth.rs (issue 35: per-user upstream credentials), on a loopback port. Same conventions as
// provider.mjs: started as a child process, prints one line `{"issuer": "http://127.0.0.1:PORT"}` once listening.
//
// What it does, all through the library's own code paths:
//   - authorization code + PKCE (S256 required) for the client `mcp-context` (confidential, secret
//     `mcp-context-secret`, client_secret_basic) and `mcp-context-public` (public, `none`): both native, so any
//     loopback port of `http://127.0.0.1/auth/callback` / `http://127.0.0.1/callback` is accepted (RFC 8252);
//   - resourceIndicators: JWT access tokens per resource, `aud` = the resource (any `http://127.0.0.1:…` URL,
//     i.e. an MCP server's URL, or `urn:mcp-context`, the audience of the callers' own tokens);
//   - refresh tokens (rotated), revocation (`/token/revocation`);
//   - RFC 8693 token exchange (`urn:ietf:params:oauth:grant-type:token-exchange`) for the client `gateway`
//     (secret `gateway-secret`, client_secret_basic or _post): the subject_token must be a JWT this provider
//     signed for `urn:mcp-context` (the caller-identity token), unexpired; the issued token's `sub` is the
//     subject's and its `aud` the requested resource/audience;
//   - client_credentials for the callers `alice`, `bob` (secret `<name>-secret`): their identity tokens, for
//     audience `urn:mcp-context`, `sub` = the client id (as provider.mjs);
//   - access-token TTL from the environment: AUTHZ_ACCESS_TTL seconds (default 600).
//
// Test hooks, not part of OAuth:
//   GET /interaction/:uid?login=NAME   a headless login: the test, playing the browser, logs in as NAME (consent
//                                      is implied: the grant covers the request's scopes and resource)
//   GET /__test/log                    {"token_requests": N, "events": [{grant_type, sub, aud, ok, error}]}
//   GET /__test/expired?sub=NAME       an identity token for NAME that expired an hour ago (signed by the provider)
import http from 'node:http';
import { generateKeyPair, exportJWK, importJWK, SignJWT, createLocalJWKSet, jwtVerify } from 'jose';
import Provider, { errors } from 'oidc-provider';

// stdout carries the one line the test reads, and the test closes it after that: oidc-provider's notices
// (console.log/info) go to stderr, or a later notice would die of EPIPE.
console.log = console.error;
console.info = console.error;

const IDENTITY_AUDIENCE = 'urn:mcp-context';
const EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const TTL = Number(process.env.AUTHZ_ACCESS_TTL || 600);

const { privateKey } = await generateKeyPair('RS256', { extractable: true, modulusLength: 2048 });
const key = { ...(await exportJWK(privateKey)), kid: 'authz-1', alg: 'RS256', use: 'sig' };
const { d, p, q, dp, dq, qi, ...publicKey } = key;
const localJwks = createLocalJWKSet({ keys: [publicKey] });

const log = [];
let tokenRequests = 0;
let issuer;

function allowedResource(resource) {
  return resource === IDENTITY_AUDIENCE || /^http:\/\/127\.0\.0\.1:\d+(\/|$)/.test(resource);
}

function makeProvider() {
  const callbacks = ['http://127.0.0.1/auth/callback', 'http://127.0.0.1/callback'];
  const clients = [
    { client_id: 'mcp-context', client_secret: 'mcp-context-secret', application_type: 'native',
      grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'], redirect_uris: callbacks,
      token_endpoint_auth_method: 'client_secret_basic', scope: 'openid mcp offline_access' },
    { client_id: 'mcp-context-public', application_type: 'native',
      grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'], redirect_uris: callbacks,
      token_endpoint_auth_method: 'none', scope: 'openid mcp offline_access' },
    { client_id: 'gateway', client_secret: 'gateway-secret', grant_types: [EXCHANGE], redirect_uris: [],
      response_types: [], token_endpoint_auth_method: 'client_secret_basic', scope: 'mcp' },
    { client_id: 'gateway-post', client_secret: 'gateway-post-secret', grant_types: [EXCHANGE], redirect_uris: [],
      response_types: [], token_endpoint_auth_method: 'client_secret_post', scope: 'mcp' },
    ...['alice', 'bob'].map((user) => ({ client_id: user, client_secret: `${user}-secret`,
      grant_types: ['client_credentials'], redirect_uris: [], response_types: [],
      token_endpoint_auth_method: 'client_secret_post', scope: 'api' })),
  ];
  const provider = new Provider(issuer, {
    clients,
    jwks: { keys: [key] },
    scopes: ['openid', 'offline_access', 'mcp', 'api'],
    pkce: { required: () => true },
    interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      revocation: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: (_ctx, _client, oneOf) => oneOf || IDENTITY_AUDIENCE,
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, resource) => {
          if (!allowedResource(resource)) throw new errors.InvalidTarget('unknown resource');
          return {
            scope: resource === IDENTITY_AUDIENCE ? 'api' : 'mcp',
            audience: resource,
            accessTokenFormat: 'jwt',
            accessTokenTTL: resource === IDENTITY_AUDIENCE ? 600 : TTL,
            jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
    findAccount: (_ctx, sub) => ({ accountId: sub, claims: () => ({ sub }) }),
    issueRefreshToken: (_ctx, client) => client.grantTypeAllowed('refresh_token'),
    rotateRefreshToken: true,
    ttl: { AccessToken: TTL, ClientCredentials: 600, Grant: 3600, Interaction: 600, Session: 3600, RefreshToken: 86400, AuthorizationCode: 60 },
  });

  provider.registerGrantType(EXCHANGE, async (ctx) => {
    const { subject_token: subject, subject_token_type: type } = ctx.oidc.params;
    if (!subject) throw new errors.InvalidRequest('subject_token missing');
    if (type !== 'urn:ietf:params:oauth:token-type:access_token' && type !== 'urn:ietf:params:oauth:token-type:jwt') {
      throw new errors.InvalidRequest('unsupported subject_token_type');
    }
    let payload;
    try {
      ({ payload } = await jwtVerify(subject, localJwks, { issuer, audience: IDENTITY_AUDIENCE }));
    } catch {
      throw new errors.InvalidGrant('subject_token is invalid or expired');
    }
    const resource = ctx.oidc.params.resource || ctx.oidc.params.audience;
    if (!resource || !allowedResource(resource) || resource === IDENTITY_AUDIENCE) {
      throw new errors.InvalidTarget('unknown or missing resource');
    }
    const info = makeInfo(resource);
    const { AccessToken } = ctx.oidc.provider;
    const token = new AccessToken({ accountId: payload.sub, client: ctx.oidc.client, scope: 'mcp' });
    token.resourceServer = new ctx.oidc.provider.ResourceServer(resource, info);
    ctx.oidc.entity('AccessToken', token);
    const value = await token.save();
    ctx.body = {
      access_token: value,
      issued_token_type: 'urn:ietf:params:oauth:token-type:access_token',
      token_type: 'Bearer',
      expires_in: token.expiration,
      scope: 'mcp',
    };
  }, ['subject_token', 'subject_token_type', 'audience', 'resource', 'scope', 'requested_token_type'], ['resource', 'audience']);

  const record = (ctx, ok, error) => {
    const at = ctx.oidc?.entities?.AccessToken || ctx.oidc?.entities?.ClientCredentials;
    log.push({
      grant_type: ctx.oidc?.params?.grant_type ?? null,
      client: ctx.oidc?.client?.clientId ?? null,
      sub: at?.accountId ?? at?.clientId ?? null,
      aud: at?.resourceServer?.audience ?? null,
      ok,
      error: error ? String(error.error || error.message) : null,
    });
  };
  provider.on('grant.success', (ctx) => record(ctx, true));
  provider.on('grant.error', (ctx, err) => record(ctx, false, err));
  return provider;
}

function makeInfo(resource) {
  return { scope: 'mcp', audience: resource, accessTokenFormat: 'jwt', accessTokenTTL: TTL, jwt: { sign: { alg: 'RS256' } } };
}

async function expired(sub) {
  const k = await importJWK(key, 'RS256');
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({ client_id: sub, scope: 'api' })
    .setProtectedHeader({ alg: 'RS256', kid: key.kid, typ: 'at+jwt' })
    .setIssuer(issuer).setSubject(sub).setAudience(IDENTITY_AUDIENCE)
    .setIssuedAt(now - 7200).setExpirationTime(now - 3600).setJti(`expired-${now}`)
    .sign(k);
}

let provider;
const server = http.createServer(async (req, res) => {
  const url = new URL(req.url, issuer);
  try {
    if (url.pathname === '/__test/log') {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ token_requests: tokenRequests, events: log }));
      return;
    }
    if (url.pathname === '/__test/expired') {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ token: await expired(url.searchParams.get('sub') || 'alice') }));
      return;
    }
    if (url.pathname.startsWith('/interaction/')) {
      const login = url.searchParams.get('login');
      if (!login) {
        res.statusCode = 400;
        res.end('log in with ?login=NAME');
        return;
      }
      // Login and consent at once: the grant covers what the request asked (its scopes and resource).
      const details = await provider.interactionDetails(req, res);
      const { params } = details;
      if (process.env.AUTHZ_DEBUG) console.error(JSON.stringify(details.prompt));
      const grant = new provider.Grant({ clientId: params.client_id, accountId: login });
      grant.addOIDCScope(String(params.scope || 'openid'));
      const resources = params.resource ? [].concat(params.resource) : [];
      for (const r of resources) if (allowedResource(r)) grant.addResourceScope(r, r === IDENTITY_AUDIENCE ? 'api' : 'mcp');
      const grantId = await grant.save();
      await provider.interactionFinished(req, res, { login: { accountId: login }, consent: { grantId } },
        { mergeWithLastSubmission: false });
      return;
    }
    if (url.pathname === '/token') tokenRequests += 1;
    provider.callback()(req, res);
  } catch (e) {
    res.statusCode = 400;
    res.end(`fixture: ${e.message}`);
  }
});
server.listen(0, '127.0.0.1', () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  provider = makeProvider();
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
  process.stdout.on('error', () => {});
});
process.on('SIGTERM', () => process.exit(0));
