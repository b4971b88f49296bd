//! The 404 of a path that looks like a misplaced base URL: an endpoint of
//! ours without `/v1` (`/chat/completions`, `/messages`), with it twice
//! (`/v1/v1/chat/completions`), or misspelt by one letter
//! (`/v1/chat/completion`). The answer names the path asked for, the one
//! meant and the base URL the client should be given, in the shape of the
//! route family the path looks like (Anthropic's for `messages`). Imports
//! the proxy's path and error types only.

use axum::http::StatusCode;

use super::error::ApiError;
use super::path::Canonical;

/// First segments (after `/v1`) of the OpenAI-style endpoints a client may aim at.
const OPENAI_FIRST: &[&str] =
    &["chat", "completions", "responses", "response", "conversations", "models", "embeddings", "moderations", "files"];

/// The route family a path looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    OpenAi,
    Anthropic,
}

/// The endpoint `segs` (without its leading `v1`s) was probably meant as,
/// and its family; `None` for a path that is none of ours.
fn meant(rest: &[&str]) -> Option<(Family, Vec<String>)> {
    let first = rest.first()?.to_ascii_lowercase();
    let tail = |from: usize| rest[from..].iter().map(|s| (*s).to_owned());
    match first.as_str() {
        "messages" | "message" => {
            let mut out = vec!["messages".to_owned()];
            match rest.get(1) {
                Some(s) if s.eq_ignore_ascii_case("count_tokens") || s.eq_ignore_ascii_case("count-tokens") => {
                    out.push("count_tokens".to_owned());
                    out.extend(tail(2));
                }
                _ => out.extend(tail(1)),
            }
            Some((Family::Anthropic, out))
        }
        "chat" => {
            let mut out = vec!["chat".to_owned(), "completions".to_owned()];
            match rest.get(1) {
                Some(s) if s.eq_ignore_ascii_case("completion") || s.eq_ignore_ascii_case("completions") => {
                    out.extend(tail(2));
                }
                // `/chat` alone, or `/chat/something`: nothing to guess.
                _ => return None,
            }
            Some((Family::OpenAi, out))
        }
        "response" | "responses" => {
            Some((Family::OpenAi, std::iter::once("responses".to_owned()).chain(tail(1)).collect()))
        }
        f if OPENAI_FIRST.contains(&f) => Some((Family::OpenAi, rest.iter().map(|s| (*s).to_owned()).collect())),
        _ => None,
    }
}

/// Whether `raw` (the request's path) looks like an Anthropic Messages call,
/// so that its refusals speak Anthropic's error shape.
pub(super) fn is_anthropic(raw: &str) -> bool {
    Canonical::parse(raw).is_ok_and(|p| {
        let segs = p.segments();
        let rest: Vec<&str> = segs.iter().copied().skip_while(|s| s.eq_ignore_ascii_case("v1")).collect();
        matches!(meant(&rest), Some((Family::Anthropic, _)))
    })
}

/// The 404 for `path` when it looks like a misplaced base URL, else `None`
/// (the generic unknown-endpoint answer stands). `host` is the request's
/// `Host`, to write the base URL out in full when it is a plain host name.
pub(super) fn not_found(path: &Canonical, host: Option<&str>) -> Option<ApiError> {
    let segs = path.segments();
    let v1s = segs.iter().take_while(|s| s.eq_ignore_ascii_case("v1")).count();
    let (family, fixed) = meant(&segs[v1s..])?;
    let expected = format!("/v1/{}", fixed.join("/"));
    let asked = path.as_path();
    if v1s == 1 && expected == asked {
        // Our spelling already: an endpoint this proxy does not open (or a wrong method), not a misplaced base.
        return None;
    }
    let host = host.filter(|h| !h.is_empty() && h.len() <= 255 && h.bytes().all(|b| b.is_ascii_graphic() && b != b'"'));
    let origin = host.map_or_else(|| "http://HOST:PORT".to_owned(), |h| format!("http://{h}"));
    let shown: String = asked.chars().take(200).collect();
    let base = match family {
        Family::OpenAi => format!(
            "OpenAI-style clients take the base URL `{origin}/v1` (ending in `/v1`, once) and add `/{}` themselves",
            fixed.join("/")
        ),
        Family::Anthropic => format!(
            "Anthropic SDKs and Claude Code take the base URL `{origin}` (without `/v1`: they add `/v1/messages` \
             themselves)"
        ),
    };
    Some(ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "unknown_url",
        format!("`{shown}` is not an endpoint of this proxy; did you mean `{expected}`? {base}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(p: &str) -> Option<String> {
        not_found(&Canonical::parse(p).unwrap(), Some("127.0.0.1:8787")).map(|e| e.message)
    }

    #[test]
    fn misplaced_bases_are_named_and_ours_are_not() {
        let m = hint("/chat/completions").unwrap();
        assert!(m.contains("`/v1/chat/completions`") && m.contains("`http://127.0.0.1:8787/v1`"), "{m}");
        assert!(hint("/v1/v1/chat/completions").unwrap().contains("did you mean `/v1/chat/completions`"));
        assert!(hint("/v1/chat/completion").unwrap().contains("did you mean `/v1/chat/completions`"));
        let m = hint("/messages").unwrap();
        assert!(m.contains("`/v1/messages`") && m.contains("`http://127.0.0.1:8787` (without `/v1`"), "{m}");
        assert!(hint("/v1/v1/messages/count_tokens").unwrap().contains("`/v1/messages/count_tokens`"));
        for ours in ["/v1/chat/completions", "/v1/files", "/v1/messages/batches", "/nothing", "/v1/chat"] {
            assert_eq!(hint(ours), None, "{ours}");
        }
        assert!(is_anthropic("/messages") && is_anthropic("/v1/v1/messages") && !is_anthropic("/chat/completions"));
    }
}
