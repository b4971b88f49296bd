//! Why a network exchange failed, in words a user can act on.
//!
//! rmcp and reqwest describe failures by their own types ("Transport
//! [rmcp::transport::worker::WorkerTransport<…>] error: Client error: error
//! sending request for url (…)") and keep the actual cause (refused, DNS,
//! TLS) deep in the error chain, or only in its `Debug` form. This module
//! walks the chain once and names the cause: connection refused, the host
//! name does not resolve, TLS spoken to a plain port, a timeout, an HTTP
//! status with a one-line excerpt of the body. Callers add the URL (without
//! credentials: [`redact_url`], here so that errors depend on no config)
//! and what they were doing.
//!
//! Layer: bottom. Imports nothing of this crate.

use std::error::Error as StdError;

use rmcp::transport::streamable_http_client::StreamableHttpError;

/// Longest body excerpt quoted after an HTTP status, in characters.
const BODY_EXCERPT: usize = 120;

/// The cause of a failed HTTP exchange, from any error whose chain holds
/// rmcp's Streamable HTTP error or a reqwest error.
pub(crate) fn http_cause(err: &(dyn StdError + 'static)) -> String {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(h) = e.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            return streamable_cause(h);
        }
        if let Some(r) = e.downcast_ref::<reqwest::Error>() {
            return reqwest_cause(r);
        }
        if let Some(d) = e.downcast_ref::<rmcp::transport::DynamicTransportError>() {
            // Its own text names the transport's type; only its cause counts.
            return http_cause(d.error.as_ref());
        }
        cur = e.source();
    }
    one_line(&err.to_string(), 300)
}

/// An LLM endpoint's failure in words: the URL (without credentials) and
/// the cause for a failed exchange, the status and message for an API error.
pub(crate) fn openai_cause(e: &async_openai::error::OpenAIError) -> String {
    use async_openai::error::OpenAIError as E;
    match e {
        E::Reqwest(r) => {
            let cause = reqwest_cause(r);
            match r.url() {
                Some(url) => format!("{}: {cause}", redact_url(url.as_str())),
                None => cause,
            }
        }
        E::ApiError(api) => {
            let code = api.status_code.as_u16();
            format!("{}{}", status_text(code, ""), body_excerpt(&api.api_error.message))
        }
        E::JSONDeserialize(_, content) => {
            format!("the endpoint's answer is not a chat completion (is the base URL right?){}", body_excerpt(content))
        }
        other => one_line(&other.to_string(), 300),
    }
}

fn streamable_cause(e: &StreamableHttpError<reqwest::Error>) -> String {
    match e {
        StreamableHttpError::Client(r) => reqwest_cause(r),
        StreamableHttpError::HttpStatus(s) => status_text(s.status, ""),
        StreamableHttpError::UnexpectedServerResponse(text) => match text.strip_prefix("HTTP ") {
            // "HTTP 404 Not Found: <body>"
            Some(rest) => {
                let (status, body) = rest.split_once(": ").unwrap_or((rest, ""));
                format!("HTTP {status}{}", body_excerpt(body))
            }
            None => format!("unexpected answer: {}", one_line(text, BODY_EXCERPT)),
        },
        StreamableHttpError::ResponseBodyTooLarge { max_size } => format!("answer larger than {max_size} bytes"),
        StreamableHttpError::UnexpectedContentType(ct) => format!(
            "the server answered with content type `{}`, neither JSON nor an event stream (is this the MCP endpoint?)",
            ct.as_deref().unwrap_or("none")
        ),
        StreamableHttpError::Io(io) => io_cause(io).unwrap_or_else(|| one_line(&io.to_string(), 200)),
        StreamableHttpError::SessionExpired => "the server ended the session (HTTP 404)".to_owned(),
        other => one_line(&other.to_string(), 300),
    }
}

/// The cause inside a reqwest error: refused, DNS, TLS, timeout, status.
pub(crate) fn reqwest_cause(e: &reqwest::Error) -> String {
    let mut innermost = None;
    let mut cur: Option<&(dyn StdError + 'static)> = e.source();
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>()
            && let Some(cause) = io_cause(io)
        {
            return cause;
        }
        let text = c.to_string();
        let debug = format!("{c:?}");
        if text.contains("dns error") || text.contains("failed to lookup address") {
            let host = e.url().and_then(|u| u.host_str()).unwrap_or("the host");
            return format!("cannot resolve `{host}` (DNS lookup failed)");
        }
        if debug.contains("InvalidContentType") || debug.contains("InvalidMessage") {
            return "TLS handshake failed: the server does not speak TLS on this port (use http://?)".to_owned();
        }
        if debug.contains("InvalidCertificate") || text.contains("certificate") {
            return format!("TLS handshake failed: {}", one_line(&text, 200));
        }
        innermost = Some(text);
        cur = c.source();
    }
    if e.is_timeout() {
        return "timed out".to_owned();
    }
    if let Some(status) = e.status() {
        return status_text(status.as_u16(), "");
    }
    let detail = innermost.map(|t| one_line(&t, 200)).unwrap_or_else(|| "request failed".to_owned());
    if e.is_connect() { format!("cannot connect: {detail}") } else { detail }
}

