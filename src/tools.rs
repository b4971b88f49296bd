//! The model-driven path: `list_mcp_resources` and `read_mcp_resource`.
//!
//! Gemini CLI's two resource tools, under the same per-user policy as
//! injection. This path only ever produces `tool` messages; it never touches
//! the system message, and the injection path never produces `tool` messages.
//!
//! A resource the user may not see and a resource that does not exist get
//! the *same* answer, so the model cannot probe for what it may not see; a
//! denied resource is never read. A per-user server (`auth:` per user) is
//! listed and read through the user's own view of it, as in injection.
//!
//! Every `read_mcp_resource` call leaves an audit record when the audit
//! trail is on (route `tool:read_mcp_resource`).
//!
//! Layer: adapters. Imports the orchestrator (`context`), `audit`, `compose`, `tokenize`, `id`, `resource`; it adds
//! `McpContext::tools` here so that the orchestrator does not import its adapters.

use async_openai::types::chat::{
    ChatCompletionMessageToolCalls, ChatCompletionRequestMessage, ChatCompletionRequestToolMessage, ChatCompletionTool,
    ChatCompletionTools, CreateChatCompletionRequest, FunctionObject,
};
use futures::future::join_all;
use serde_json::json;

use crate::audit::ToolRead;
use crate::compose::render_text;
use crate::compose::{cut_to_fit, marker};
use crate::context::McpContext;
use crate::id::ResourceId;
use crate::resource::Resource;
use crate::tokenize::Tokenizer;

/// Name of the listing tool.
pub const LIST_TOOL: &str = "list_mcp_resources";
/// Name of the reading tool.
pub const READ_TOOL: &str = "read_mcp_resource";

/// The two function-tool definitions, with JSON schemas.
pub fn tool_definitions() -> Vec<ChatCompletionTools> {
    vec![
        ChatCompletionTools::Function(ChatCompletionTool {
            function: FunctionObject {
                name: LIST_TOOL.into(),
                description: Some(
                    "Lists the MCP resources available to you, one per line as `- server:uri | name | description`. \
                     Use the `server:uri` part with read_mcp_resource."
                        .into(),
                ),
                parameters: Some(json!({
                    "type": "object",
                    "properties": {
                        "serverName": {"type": "string", "description": "Only list resources of this MCP server."}
                    },
                    "additionalProperties": false
                })),
                strict: None,
            },
        }),
        ChatCompletionTools::Function(ChatCompletionTool {
            function: FunctionObject {
                name: READ_TOOL.into(),
                description: Some("Reads one MCP resource and returns its text.".into()),
                parameters: Some(json!({
                    "type": "object",
                    "properties": {
                        "uri": {"type": "string", "description": "The resource as `server:uri`, exactly as list_mcp_resources shows it."}
                    },
                    "required": ["uri"],
                    "additionalProperties": false
                })),
                strict: None,
            },
        }),
    ]
}

/// Adds the two tools to a request (once; existing tools are kept).
pub fn add_tools(request: &mut CreateChatCompletionRequest) {
    let tools = request.tools.get_or_insert_with(Vec::new);
    for t in tool_definitions() {
        let ChatCompletionTools::Function(f) = &t else { continue };
        let present =
            tools.iter().any(|x| matches!(x, ChatCompletionTools::Function(y) if y.function.name == f.function.name));
        if !present {
            tools.push(t);
        }
    }
}

/// Whether a tool name is one of ours.
pub fn is_resource_tool(name: &str) -> bool {
    name == LIST_TOOL || name == READ_TOOL
}

/// The listing text, as `list_mcp_resources` shows it to the model (names and descriptions on one line,
/// as the reference host writes them). The `list` command prints the same lines with what servers named
/// escaped for a terminal ([`escape`](crate::display::escape)).
pub fn format_listing(resources: &[Resource], server: Option<&str>) -> String {
    let shown: Vec<&Resource> = resources.iter().filter(|r| server.is_none_or(|s| r.id.server == s)).collect();
    if shown.is_empty() {
        return match server {
            Some(s) => format!("No resources found for server: {s}\n"),
            None => "No MCP resources found.\n".into(),
        };
    }
    let mut out = String::from("Available MCP Resources:\n");
    for r in shown {
        out.push_str(&format!("- {}", r.id));
        if !r.name.is_empty() {
            out.push_str(&format!(" | {}", one_line(&r.name)));
        }
        if let Some(d) = r.description.as_deref().filter(|d| !d.is_empty()) {
            out.push_str(&format!(" | {}", one_line(d)));
        }
        out.push('\n');
    }
    out
}

fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// The result of one tool call.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToolResult {
    /// The call's id.
    pub tool_call_id: String,
    /// The tool.
    pub name: String,
    /// What the model gets.
    pub content: String,
    /// Whether `content` is an error for the model.
    pub is_error: bool,
    /// A short line for a UI (e.g. `Listed 4 resources.`).
    pub display: String,
}

impl ToolResult {
    /// The `tool` message to append to the conversation.
    pub fn message(&self) -> ChatCompletionRequestMessage {
        ChatCompletionRequestToolMessage {
            content: self.content.clone().into(),
            tool_call_id: self.tool_call_id.clone(),
        }
        .into()
    }
}

/// The two tools over one [`McpContext`], borrowed: what the model asks for
/// goes through the engine's public path (the gate, the policy, the cache);
/// this type only parses arguments and words the answers.
pub struct ResourceTools<'a> {
    ctx: &'a McpContext,
}

impl<'a> ResourceTools<'a> {
    pub(crate) fn new(ctx: &'a McpContext) -> Self {
        Self { ctx }
    }

    /// Runs the calls in `tool_calls` that belong to our two tools,
    /// concurrently, and returns their results in call order. Calls of other
    /// tools are left to the application.
    pub async fn run_calls(&self, tool_calls: &[ChatCompletionMessageToolCalls], user: &str) -> Vec<ToolResult> {
        let ours = tool_calls.iter().filter_map(|c| match c {
            ChatCompletionMessageToolCalls::Function(f) if is_resource_tool(&f.function.name) => Some(f),
            _ => None,
        });
        join_all(ours.map(|c| self.run(&c.id, &c.function.name, &c.function.arguments, user))).await
    }

    /// Runs one of our tools by name with JSON arguments.
    pub async fn run(&self, call_id: &str, name: &str, arguments: &str, user: &str) -> ToolResult {
        let args: serde_json::Value = if arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(arguments).unwrap_or(serde_json::Value::Null)
        };
        let (content, is_error, display) = match name {
            LIST_TOOL => self.list(&args, user).await,
            READ_TOOL => self.read(&args, user).await,
            other => (format!("Error: unknown tool {other}"), true, "Unknown tool.".into()),
        };
        ToolResult { tool_call_id: call_id.to_owned(), name: name.to_owned(), content, is_error, display }
    }

    async fn list(&self, args: &serde_json::Value, user: &str) -> (String, bool, String) {
        let server = args.get("serverName").and_then(|s| s.as_str()).filter(|s| !s.is_empty());
        let visible = self.ctx.visible_resources(user).await;
        let n = visible.iter().filter(|r| server.is_none_or(|s| r.id.server == s)).count();
        (format_listing(&visible, server), false, format!("Listed {n} resources."))
    }

    async fn read(&self, args: &serde_json::Value, user: &str) -> (String, bool, String) {
        let Some(uri) = args.get("uri").and_then(|u| u.as_str()).filter(|u| !u.trim().is_empty()) else {
            return ("Error: No URI provided.".into(), true, "Invalid parameters.".into());
        };
        let started = std::time::Instant::now();
        let not_found =
            || (format!("Error: Resource not found for URI: {uri}"), true, "Resource not found.".to_string());
        // Refused by the gate, denied by the policy and absent all read the
        // same: the model cannot probe for what it may not see.
        let read = match ResourceId::parse(uri) {
            Ok(requested) => self.ctx.read_for(user, &requested).await,
            Err(_) => Ok(None),
        };
        let settings = self.ctx.settings();
        let (cap, model) = (settings.tool_result_max_tokens, settings.model.clone());
        let (answer, got) = match read {
            Ok(Some((resource, contents))) => {
                let text = render_text(&contents, resource.mime_type.as_deref());
                let cache = self.ctx.token_cache();
                let capped = tokio::task::spawn_blocking(move || cap_tokens(&model, &cache, text, cap)).await;
                match capped {
                    Ok(c) => {
                        let got = (resource.id.to_string(), c.tokens, c.truncated);
                        ((c.text, false, format!("Read {}.", resource.id)), Some(got))
                    }
                    Err(e) => ((format!("Error: Failed to read resource: {e}"), true, "Read failed.".into()), None),
                }
            }
            Ok(None) => (not_found(), None),
            Err(e) => ((format!("Error: Failed to read resource: {e}"), true, "Read failed.".into()), None),
        };
        // The audit trail: what the model got (the SHA-256 of this very text), or a refusal; never the text.
        self.ctx.audit_tool_read(ToolRead {
            user,
            model: &settings.model,
            budget: cap,
            got: got.map(|(id, tokens, truncated)| (id, answer.0.as_str(), tokens, truncated)),
            ms: started.elapsed().as_secs_f64() * 1e3,
        });
        answer
    }
}

