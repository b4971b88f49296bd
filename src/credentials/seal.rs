//! Sealing a [`TokenSet`] for storage: XChaCha20-Poly1305 (RustCrypto's
//! `chacha20poly1305`), a random 24-byte nonce per record, and the
//! (server, user) pair as associated data, so that a record copied under
//! another user's or another server's key does not open.
//!
//! Record layout: `1` (version) ‖ nonce (24 bytes) ‖ ciphertext and tag.
//! The plaintext is the token set as JSON, which exists only here, is
//! zeroed once sealed or read, and never leaves this file in the clear.
//!
//! Layer: sources (credentials). Imports the settings' key, the error type
//! and the token vocabulary of `credentials`.

use std::time::{Duration, UNIX_EPOCH};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use secrecy::zeroize::Zeroizing;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::TokenSet;
use crate::config::SecretKey;
use crate::error::{Error, Result};

/// The record format this file writes.
const VERSION: u8 = 1;
/// XChaCha20's nonce: long enough to be drawn at random for every record.
const NONCE: usize = 24;

/// Seals and opens records with one key.
#[derive(Clone)]
pub struct Sealer {
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(<key redacted>)")
    }
}

/// The token set as stored (inside the sealed bytes only).
#[derive(Serialize, Deserialize)]
struct Plain {
    access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refresh_token: Option<String>,
    /// Seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at: Option<u64>,
    #[serde(default)]
    scopes: Vec<String>,
    #[serde(default)]
    resource: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
}

impl Drop for Plain {
    fn drop(&mut self) {
        use secrecy::zeroize::Zeroize;
        self.access_token.zeroize();
        if let Some(r) = &mut self.refresh_token {
            r.zeroize();
        }
        for (_, v) in &mut self.headers {
            v.zeroize();
        }
    }
}

/// The associated data of (server, user): length-prefixed, so that no two
/// pairs give the same bytes (`a` + `b:c` is not `a:b` + `c`).
fn associated(server: &str, user: &str) -> Vec<u8> {
    let mut ad = Vec::with_capacity(32 + server.len() + user.len());
    ad.extend_from_slice(b"mcp-context/credential/v1");
    for part in [server, user] {
        ad.extend_from_slice(&(part.len() as u64).to_be_bytes());
        ad.extend_from_slice(part.as_bytes());
    }
    ad
}

impl Sealer {
    /// A sealer with `key`.
    pub fn new(key: &SecretKey) -> Self {
        Sealer { cipher: XChaCha20Poly1305::new(key.expose().into()) }
    }

