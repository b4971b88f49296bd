//! Our own view of MCP resources. No rmcp type crosses the public API: these
//! are converted from the wire types in `hub` and are all the rest of the
//! pipeline ever sees.
//!
//! Layer: bottom. Imports only `id`.

use std::time::SystemTime;

use serde::Serialize;

use crate::id::ResourceId;

/// Who a resource is meant for (`annotations.audience`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Audience {
    /// The human user.
    User,
    /// The model.
    Assistant,
}

/// The MCP annotations we act on.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Annotations {
    /// Intended audience; `None` means everyone.
    pub audience: Option<Vec<Audience>>,
    /// 0.0 (least) to 1.0 (most important).
    pub priority: Option<f32>,
    /// ISO 8601 timestamp, as the server sent it.
    pub last_modified: Option<String>,
}

/// One listed resource. Built with [`Resource::new`] and the `with_*`
/// setters (`#[non_exhaustive]`: fields may be added).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Resource {
    /// `server:uri`.
    pub id: ResourceId,
    /// Programmatic name.
    pub name: String,
    /// Human-readable title.
    pub title: Option<String>,
    /// Description.
    pub description: Option<String>,
    /// MIME type from the listing.
    pub mime_type: Option<String>,
    /// Size in bytes, if the server gave it.
    pub size: Option<u64>,
    /// Annotations.
    pub annotations: Annotations,
    /// When we saw it in a listing (or, for policy includes, when we first read it).
    #[serde(skip)]
    pub discovered_at: SystemTime,
}

impl Resource {
    /// A resource with only its id (its name is the URI); the `with_*`
    /// setters give the rest, e.g. to build a listing in a test or an
    /// application's own adapter.
    pub fn new(id: ResourceId) -> Self {
        Self::unlisted(id)
    }

    /// With this MIME type.
    pub fn with_mime_type(mut self, mime: impl Into<String>) -> Self {
        self.mime_type = Some(mime.into());
        self
    }

    /// With this programmatic name (the URI by default).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// With this size in bytes, as a listing gives it.
    pub fn with_size(mut self, size: u64) -> Self {
        self.size = Some(size);
        self
    }

    /// With this title.
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// With this description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// With this `annotations.priority` (0.0 to 1.0).
    pub fn with_priority(mut self, priority: f32) -> Self {
        self.annotations.priority = Some(priority);
        self
    }

    /// With this `annotations.audience`.
    pub fn with_audience(mut self, audience: Vec<Audience>) -> Self {
        self.annotations.audience = Some(audience);
        self
    }

    /// A resource known only by id (e.g. a policy `include` that no listing shows).
    pub fn unlisted(id: ResourceId) -> Self {
        let name = id.uri.clone();
        Self {
            id,
            name,
            title: None,
            description: None,
            mime_type: None,
            size: None,
            annotations: Annotations::default(),
            discovered_at: SystemTime::now(),
        }
    }

    /// True when `annotations.audience` names only `user`: not for the model.
    pub fn is_user_only(&self) -> bool {
        matches!(&self.annotations.audience, Some(a) if !a.is_empty() && a.iter().all(|r| *r == Audience::User))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_built_by_its_setters() {
        let r = Resource::new(ResourceId::from_listing("s", "fx://a"))
            .with_mime_type("text/plain")
            .with_title("A")
            .with_description("about a")
            .with_priority(0.5)
            .with_audience(vec![Audience::User]);
        assert_eq!(
            (r.name.as_str(), r.mime_type.as_deref(), r.title.as_deref()),
            ("fx://a", Some("text/plain"), Some("A"))
        );
        assert_eq!((r.description.as_deref(), r.annotations.priority), (Some("about a"), Some(0.5)));
        assert!(r.is_user_only());
    }
}

/// A resource template (`resources/templates/list`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ResourceTemplate {
    /// Server name.
    pub server: String,
    /// RFC 6570 URI template.
    pub uri_template: String,
    /// Name.
    pub name: String,
    /// Title.
    pub title: Option<String>,
    /// Description.
    pub description: Option<String>,
    /// MIME type of every expansion.
    pub mime_type: Option<String>,
    /// Annotations of every expansion.
    pub annotations: Annotations,
}

/// One part of a read result. Serialisable so that the shared cache can
/// keep it in Redis.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum ContentPart {
    /// Text content.
    Text {
        /// The text.
        text: String,
        /// The part's MIME type.
        mime_type: Option<String>,
    },
    /// Binary content. The bytes are never kept: only what the placeholder needs.
    Blob {
        /// The part's MIME type.
        mime_type: Option<String>,
        /// Length of the base64 payload as received.
        base64_len: usize,
    },
}

/// What `resources/read` returned for one resource. Built with
/// [`Contents::new`] or [`Contents::text`] (`#[non_exhaustive]`: fields may
/// be added).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Contents {
    /// The parts, in the server's order.
    pub parts: Vec<ContentPart>,
    /// Text bytes cut off because the resource exceeded `max_resource_bytes`.
    pub truncated_bytes: usize,
    /// The server's cache hint `ttlMs`, if it sent one.
    pub ttl_ms: Option<u64>,
    /// The server's cache hint `cacheScope: private`: never share across users.
    pub private: bool,
}

impl Contents {
    /// These parts, in order, with no truncation and no cache hints.
    pub fn new(parts: Vec<ContentPart>) -> Self {
        Self { parts, ..Self::default() }
    }

    /// One text part of this MIME type.
    pub fn text(text: impl Into<String>, mime_type: Option<&str>) -> Self {
        Self::new(vec![ContentPart::Text { text: text.into(), mime_type: mime_type.map(str::to_owned) }])
    }
}
