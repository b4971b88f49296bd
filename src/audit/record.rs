//! The audit record of one injection and how it is made from a [`Report`]
//! and the message sent: never the content, only ids, digests and counts.
//! Also the small helpers it needs: UTC timestamps, random ids, W3C
//! `traceparent` parsing and the digest of each block of the message.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::report::{ExcludeReason, Report};

/// One resource of an injection, as recorded: its id, the SHA-256 of the
/// exact block sent (for passages, the block holding the passage set), its
/// tokens and whether it was cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AuditResource {
    /// `server:uri`.
    pub id: String,
    /// Hex SHA-256 of the block as it was in the message (`<resource …>` line to `</resource>` line, inclusive).
    pub sha256: String,
    /// Tokens of the block.
    pub tokens: usize,
    /// Cut to fit the budget.
    #[serde(default)]
    pub truncated: bool,
    /// Relevance mode sent passages of it rather than the whole resource.
    #[serde(default)]
    pub passages: bool,
}

/// What one injection gave whom, for the audit trail: one per injection,
/// written by the library when it builds a context, or by `serve` once the
/// upstream has answered (then with the upstream's status and latency).
/// Never holds resource content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AuditRecord {
    /// When the injection was built, RFC 3339 UTC with milliseconds.
    pub at: String,
    /// This request's id: the caller's `x-request-id` when it sent a usable one, else random (32 hex digits).
    pub request_id: String,
    /// The W3C trace id: the caller's `traceparent`'s when it sent one, else random (32 hex digits).
    pub trace_id: String,
    /// `/v1/chat/completions`, `/v1/responses`, `/v1/messages`, `/v1/messages/count_tokens`; `library` for an
    /// injection made by the library itself.
    pub route: String,
    /// The model whose tokenizer counted (the request's).
    pub model: String,
    /// The user the context was built for.
    pub user: String,
    /// How the user was identified: `key`, `header`, `body`, `anonymous` (serve); `library` (named by the
    /// application).
    pub identity_source: String,
    /// The user's roles under the policy in force.
    pub roles: Vec<String>,
    /// `priority` or `relevance`; absent when nothing was composed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The budget applied.
    pub budget: usize,
    /// Tokens of the message sent (0: nothing injected).
    pub tokens: usize,
    /// Each resource sent, in message order.
    pub included: Arc<[AuditResource]>,
    /// Resources left out, counted by reason (`denied`, `audience`, `budget`, `error`, `not found`).
    pub excluded: BTreeMap<String, usize>,
    /// The ids of the denied resources (the operator's view; `audit.denied_ids: false` leaves them out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied: Vec<String>,
    /// Servers that could not be used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers_failed: Vec<String>,
    /// The upstream's HTTP status (serve); absent when it was not reached or for the library.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    /// Milliseconds until the upstream's response headers (serve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_ms: Option<f64>,
    /// Milliseconds the injection took.
    pub injection_ms: f64,
}

/// Where an injection came from, for its record.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub(crate) route: String,
    pub(crate) identity_source: String,
    pub(crate) request_id: String,
    pub(crate) trace_id: String,
}

impl Origin {
    /// An injection the library made for an application: the identity's
    /// source when the application gave one (`ContextRequest::with_identity`),
    /// else `library`; the current span's trace id when traces are on.
    pub(crate) fn library(report: &Report) -> Self {
        let traced = crate::telemetry::current().and_then(|t| trace_id_of(&t.traceparent));
        Origin {
            route: "library".into(),
            identity_source: report.identity.clone().unwrap_or_else(|| "library".into()),
            request_id: random_hex(),
            trace_id: traced.unwrap_or_else(random_hex),
        }
    }
}

impl Origin {
    /// A call of the model's `read_mcp_resource` tool, run by the library for
    /// an application.
    pub(crate) fn tool_read() -> Self {
        let traced = crate::telemetry::current().and_then(|t| trace_id_of(&t.traceparent));
        Origin {
            route: "tool:read_mcp_resource".into(),
            identity_source: "library".into(),
            request_id: random_hex(),
            trace_id: traced.unwrap_or_else(random_hex),
        }
    }
}

/// One `read_mcp_resource` call, for its record: who asked, what came back (none for a refusal) and how long it took.
pub(crate) struct ToolRead<'a> {
    pub(crate) user: &'a str,
    pub(crate) model: &'a str,
    /// `context.tool_result_max_tokens`.
    pub(crate) budget: usize,
    /// `(id, text the model got, its tokens, cut to the budget)`.
    pub(crate) got: Option<(String, &'a str, usize, bool)>,
    pub(crate) ms: f64,
}

