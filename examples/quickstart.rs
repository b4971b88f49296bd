//! The README's library quick start, as it is printed there (tests/all/docs.rs checks both are the same and runs
//! it against a local upstream): one chat completion through `ContextClient`, alice's context first.
//! Run from the repository root: `OPENAI_BASE_URL=http://127.0.0.1:11434/v1 cargo run --example quickstart`.
//! It serves the demo MCP server too (`quickstart demo-server`), as the config asks.
use async_openai::types::chat::{ChatCompletionRequestUserMessage, CreateChatCompletionRequestArgs};
use mcp_context::{Config, ContextClient, McpContext};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // ./mcp-context.yaml starts its demo server as `${MCP_CONTEXT_EXE} demo-server`: this binary, when run here.
    if std::env::args().nth(1).as_deref() == Some("demo-server") {
        return Ok(mcp_context::demo::serve_stdio().await?);
    }
    // The README's quick start, from here to the end.
    let config = Config::load(&Config::locate(None))?; // ./mcp-context.yaml: the demo server, policies/
    let context = std::sync::Arc::new(McpContext::from_config(&config).await?);
    let client = ContextClient::new(async_openai::Client::new(), context.clone()); // $OPENAI_BASE_URL, $OPENAI_API_KEY
    let question = ChatCompletionRequestUserMessage::from("How do I share a note?");
    let request = CreateChatCompletionRequestArgs::default().model("gpt-4o").messages([question.into()]).build()?;
    let (response, report) = client.create(request, "alice").await?;
    println!("{} tokens of context; {:?}", report.tokens, response.choices[0].message.content);
    context.close().await;
    Ok(())
}
