//! rmcp's wire types turned into ours: resources, templates, read contents
//! (blob bytes never kept, text cut at the byte limit) and errors. Nothing
//! outside `hub` sees an rmcp type.

use std::time::SystemTime;

use rmcp::model::{ErrorCode, ResourceContents};
use rmcp::service::ServiceError;

use crate::config::ServerConfig;
use crate::error::Error;
use crate::id::ResourceId;
use crate::resource::{Annotations, Audience, ContentPart, Contents, Resource, ResourceTemplate};

fn convert_annotations(a: Option<rmcp::model::Annotations>) -> Annotations {
    a.map(|a| Annotations {
        audience: a.audience.map(|v| {
            v.into_iter()
                .map(|role| match role {
                    rmcp::model::Role::User => Audience::User,
                    _ => Audience::Assistant,
                })
                .collect()
        }),
        priority: a.priority.filter(|p| p.is_finite()),
        last_modified: a.last_modified,
    })
    .unwrap_or_default()
}

pub(super) fn convert_resource(server: &str, r: rmcp::model::Resource, now: SystemTime) -> Resource {
    let annotations = convert_annotations(r.annotations);
    Resource {
        id: ResourceId::from_listing(server, &r.uri),
        name: r.name,
        title: r.title,
        description: r.description,
        mime_type: r.mime_type,
        size: r.size,
        annotations,
        discovered_at: now,
    }
}

pub(super) fn convert_template(server: &str, t: rmcp::model::ResourceTemplate) -> ResourceTemplate {
    ResourceTemplate {
        server: server.to_owned(),
        uri_template: t.uri_template,
        name: t.name,
        title: t.title,
        description: t.description,
        mime_type: t.mime_type,
        annotations: convert_annotations(t.annotations),
    }
}

/// Converts wire contents, never keeping blob bytes, and cuts text beyond
/// `max_bytes` (at a char boundary) before anything tokenises it.
pub(super) fn convert_contents(contents: Vec<ResourceContents>, max_bytes: usize) -> Contents {
    // Exactly as many parts as the answer has: a cached resource keeps this
    // vector for its whole life, and growth would leave 4 slots for one part.
    let mut out = Contents { parts: Vec::with_capacity(contents.len()), ..Contents::default() };
    let mut left = max_bytes;
    for c in contents {
        match c {
            ResourceContents::TextResourceContents { mut text, mime_type, meta, .. } => {
                // Cut already while it arrived (an answer too large to hold).
                out.truncated_bytes += crate::large::marks(meta.as_ref()).0;
                if text.len() > left {
                    let mut cut = left;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    out.truncated_bytes += text.len() - cut;
                    text.truncate(cut);
                    left = 0;
                } else {
                    left -= text.len();
                }
                out.parts.push(ContentPart::Text { text, mime_type });
            }
            ResourceContents::BlobResourceContents { blob, mime_type, meta, .. } => {
                let base64_len = crate::large::marks(meta.as_ref()).1.unwrap_or(blob.len());
                out.parts.push(ContentPart::Blob { mime_type, base64_len });
            }
            _ => {}
        }
    }
    out
}

pub(super) fn scrub_error(cfg: &ServerConfig, e: Error) -> Error {
    match e {
        Error::Server { server, what, code, message } => {
            Error::Server { server, what, code, message: cfg.scrub(&message) }
        }
        Error::Protocol { server, what, message } => Error::Protocol { server, what, message: cfg.scrub(&message) },
        other => other,
    }
}

pub(super) fn map_service_error(e: ServiceError, server: &str, what: &str, id: Option<&ResourceId>) -> Error {
    match e {
        // Our transport's own verdict on an over-long answer, not the server's.
        ServiceError::McpError(d) if d.code.0 == crate::large::TOO_LARGE => {
            Error::Protocol { server: server.to_owned(), what: what.to_owned(), message: d.message.to_string() }
        }
        ServiceError::McpError(d)
            if id.is_some() && (d.code == ErrorCode::RESOURCE_NOT_FOUND || d.code == ErrorCode::INVALID_PARAMS) =>
        {
            Error::NotFound { id: id.map(ToString::to_string).unwrap_or_default() }
        }
        ServiceError::McpError(d) => Error::Server {
            server: server.to_owned(),
            what: what.to_owned(),
            code: d.code.0,
            message: d.message.chars().take(500).collect(),
        },
        ServiceError::TransportClosed => Error::TransportClosed { server: server.to_owned(), what: what.to_owned() },
        ServiceError::Timeout { timeout } => {
            Error::Timeout { server: server.to_owned(), what: what.to_owned(), after_ms: timeout.as_millis() as u64 }
        }
        ServiceError::TransportSend(e) => {
            Error::Protocol { server: server.to_owned(), what: what.to_owned(), message: crate::cause::http_cause(&e) }
        }
        other => Error::Protocol { server: server.to_owned(), what: what.to_owned(), message: other.to_string() },
    }
}

/// Why an HTTP handshake failed: the transport's cause in words, else rmcp's text.
pub(super) fn init_cause(e: &rmcp::service::ClientInitializeError) -> String {
    match e {
        rmcp::service::ClientInitializeError::TransportError { error, .. } => crate::cause::http_cause(error),
        // `auto`: `server/discover` failed in a way that looks legacy (an
        // HTTP 404 does), and so did `initialize`: the latter says why.
        rmcp::service::ClientInitializeError::LegacyFallbackFailed { fallback, .. } => init_cause(fallback),
        other => crate::cause::one_line(&other.to_string(), 300),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_text_at_char_boundary() {
        let c = convert_contents(vec![ResourceContents::text("héllo", "u"), ResourceContents::text("more", "u")], 2);
        assert_eq!(c.parts.len(), 2);
        assert_eq!(c.parts[0], ContentPart::Text { text: "h".into(), mime_type: Some("text/plain".into()) });
        // Once the cap is hit nothing more is kept: "éllo" and "more" are cut.
        assert_eq!(c.parts[1], ContentPart::Text { text: "".into(), mime_type: Some("text/plain".into()) });
        assert_eq!(c.truncated_bytes, 9);
    }
}