impl AuditRecord {
    /// The record of a `read_mcp_resource` call: the resource returned, with
    /// the SHA-256 and tokens of the exact text the model got; or a refusal
    /// (refused by the gate, denied, absent: the model is told "not found"
    /// for all), counted as `not found`, with no id.
    pub(crate) fn tool_read(read: ToolRead<'_>, roles: &[String], origin: Origin) -> Self {
        let tokens = read.got.as_ref().map_or(0, |g| g.2);
        let included: Arc<[AuditResource]> = match read.got {
            Some((id, text, tokens, truncated)) => Arc::new([AuditResource {
                id,
                sha256: hex_bytes(&Sha256::digest(text.as_bytes())),
                tokens,
                truncated,
                passages: false,
            }]),
            None => Arc::new([]),
        };
        let excluded = if included.is_empty() {
            BTreeMap::from([(ExcludeReason::NotFound.to_string(), 1)])
        } else {
            BTreeMap::new()
        };
        AuditRecord {
            at: now_rfc3339(),
            request_id: origin.request_id,
            trace_id: origin.trace_id,
            route: origin.route,
            model: read.model.to_owned(),
            user: read.user.to_owned(),
            identity_source: origin.identity_source,
            roles: roles.to_vec(),
            mode: None,
            budget: read.budget,
            tokens,
            included,
            excluded,
            denied: Vec::new(),
            servers_failed: Vec::new(),
            upstream_status: None,
            upstream_ms: None,
            injection_ms: read.ms,
        }
    }

    /// The record of `report`, whose resources sent are `included`.
    pub(crate) fn new(
        report: &Report,
        included: Arc<[AuditResource]>,
        roles: &[String],
        origin: Origin,
        denied_ids: bool,
    ) -> Self {
        // The list keeps its counts by reason: a report leaves out hundreds of resources.
        let excluded = ExcludeReason::ALL
            .iter()
            .map(|&r| (r, report.excluded.count(r)))
            .filter(|&(_, n)| n > 0)
            .map(|(r, n)| (r.to_string(), n))
            .collect();
        let denied = if denied_ids && report.excluded.count(ExcludeReason::Denied) > 0 {
            report.excluded.iter().filter(|e| e.reason == ExcludeReason::Denied).map(|e| e.id.clone()).collect()
        } else {
            Vec::new()
        };
        AuditRecord {
            at: now_rfc3339(),
            request_id: origin.request_id,
            trace_id: origin.trace_id,
            route: origin.route,
            model: report.model.clone(),
            user: report.user.clone(),
            identity_source: origin.identity_source,
            roles: roles.to_vec(),
            mode: report.mode.map(|m| m.to_string()),
            budget: report.budget,
            tokens: report.tokens,
            included,
            excluded,
            denied,
            servers_failed: report.failed_servers.iter().map(|f| f.server.clone()).collect(),
            upstream_status: None,
            upstream_ms: None,
            injection_ms: report.timings.total_ms,
        }
    }
}

/// The hex SHA-256 of each resource block of one message, by `server:uri`.
pub(crate) type Digests = HashMap<String, String>;

/// Each resource `report` included, with the digest of its block in the
/// message (`blocks`; empty without one). Shared: a message's list is made
/// once and every record of that message holds it.
pub(crate) fn included(report: &Report, blocks: Option<&Digests>) -> Arc<[AuditResource]> {
    report
        .included
        .iter()
        .map(|i| AuditResource {
            sha256: blocks.and_then(|b| b.get(&i.id)).cloned().unwrap_or_default(),
            id: i.id.clone(),
            tokens: i.tokens,
            truncated: i.truncated,
            passages: i.chunks.is_some(),
        })
        .collect()
}

/// [`block_digests`] in hex.
pub(crate) fn digests(message: &str) -> Digests {
    block_digests(message).into_iter().map(|(id, h)| (id, hex(h))).collect()
}

/// The SHA-256 of each resource block of a message, by `server:uri`. A block
/// is the text from a line starting with `<resource id="` to the next line
/// equal to `</resource>`, both included (the renderer guarantees one of
/// each per block: resource text cannot open or close one). Two blocks of
/// one id (never made today) would be hashed together, in order.
fn block_digests(message: &str) -> HashMap<String, Sha256> {
    let mut out: HashMap<String, Sha256> = HashMap::new();
    let mut rest = message;
    let mut offset_in_line_start = true;
    while !rest.is_empty() {
        let Some(start) = find_line_start(rest, "<resource id=\"", offset_in_line_start) else { break };
        let block = &rest[start..];
        let end = find_line_start(block, "</resource>", false)
            .map_or(block.len(), |e| (e + "</resource>".len()).min(block.len()));
        let head = &block["<resource id=\"".len()..];
        let id = unescape(&head[..head.find('"').unwrap_or(0)]);
        out.entry(id).or_default().update(&block.as_bytes()[..end]);
        rest = &block[end..];
        offset_in_line_start = false;
    }
    out
}

