//! `ContextClient`: async-openai's chat client with the context injected
//! into every call, in the spirit of reqwest-middleware: same calls, one
//! extra argument (the user), and the [`Report`] next to the answer.
//!
//! Layer: adapters. Imports the orchestrator (`context`), `tools`, `report`, `error`.

use std::sync::Arc;

use async_openai::Client;
use async_openai::config::Config as OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionResponseStream, CreateChatCompletionRequest, CreateChatCompletionResponse,
};

use crate::context::{ContextRequest, McpContext};
use crate::error::{Error, Result};
use crate::report::Report;

/// A chat-completions client that prepends the user's MCP context to every
/// request. Works against any OpenAI-compatible endpoint the wrapped client
/// points at (`OPENAI_BASE_URL`, `OPENAI_API_KEY`).
pub struct ContextClient<C: OpenAIConfig> {
    client: Client<C>,
    context: Arc<McpContext>,
}

impl<C: OpenAIConfig> ContextClient<C> {
    /// Wraps `client`.
    pub fn new(client: Client<C>, context: Arc<McpContext>) -> Self {
        Self { client, context }
    }

    /// The wrapped client, for calls that need no context.
    pub fn inner(&self) -> &Client<C> {
        &self.client
    }

    /// The context engine.
    pub fn context(&self) -> &Arc<McpContext> {
        &self.context
    }

    /// `chat().create` with the context injected; `req` is a user name or a
    /// [`ContextRequest`] with a selection or overrides.
    pub async fn create(
        &self,
        request: CreateChatCompletionRequest,
        req: impl Into<ContextRequest>,
    ) -> Result<(CreateChatCompletionResponse, Report)> {
        let (mut request, report) = self.context.inject(request, req).await?;
        request.stream = None;
        let response = self.client.chat().create(request).await.map_err(Error::from)?;
        Ok((response, report))
    }

    /// `chat().create_stream` with the context injected. Sets `stream: true`
    /// explicitly (async-openai's `byot` feature stops doing it).
    pub async fn create_stream(
        &self,
        request: CreateChatCompletionRequest,
        req: impl Into<ContextRequest>,
    ) -> Result<(ChatCompletionResponseStream, Report)> {
        let (mut request, report) = self.context.inject(request, req).await?;
        request.stream = Some(true);
        let stream = self.client.chat().create_stream(request).await.map_err(Error::from)?;
        Ok((stream, report))
    }
}

/// What [`ContextClient::create_with_tools`] did.
#[derive(Debug)]
pub struct ToolLoop {
    /// The model's last answer (no calls to our tools left, or the bound hit).
    pub response: CreateChatCompletionResponse,
    /// Messages the loop added after the request's own: each assistant
    /// message with `tool_calls` followed by its `tool` results. Append them
    /// (and the final answer) to the conversation.
    pub messages: Vec<async_openai::types::chat::ChatCompletionRequestMessage>,
    /// Every tool result, in order.
    pub tool_results: Vec<crate::tools::ToolResult>,
    /// Rounds of tool calls that ran.
    pub rounds: usize,
    /// The injection report (`None` when injection was off).
    pub report: Option<Report>,
}

impl<C: OpenAIConfig> ContextClient<C> {
    /// The tool loop: adds `list_mcp_resources` and `read_mcp_resource` to
    /// the request, calls the model, runs the calls to our tools, calls
    /// again — at most `max_rounds` rounds of tool calls. With `inject`, the
    /// context message is injected once, before the first call, and left
    /// untouched by the tool path. Stops early when the model calls a tool
    /// that is not ours: that is the application's to run.
    pub async fn create_with_tools(
        &self,
        request: CreateChatCompletionRequest,
        req: impl Into<ContextRequest>,
        inject: bool,
        max_rounds: usize,
        mut on_tool: impl FnMut(&crate::tools::ToolResult),
    ) -> Result<ToolLoop> {
        use async_openai::types::chat::{ChatCompletionMessageToolCalls, ChatCompletionRequestAssistantMessage};
        let req = req.into();
        let (mut request, report) = if inject {
            let (r, rep) = self.context.inject(request, &req).await?;
            (r, Some(rep))
        } else {
            (request, None)
        };
        crate::tools::add_tools(&mut request);
        request.stream = None;
        let mut out = ToolLoop {
            response: CreateChatCompletionResponse::default(),
            messages: Vec::new(),
            tool_results: Vec::new(),
            rounds: 0,
            report,
        };
        loop {
            let response = self.client.chat().create(request.clone()).await.map_err(Error::from)?;
            let calls: Vec<ChatCompletionMessageToolCalls> =
                response.choices.first().and_then(|c| c.message.tool_calls.clone()).unwrap_or_default();
            let all_ours = !calls.is_empty()
                && calls.iter().all(|c| {
                    matches!(c, ChatCompletionMessageToolCalls::Function(f) if crate::tools::is_resource_tool(&f.function.name))
                });
            if !all_ours || out.rounds >= max_rounds {
                out.response = response;
                return Ok(out);
            }
            out.rounds += 1;
            #[allow(deprecated)]
            let assistant: async_openai::types::chat::ChatCompletionRequestMessage =
                ChatCompletionRequestAssistantMessage {
                    content: response.choices[0].message.content.clone().map(Into::into),
                    tool_calls: Some(calls.clone()),
                    ..Default::default()
                }
                .into();
            request.messages.push(assistant.clone());
            out.messages.push(assistant);
            let results = self.context.tools().run_calls(&calls, &req.user).await;
            for r in results {
                on_tool(&r);
                request.messages.push(r.message());
                out.messages.push(r.message());
                out.tool_results.push(r);
            }
        }
    }
}
