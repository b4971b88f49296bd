//! A pending authorization of the OAuth flows (`oauth.rs`): the PKCE
//! verifier and redirect URI a `state` stands for, whose user and server,
//! since when; and the record of it a shared token store keeps (sealed
//! there), so that the redirect can come back to any replica. Imports only
//! the flows' bound on a pending authorization's age.

use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};

use super::oauth::PENDING_TTL;

/// An authorization started and not finished yet.
pub(super) struct Pending {
    pub(super) server: String,
    pub(super) user: String,
    pub(super) verifier: SecretString,
    pub(super) redirect_uri: String,
    pub(super) created: Instant,
}

/// A pending authorization as a shared store keeps it (sealed there).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct PendingRecord {
    server: String,
    user: String,
    verifier: String,
    redirect_uri: String,
    /// Milliseconds since the epoch.
    created_ms: u64,
}

impl PendingRecord {
    pub(super) fn of(p: &Pending) -> Self {
        let created = std::time::SystemTime::now().checked_sub(p.created.elapsed()).unwrap_or(std::time::UNIX_EPOCH);
        PendingRecord {
            server: p.server.clone(),
            user: p.user.clone(),
            verifier: p.verifier.expose_secret().to_owned(),
            redirect_uri: p.redirect_uri.clone(),
            created_ms: created.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        }
    }

    /// The record in `bytes`, as a [`Pending`] of the same age; `None` when
    /// it does not parse.
    pub(super) fn parse(bytes: &[u8]) -> Option<Pending> {
        let r: PendingRecord = serde_json::from_slice(bytes).ok()?;
        let created = std::time::UNIX_EPOCH + Duration::from_millis(r.created_ms);
        let age = std::time::SystemTime::now().duration_since(created).unwrap_or(Duration::ZERO);
        Some(Pending {
            server: r.server,
            user: r.user,
            verifier: SecretString::from(r.verifier),
            redirect_uri: r.redirect_uri,
            // Older than any deadline when the clock cannot go that far back.
            created: Instant::now().checked_sub(age).unwrap_or_else(|| Instant::now() - PENDING_TTL * 2),
        })
    }
}
