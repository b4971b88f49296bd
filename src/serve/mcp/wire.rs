//! Our resources, templates and contents in MCP's wire types (the rmcp
//! model), as the endpoint answers them: each keeps its name, title,
//! description, MIME type, size and annotations (`audience` included), under
//! our URI (`uri.rs`), with the original `(server, uri)` in `_meta`. No
//! rmcp type leaves `serve::mcp`.
//!
//! Imports our resource types, `uri` and the rmcp model.

use rmcp::model::{self as m, ResourceContents};
use serde_json::json;

use super::uri;
use crate::resource::{Annotations, Audience, ContentPart, Contents, Resource, ResourceTemplate};

/// The `_meta` key naming where a resource comes from.
pub(super) const SOURCE_META: &str = "mcp-context/source";

fn annotations(a: &Annotations) -> Option<m::Annotations> {
    if a == &Annotations::default() {
        return None;
    }
    let mut out = m::Annotations::default();
    out.audience = a.audience.as_ref().map(|v| {
        v.iter()
            .map(|r| match r {
                Audience::User => m::Role::User,
                Audience::Assistant => m::Role::Assistant,
            })
            .collect()
    });
    out.priority = a.priority;
    out.last_modified = a.last_modified.clone();
    Some(out)
}

fn source(server: &str, upstream: &str) -> m::MetaObject {
    let mut o = serde_json::Map::new();
    o.insert(SOURCE_META.into(), json!({ "server": server, "uri": upstream }));
    m::MetaObject(o)
}

/// A listed resource under our URI.
pub(super) fn resource(r: &Resource) -> m::Resource {
    let mut w = m::Resource::new(uri::of(&r.id), r.name.clone());
    w.title = r.title.clone();
    w.description = r.description.clone();
    w.mime_type = r.mime_type.clone();
    w.size = r.size;
    w.annotations = annotations(&r.annotations);
    w.meta = Some(source(&r.id.server, &r.id.uri));
    w
}

/// A resource of ours that is no server's (the whole context, a connect link).
pub(super) fn own(uri: String, name: &str, title: &str, description: String) -> m::Resource {
    let mut w = m::Resource::new(uri, name);
    w.title = Some(title.to_owned());
    w.description = Some(description);
    w.mime_type = Some("text/plain".into());
    w
}

/// A template under our URI, when it can be published (see `uri::template`).
pub(super) fn template(t: &ResourceTemplate) -> Option<m::ResourceTemplate> {
    let mut w = m::ResourceTemplate::new(uri::template(&t.server, &t.uri_template)?, t.name.clone());
    w.title = t.title.clone();
    w.description = t.description.clone();
    w.mime_type = t.mime_type.clone();
    w.annotations = annotations(&t.annotations);
    w.meta = Some(source(&t.server, &t.uri_template));
    Some(w)
}

/// The texts a read returns, part by part: a text part as it is, a binary
/// part as the placeholder an injection shows (`[Binary Data (MIME)]`: the
/// bytes are never kept).
pub(super) fn texts(contents: &Contents, listing_mime: Option<&str>) -> Vec<(String, Option<String>)> {
    contents
        .parts
        .iter()
        .map(|p| match p {
            ContentPart::Text { text, mime_type } => {
                (text.clone(), mime_type.clone().or_else(|| listing_mime.map(str::to_owned)))
            }
            ContentPart::Blob { mime_type, .. } => {
                let mime = mime_type.as_deref().or(listing_mime).unwrap_or("application/octet-stream");
                (format!("[Binary Data ({mime})]"), Some("text/plain".to_owned()))
            }
        })
        .collect()
}

/// The answer of a read of `ours`: one text content per part.
pub(super) fn read_result(ours: &str, parts: Vec<(String, Option<String>)>) -> m::ReadResourceResult {
    let contents = parts
        .into_iter()
        .map(|(text, mime)| {
            let c = ResourceContents::text(text, ours);
            match mime {
                Some(mime) => c.with_mime_type(mime),
                None => c,
            }
        })
        .collect();
    m::ReadResourceResult::new(contents)
}
