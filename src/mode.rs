//! The two choices a request's message is made by, named by the settings,
//! the composition, the adapters and the report alike: how resources are
//! chosen ([`SelectMode`]) and which role carries the message
//! ([`MessageRole`]).
//!
//! Bottom layer: imports nothing of this crate.

use serde::{Deserialize, Serialize};

/// How resources are chosen for the message (`context.select`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SelectMode {
    /// `priority` when everything visible fits whole, `relevance` otherwise.
    #[default]
    Auto,
    /// Whole resources by `annotations.priority`; the last one cut to fit.
    Priority,
    /// The chunks that best match the query, by BM25 and priority.
    Relevance,
}

impl std::fmt::Display for SelectMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SelectMode::Auto => "auto",
            SelectMode::Priority => "priority",
            SelectMode::Relevance => "relevance",
        })
    }
}

impl std::str::FromStr for SelectMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(SelectMode::Auto),
            "priority" => Ok(SelectMode::Priority),
            "relevance" => Ok(SelectMode::Relevance),
            _ => Err(format!("unknown selection mode `{s}`: expected auto, priority or relevance")),
        }
    }
}

/// Which message role carries the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MessageRole {
    /// A `system` message (default).
    #[default]
    System,
    /// A `developer` message, for newer OpenAI models.
    Developer,
}

impl std::fmt::Display for MessageRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MessageRole::System => "system",
            MessageRole::Developer => "developer",
        })
    }
}