    /// `tokens` sealed for (`server`, `user`).
    pub fn seal(&self, server: &str, user: &str, tokens: &TokenSet) -> Result<Vec<u8>> {
        let plain = Plain {
            access_token: tokens.access_token.expose_secret().to_owned(),
            refresh_token: tokens.refresh_token.as_ref().map(|r| r.expose_secret().to_owned()),
            expires_at: tokens.expires_at.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_secs()),
            scopes: tokens.scopes.clone(),
            resource: tokens.resource.clone(),
            headers: tokens.headers.iter().map(|(k, v)| (k.clone(), v.expose_secret().to_owned())).collect(),
        };
        let bytes = Zeroizing::new(serde_json::to_vec(&plain).map_err(|e| store_error("cannot encode a record", e))?);
        self.seal_with(&associated(server, user), &bytes)
    }

    /// `bytes` sealed with `ad` as associated data (the record layout of
    /// this file): for records other than token sets, each kind with an
    /// associated data of its own.
    pub(crate) fn seal_with(&self, ad: &[u8], bytes: &[u8]) -> Result<Vec<u8>> {
        let mut nonce = [0u8; NONCE];
        getrandom::fill(&mut nonce)
            .map_err(|e| Error::TokenStore { what: format!("no random numbers for a nonce: {e}"), source: None })?;
        let sealed = self
            .cipher
            .encrypt(&XNonce::from(nonce), Payload { msg: bytes, aad: ad })
            .map_err(|_| Error::TokenStore { what: "cannot seal a record".into(), source: None })?;
        let mut out = Vec::with_capacity(1 + NONCE + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The bytes sealed in `record` with `ad`; `None` when it does not open
    /// (another key, another associated data, or not this layout).
    pub(crate) fn open_with(&self, ad: &[u8], record: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        if record.len() < 1 + NONCE + 16 || record[0] != VERSION {
            return None;
        }
        let mut n = [0u8; NONCE];
        n.copy_from_slice(&record[1..1 + NONCE]);
        self.cipher.decrypt(&XNonce::from(n), Payload { msg: &record[1 + NONCE..], aad: ad }).ok().map(Zeroizing::new)
    }

    /// The token set sealed in `record` for (`server`, `user`). A record that
    /// does not open (another key, or sealed for another pair) is an error
    /// that says so, without any of its bytes.
    pub fn open(&self, server: &str, user: &str, record: &[u8]) -> Result<TokenSet> {
        if record.len() < 1 + NONCE + 16 || record[0] != VERSION {
            return Err(Error::TokenStore {
                what: format!("the record of server `{server}` for this user is not in a format this version reads"),
                source: None,
            });
        }
        let bytes = self.open_with(&associated(server, user), record).ok_or_else(|| Error::TokenStore {
            what: format!(
                "the record of server `{server}` for this user does not open: it was sealed with another key (check \
                 `credentials.key`) or for another user or server"
            ),
            source: None,
        })?;
        let plain: Plain =
            serde_json::from_slice(&bytes).map_err(|e| store_error("a record opened but is not valid", e))?;
        Ok(TokenSet {
            access_token: SecretString::from(plain.access_token.clone()),
            refresh_token: plain.refresh_token.clone().map(SecretString::from),
            expires_at: plain.expires_at.map(|s| UNIX_EPOCH + Duration::from_secs(s)),
            scopes: plain.scopes.clone(),
            resource: plain.resource.clone(),
            headers: plain.headers.iter().map(|(k, v)| (k.clone(), SecretString::from(v.clone()))).collect(),
        })
    }
}

/// A store error with its cause (never one that quotes a secret: these are
/// encoding and I/O errors).
pub(super) fn store_error(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::TokenStore { what: what.to_owned(), source: Some(std::sync::Arc::new(e)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> SecretKey {
        SecretKey::parse(&"ab".repeat(32).replace("ab", &format!("{b:02x}"))).unwrap()
    }

    fn tokens() -> TokenSet {
        let mut t = TokenSet::bearer(SecretString::from("at-SECRET-123"), "https://h/mcp");
        t.headers = vec![("X-Api-Key".into(), SecretString::from("hdr-SECRET-456"))];
        t.refresh_token = Some(SecretString::from("rt-SECRET-789"));
        t.expires_at = Some(UNIX_EPOCH + Duration::from_secs(2_000_000_000));
        t
    }

    #[test]
    fn round_trip_and_nothing_in_clear() {
        let s = Sealer::new(&key(1));
        let rec = s.seal("jira", "alice", &tokens()).unwrap();
        for secret in ["at-SECRET-123", "hdr-SECRET-456", "rt-SECRET-789", "X-Api-Key"] {
            assert!(!rec.windows(secret.len()).any(|w| w == secret.as_bytes()), "{secret} in clear");
        }
        let back = s.open("jira", "alice", &rec).unwrap();
        assert_eq!(back.access_token.expose_secret(), "at-SECRET-123");
        assert_eq!(back.headers[0].1.expose_secret(), "hdr-SECRET-456");
        assert_eq!(back.refresh_token.unwrap().expose_secret(), "rt-SECRET-789");
        assert_eq!(back.expires_at, tokens().expires_at);
        // A fresh nonce each time.
        assert_ne!(rec, s.seal("jira", "alice", &tokens()).unwrap());
    }

    #[test]
    fn wrong_key_fails_clearly() {
        let rec = Sealer::new(&key(1)).seal("jira", "alice", &tokens()).unwrap();
        let e = Sealer::new(&key(2)).open("jira", "alice", &rec).unwrap_err().to_string();
        assert!(e.contains("another key"), "{e}");
        assert!(!e.contains("SECRET"), "{e}");
    }

    #[test]
    fn a_record_moved_to_another_user_or_server_does_not_open() {
        let s = Sealer::new(&key(1));
        let rec = s.seal("jira", "alice", &tokens()).unwrap();
        for (server, user) in
            [("jira", "bob"), ("jira", "Alice"), ("drive", "alice"), ("jir", "aalice"), ("jiraa", "lice")]
        {
            assert!(s.open(server, user, &rec).is_err(), "{server}/{user} opened alice's record");
        }
        let mut bad = rec.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(s.open("jira", "alice", &bad).is_err());
        assert!(s.open("jira", "alice", &rec[..10]).is_err());
    }

    #[test]
    fn debug_shows_no_key() {
        assert_eq!(format!("{:?}", Sealer::new(&key(7))), "Sealer(<key redacted>)");
        assert_eq!(format!("{:?}", key(7)), "SecretKey(<redacted>)");
    }
}