/// A tool result cut to its cap: the text, its tokens, and whether it was cut.
struct Capped {
    text: String,
    tokens: usize,
    truncated: bool,
}

/// Cuts a tool result to at most `cap` tokens, marker included, with the
/// packer's own truncation and marker (`[truncated: kept K of N tokens]`).
fn cap_tokens(model: &str, cache: &crate::tokenize::TokenCache, text: String, cap: usize) -> Capped {
    let (tok, _) = Tokenizer::for_model(model);
    let total = cache.count(&tok, &text);
    if total <= cap {
        return Capped { text, tokens: total, truncated: false };
    }
    let text = match cut_to_fit(&tok, "", &text, cap, 0, "") {
        Some(cut) => cut.head,
        // Not even the marker fits: the marker alone says what happened.
        None => marker(0, total),
    };
    Capped { tokens: cache.count(&tok, &text), text, truncated: true }
}

/// The adapter's entry point on the engine (here, so that the orchestrator
/// does not import its adapters).
impl McpContext {
    /// The model-driven tools (`list_mcp_resources`, `read_mcp_resource`)
    /// over this engine.
    pub fn tools(&self) -> ResourceTools<'_> {
        ResourceTools::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Annotations;

    fn res(id: &str, name: &str, desc: Option<&str>) -> Resource {
        let mut r = Resource::unlisted(ResourceId::parse(id).unwrap());
        r.name = name.into();
        r.description = desc.map(Into::into);
        r.annotations = Annotations::default();
        r
    }

    #[test]
    fn listing_text_matches_the_reference_host() {
        let all = vec![
            res("myserver:test://resource1", "Resource 1", Some("A test resource")),
            res("other:x://y", "", None),
            res("other:x://z", "zed", Some("multi\nline")),
        ];
        assert_eq!(
            format_listing(&all, None),
            "Available MCP Resources:\n- myserver:test://resource1 | Resource 1 | A test resource\n- other:x://y\n- other:x://z | zed | multi line\n"
        );
        assert_eq!(
            format_listing(&all, Some("other")),
            "Available MCP Resources:\n- other:x://y\n- other:x://z | zed | multi line\n"
        );
        assert_eq!(format_listing(&all, Some("nope")), "No resources found for server: nope\n");
        assert_eq!(format_listing(&[], None), "No MCP resources found.\n");
    }

    #[test]
    fn definitions_have_schemas() {
        let v = serde_json::to_value(tool_definitions()).unwrap();
        assert_eq!(v[0]["type"], "function");
        assert_eq!(v[0]["function"]["name"], LIST_TOOL);
        assert_eq!(v[1]["function"]["name"], READ_TOOL);
        assert_eq!(v[1]["function"]["parameters"]["required"], serde_json::json!(["uri"]));
        let mut req = async_openai::types::chat::CreateChatCompletionRequest::default();
        add_tools(&mut req);
        add_tools(&mut req);
        assert_eq!(req.tools.as_ref().unwrap().len(), 2);
    }

    #[test]
    fn caps_tool_results_with_the_marker() {
        let cache = crate::tokenize::TokenCache::new();
        let text = "word ".repeat(500);
        let (tok, _) = Tokenizer::for_model("gpt-4o");
        let total = tok.count(&text);
        let capped = cap_tokens("gpt-4o", &cache, text.clone(), 50);
        let out = &capped.text;
        assert!(out.ends_with(&format!(" of {total} tokens]")), "{out}");
        assert!(out.contains("[truncated: kept "), "{out}");
        assert!(tok.count(out) <= 50, "{}", tok.count(out));
        assert_eq!((capped.tokens, capped.truncated), (tok.count(out), true));
        let short = cap_tokens("gpt-4o", &cache, "short".into(), 50);
        assert_eq!((short.text.as_str(), short.tokens, short.truncated), ("short", 1, false));
    }
}
