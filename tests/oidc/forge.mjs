// What an attacker can make without the provider's private key, for tests/all/jwt.rs: tokens that look like
// the provider's (same issuer, audience, user, groups) but are signed by another key, carry `alg: none`, are
// HMAC-signed with the provider's public key as the secret (the algorithm-confusion attack, both as PEM and as
// the JWK's JSON), or name key ids the provider never published.
//
// Usage: node forge.mjs ISSUER AUDIENCE  -> one JSON object of named tokens on stdout.
import { SignJWT, UnsecuredJWT, generateKeyPair, importJWK, exportSPKI, exportJWK } from 'jose';

const [issuer, audience] = process.argv.slice(2);
const jwks = await (await fetch(`${issuer}/jwks`)).json();
const pub = jwks.keys[0];
const now = Math.floor(Date.now() / 1000);
const claims = { sub: 'alice', groups: ['engineering'], scope: 'api', client_id: 'alice' };
const base = (header) => new SignJWT(claims).setProtectedHeader(header).setIssuer(issuer).setAudience(audience)
  .setIssuedAt(now).setExpirationTime(now + 600);

const other = await generateKeyPair('RS256', { extractable: true });
const out = {};
out.other_key = await base({ alg: 'RS256', kid: pub.kid, typ: 'at+jwt' }).sign(other.privateKey);
out.none = new UnsecuredJWT(claims).setIssuer(issuer).setAudience(audience).setIssuedAt(now)
  .setExpirationTime(now + 600).encode();
const pem = await exportSPKI(await importJWK(pub, 'RS256'));
out.hmac_pem = await base({ alg: 'HS256', kid: pub.kid, typ: 'at+jwt' }).sign(new TextEncoder().encode(pem));
out.hmac_jwk = await base({ alg: 'HS256', kid: pub.kid, typ: 'at+jwt' })
  .sign(new TextEncoder().encode(JSON.stringify(pub)));
out.unknown_kid = [];
for (let i = 0; i < 20; i += 1) {
  out.unknown_kid.push(await base({ alg: 'RS256', kid: `forged-${i}`, typ: 'at+jwt' }).sign(other.privateKey));
}
out.other_key_jwk = { ...(await exportJWK(other.publicKey)), kid: 'attacker', alg: 'RS256', use: 'sig' };
process.stdout.write(`${JSON.stringify(out)}\n`);
