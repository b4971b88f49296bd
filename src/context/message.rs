//! The composed message ([`ContextMessage`]) and what is worked out from it
//! once however many requests send it: its JSON forms and block digests.
//!
//! Layer: orchestrator (beside `mod.rs`). Imports `mode`, `inject`'s message
//! name and the audit digests; nothing above.

use std::sync::Arc;

use crate::mode::MessageRole;

/// The message to inject.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ContextMessage {
    /// `system` or `developer`.
    pub role: MessageRole,
    /// The text, shared with the engine's memo of recent compositions: an
    /// unchanged request hands out the same message without copying it (a
    /// message with everything in it is as large as all the contents).
    pub content: Arc<String>,
    /// Its exact token count.
    pub tokens: usize,
    /// Worked out from the content once, shared by every copy of it.
    pub(crate) derived: Arc<MessageDerived>,
}

impl PartialEq for ContextMessage {
    fn eq(&self, other: &Self) -> bool {
        (self.role, &self.content, self.tokens) == (other.role, &other.content, other.tokens)
    }
}

/// What is worked out from one composed message at most once, however many
/// requests send it (the composition memo and the warm memo hand out copies
/// sharing this): the message in each JSON form the proxy writes into a
/// forwarded body (escaping a 40 KB message cost more than the rest of the
/// proxy's work on a warm request), and the digests of its blocks for the
/// audit record (hashing it, more than the rest of the record).
#[derive(Debug, Default)]
pub(crate) struct MessageDerived {
    #[cfg(feature = "serve")]
    forms: [std::sync::OnceLock<axum::body::Bytes>; MessageForm::COUNT],
    audited: std::sync::OnceLock<Arc<[crate::audit::AuditResource]>>,
}

/// The JSON forms a message is sent in, each made once per message.
#[cfg(feature = "serve")]
#[derive(Debug, Clone, Copy)]
pub(crate) enum MessageForm {
    /// A chat message `{"role", "content", "name"}`.
    Chat,
    /// An Anthropic `system` text block, without a cache breakpoint.
    SystemBlock,
    /// The same with `cache_control: {"type": "ephemeral"}`.
    SystemBlockCached,
    /// The same with `ttl: "1h"`.
    SystemBlockCachedHour,
    /// A Gemini `systemInstruction` part `{"text"}`, its text fenced.
    GeminiPart,
}

#[cfg(feature = "serve")]
impl MessageForm {
    const COUNT: usize = 5;
}

impl ContextMessage {
    /// The message as `form` (JSON), made by `make` the first time it is
    /// asked for, then shared: every request that sends it puts these very
    /// bytes in its body (a reference, not a copy).
    #[cfg(feature = "serve")]
    pub(crate) fn json_form(
        &self,
        form: MessageForm,
        make: impl FnOnce(&ContextMessage) -> Vec<u8>,
    ) -> axum::body::Bytes {
        self.derived.forms[form as usize].get_or_init(|| make(self).into()).clone()
    }

    /// The chat message `{"role", "content", "name"}` as JSON, made once.
    #[cfg(feature = "serve")]
    pub(crate) fn chat_json(&self) -> axum::body::Bytes {
        self.json_form(MessageForm::Chat, |m| {
            /// Our message, its fields in the order chat messages are usually written.
            #[derive(serde::Serialize)]
            struct Ours<'a> {
                role: MessageRole,
                content: &'a str,
                name: &'a str,
            }
            let ours = Ours { role: m.role, content: &m.content, name: crate::inject::MESSAGE_NAME };
            serde_json::to_vec(&ours).expect("a struct of strings is JSON")
        })
    }

    /// The audit record's list of the resources sent (with the SHA-256 of
    /// each one's block), made once: `report` is the one this message was
    /// composed with (every copy of the message comes with the same
    /// inclusions, since the message is made from them).
    pub(crate) fn audited(&self, report: &crate::Report) -> Arc<[crate::audit::AuditResource]> {
        let make = || crate::audit::included(report, Some(&crate::audit::digests(&self.content)));
        self.derived.audited.get_or_init(make).clone()
    }
}