fn io_cause(io: &std::io::Error) -> Option<String> {
    use std::io::ErrorKind as K;
    Some(
        match io.kind() {
            K::ConnectionRefused => "connection refused",
            K::ConnectionReset => "connection reset by the server",
            K::ConnectionAborted => "connection aborted",
            K::TimedOut => "timed out",
            K::HostUnreachable => "host unreachable",
            K::NetworkUnreachable => "network unreachable",
            K::AddrNotAvailable => "address not available",
            _ => return None,
        }
        .to_owned(),
    )
}

fn status_text(status: u16, body: &str) -> String {
    let reason = http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
    format!("HTTP {status} {reason}{}", body_excerpt(body)).replace("  ", " ").trim_end().to_owned()
}

/// `: "first words of the body"`, tags and whitespace collapsed; empty for an empty body.
pub(crate) fn body_excerpt(body: &str) -> String {
    let text = strip_tags(body);
    let line = one_line(&text, BODY_EXCERPT);
    if line.is_empty() || line == "<empty>" { String::new() } else { format!(": {line}") }
}

/// Markup removed (an HTML error page reads as its words), `<!DOCTYPE …>` included.
fn strip_tags(s: &str) -> String {
    if !s.trim_start().starts_with('<') {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                out.push(' ');
            }
            _ if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

/// Whitespace runs (newlines included) as one space, at most `max` characters (then `…`).
pub(crate) fn one_line(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, word) in s.split_whitespace().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word);
        if out.chars().count() > max {
            let cut: String = out.chars().take(max).collect();
            return format!("{cut}…");
        }
    }
    out
}

/// Strips userinfo and the query from a URL before it is logged or reported.
pub(crate) fn redact_url(url: &str) -> String {
    let parsed = url::Url::parse(url).ok().filter(|u| !u.cannot_be_a_base());
    let Some(mut parsed) = parsed else {
        // Not a URL with a host (a config typo, `user:pw@host` without a
        // scheme, an unexpanded value): nothing before an `@` is shown, nor
        // anything past a `?` or `#`.
        let shown = &url[..url.find(['?', '#']).unwrap_or(url.len())];
        return match shown.rfind('@') {
            Some(at) => format!("***@{}", &shown[at + 1..]),
            None => shown.to_owned(),
        };
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // Fails only for URLs that cannot carry credentials at all.
        let _ = parsed.set_password(None);
        let _ = parsed.set_username("***");
    }
    parsed.set_query(None);
    parsed.set_fragment(None);
    let mut shown = String::from(parsed);
    // `Url` writes the root path of `http://host` as `http://host/`: show
    // the address as it was written.
    let after_scheme = url.split_once("://").map_or("", |(_, rest)| rest);
    if shown.ends_with('/') && !after_scheme.contains('/') {
        shown.pop();
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_bodies_read_as_one_line_of_words() {
        let page = "<!DOCTYPE html>\n<html><head><title>Error</title></head>\n<body><h1>Not Found</h1>\n<p>The requested URL was not found.</p></body></html>\n";
        assert_eq!(body_excerpt(page), ": Error Not Found The requested URL was not found.");
        assert_eq!(body_excerpt(""), "");
        assert_eq!(one_line(&"word ".repeat(100), 12), "word word wo…");
        assert_eq!(status_text(502, ""), "HTTP 502 Bad Gateway");
    }

    /// Credentials, query and fragment never show; the rest reads as written.
    #[test]
    fn urls_are_shown_without_credentials() {
        for (url, shown) in [
            ("https://u:p@h/x?k=1", "https://***@h/x"),
            ("https://user@h:8443/v1#frag", "https://***@h:8443/v1"),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1"),
            ("rediss://:secret@redis.internal:6380/0", "rediss://***@redis.internal:6380/0"),
            ("redis+unix:///run/redis.sock?pass=secret", "redis+unix:///run/redis.sock"),
            ("https://h/p@q", "https://h/p@q"),
            ("user:pw@host/x", "***@host/x"),
            ("not a url?token=1", "not a url"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
