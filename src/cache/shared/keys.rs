//! Names in Redis: a resource's keys, digests, a server's identity across
//! replicas, the clock values stored.

use super::*;

/// The keys of one resource.
pub(super) struct Keys {
    pub(super) data: String,
    pub(super) generation: String,
    pub(super) lock: String,
}

fn hex(bytes: &[u8], len: usize) -> String {
    bytes
        .iter()
        .flat_map(|b| [b >> 4, b & 15])
        .take(len)
        .map(|n| char::from_digit(n.into(), 16).unwrap_or('0'))
        .collect()
}

pub(super) fn digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.len().to_le_bytes());
        h.update(p.as_bytes());
    }
    hex(&h.finalize(), 32)
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A server's identity across replicas: its name and a digest of how it is
/// reached (command and arguments, or URL). The environment is left out:
/// it holds secrets and host-specific values, not what the server serves.
pub(super) fn identity(name: &str, transport: &Transport) -> String {
    let fp = match transport {
        Transport::Stdio { command, args, .. } => {
            let mut parts = vec!["stdio", command.as_str()];
            parts.extend(args.iter().map(String::as_str));
            digest(&parts)
        }
        Transport::Http { url, .. } => digest(&["http", url]),
    };
    format!("{name}.{}", &fp[..16])
}
