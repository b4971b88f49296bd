//! `mcp_context::serve` mounted in an application's own axum app: the
//! application keeps its routes and gains the OpenAI-compatible proxy's
//! (`/v1/chat/completions`, `/v1/responses`, `/healthz`, ...).
//!
//! ```text
//! cargo run --example mount_serve -- mcp-context.yaml http://127.0.0.1:9000
//! ```
//!
//! The test `serve::the_proxy_mounts_in_an_applications_own_router` does the
//! same with a real request to a real local upstream.

use std::sync::Arc;

use mcp_context::{Config, McpContext};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let config_path = args.next().unwrap_or_else(|| "mcp-context.yaml".into());
    let upstream = args.next().unwrap_or_else(|| "https://api.openai.com".into());
    let config = Config::load(std::path::Path::new(&config_path))?;
    let ctx = Arc::new(McpContext::from_config(&config).await?);
    let proxy = mcp_context::serve::Proxy::new(ctx.clone(), &config, &upstream)?;
    let app = axum::Router::new()
        .route("/hello", axum::routing::get(|| async { "the application's own route" }))
        .merge(proxy.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8787").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    ctx.close().await;
    Ok(())
}