/// The offset of the first line of `s` that starts with `needle` (`s` itself
/// counting as a line start when `at_start`).
fn find_line_start(s: &str, needle: &str, at_start: bool) -> Option<usize> {
    if at_start && s.starts_with(needle) {
        return Some(0);
    }
    let mut from = 0;
    while let Some(i) = s[from..].find(needle) {
        let at = from + i;
        if at > 0 && s.as_bytes()[at - 1] == b'\n' {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Undoes the renderer's attribute escaping (`&amp; &quot; &lt; &gt;`).
fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
}

fn hex(h: Sha256) -> String {
    hex_bytes(&h.finalize())
}

/// Lower-case hex of `bytes`, in one allocation.
pub(super) fn hex_bytes(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out
}

/// 16 random bytes in hex (a W3C trace id's size), never all zeros: a
/// request's id and, without traces, its trace id. Names, not secrets, so
/// from a per-thread generator (as the OpenTelemetry SDK makes its ids), not
/// a system call: `getrandom`, three times a request, was the proxy's most
/// frequent system call, ahead of its reads and writes.
pub(crate) fn random_hex() -> String {
    hex_bytes(&fastrand::u128(1..).to_be_bytes())
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), if it is one (not all zeros).
pub(crate) fn trace_id_of(traceparent: &str) -> Option<String> {
    let parts: Vec<&str> = traceparent.trim().split('-').collect();
    let hex_of =
        |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    match parts.as_slice() {
        [v, t, p, f, ..]
            if hex_of(v, 2)
                && *v != "ff"
                && hex_of(t, 32)
                && hex_of(p, 16)
                && hex_of(f, 2)
                && t.bytes().any(|b| b != b'0') =>
        {
            Some((*t).to_owned())
        }
        _ => None,
    }
}

/// A caller's request id we keep: 1 to 128 printable ASCII characters.
#[cfg(feature = "serve")]
pub(crate) fn usable_request_id(id: &str) -> Option<String> {
    (!id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic())).then(|| id.to_owned())
}

/// Now, RFC 3339 UTC with milliseconds.
pub(crate) fn now_rfc3339() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    rfc3339(d.as_secs() as i64, d.subsec_millis())
}

/// `secs` since the epoch as RFC 3339 UTC (`2026-12-02T14:00:00.000Z`).
pub(crate) fn rfc3339(secs: i64, millis: u32) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 of a proleptic Gregorian date: Howard Hinnant's
/// days_from_civil, the inverse of [`rfc3339`]'s civil_from_days.
pub(crate) fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The time a [`rfc3339`] string names (this module's own format, as
/// records carry it), for the binary `timestamptz` of PostgreSQL's `COPY`.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn parse_rfc3339(s: &str) -> Option<std::time::SystemTime> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> { s.get(from..from + len)?.parse().ok() };
    if b.len() != 24 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[19] != b'.' || b[23] != b'Z' {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (h, m, sec, ms) = (num(11, 2)?, num(14, 2)?, num(17, 2)?, num(20, 3)?);
    let days = days_from_civil(year, month, day);
    let ms_total = ((days * 86_400 + h * 3600 + m * 60 + sec) * 1000 + ms).try_into().ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms_total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_read_back() {
        for (secs, ms) in [(0, 0), (1_795_000_000, 42), (951_782_400, 999), (4_102_444_799, 1)] {
            let t = parse_rfc3339(&rfc3339(secs, ms)).unwrap();
            assert_eq!(t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis(), secs as u128 * 1000 + ms as u128);
        }
        assert_eq!(parse_rfc3339("2026-12-02 14:00:00.000Z"), None);
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_000_000, 42), "2026-11-18T11:06:40.042Z");
        assert_eq!(rfc3339(951_782_400, 0), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn traceparents_are_checked() {
        let t = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(trace_id_of(t).as_deref(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(trace_id_of("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id_of("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id_of("garbage"), None);
        assert_eq!(random_hex().len(), 32);
        let (a, b) = (random_hex(), random_hex());
        assert!(a != b && trace_id_of(&format!("00-{a}-00f067aa0ba902b7-01")).as_deref() == Some(a.as_str()));
        assert_eq!(hex_bytes(&[0, 9, 10, 255, 0x4b]), "00090aff4b");
    }

    #[test]
    fn each_block_is_hashed_exactly_as_sent() {
        let a = "<resource id=\"d:x://a?b=1&amp;c\" name=\"a\">\nbody with </resource in it\n</resource>";
        let b = "<resource id=\"d:x://b\">\nother\n</resource>";
        let msg = format!("preamble\n\n{a}\n\n{b}\n");
        let got = block_digests(&msg);
        assert_eq!(got.len(), 2);
        assert_eq!(hex(got["d:x://a?b=1&c"].clone()), hex(Sha256::new_with_prefix(a)));
        assert_eq!(hex(got["d:x://b"].clone()), hex(Sha256::new_with_prefix(b)));
    }
}
