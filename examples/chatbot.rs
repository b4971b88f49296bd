//! A terminal chatbot whose every LLM call carries the user's MCP context.
//!
//! ```text
//! cargo run --example chatbot -- [--config PATH] [--user NAME] [--model M] [--dry-run] [--tools|--tools-only]
//! ```
//!
//! Endpoint: `OPENAI_BASE_URL` (default the official API) and `OPENAI_API_KEY`.
//! With neither set it says so and runs in `--dry-run` mode, printing the
//! request it would send. Commands: `/resources`, `/context`, `/user NAME`,
//! `/clear`, `/quit`; `@server:uri` in a message narrows that turn's context.
//! When stdin is not a terminal it reads one message per line and prints
//! answers on stdout, with no prompts (scriptable and testable).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestMessage, ChatCompletionRequestUserMessage,
    CreateChatCompletionRequest, CreateChatCompletionRequestArgs,
};
use futures::StreamExt;
use mcp_context::tools::format_listing;
use mcp_context::{Config, ContextClient, ContextRequest, McpContext, Report, ResourceId};

struct Args {
    config: Option<PathBuf>,
    user: String,
    model: String,
    dry_run: bool,
    tools: bool,
    inject: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a =
        Args { config: None, user: "alice".into(), model: "gpt-4o".into(), dry_run: false, tools: false, inject: true };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--config" => a.config = Some(value("--config")?.into()),
            "--user" => a.user = value("--user")?,
            "--model" => a.model = value("--model")?,
            "--dry-run" => a.dry_run = true,
            "--tools" => a.tools = true,
            "--tools-only" => (a.tools, a.inject) = (true, false),
            "-h" | "--help" => {
                println!("usage: chatbot [--config PATH] [--user NAME] [--model M] [--dry-run] [--tools|--tools-only]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (try --help)")),
        }
    }
    Ok(a)
}

/// Where the chat reads lines from.
enum Input {
    Lines(tokio::io::Lines<tokio::io::BufReader<tokio::io::Stdin>>),
    Editor(Box<rustyline::DefaultEditor>),
}

impl Input {
    async fn next(&mut self, prompt: &str) -> Option<String> {
        match self {
            Input::Lines(lines) => tokio::select! {
                l = lines.next_line() => l.ok().flatten(),
                _ = tokio::signal::ctrl_c() => None,
            },
            Input::Editor(ed) => loop {
                // rustyline blocks; keep it off the runtime's worker threads.
                let p = prompt.to_owned();
                let read = tokio::task::block_in_place(|| ed.readline(&p));
                match read {
                    Ok(l) => {
                        let _ = ed.add_history_entry(l.as_str());
                        return Some(l);
                    }
                    Err(rustyline::error::ReadlineError::Interrupted) => continue,
                    Err(_) => return None,
                }
            },
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    if std::env::args().nth(1).as_deref() == Some("demo-server") {
        // The default config launches the demo MCP server through this binary.
        return match mcp_context::demo::serve_stdio().await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(_) => std::process::ExitCode::FAILURE,
        };
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            // async-openai logs whole error bodies at error level; our error line says it once.
            tracing_subscriber::EnvFilter::try_from_env("MCP_CONTEXT_LOG")
                .unwrap_or_else(|_| "error,async_openai=off".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()))
        .try_init();
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = parse_args()?;
    let interactive = std::io::stdin().is_terminal();
    let base = std::env::var("OPENAI_BASE_URL").ok().filter(|s| !s.is_empty());
    let key = std::env::var("OPENAI_API_KEY").ok().filter(|s| !s.is_empty());
    if base.is_none() && key.is_none() && !args.dry_run {
        eprintln!(
            "note: neither OPENAI_BASE_URL nor OPENAI_API_KEY is set; running in --dry-run mode (requests are printed, not sent)"
        );
        args.dry_run = true;
    }
    let config = Config::load(&Config::locate(args.config.as_deref()))?;
    // Listen before any server is spawned: a signal while they start (or
    // later) then ends the chat through `close()`, leaving no process behind.
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut hup) = (signal(SignalKind::terminate())?, signal(SignalKind::hangup())?);
    let mut int = signal(SignalKind::interrupt())?;
    let context = tokio::select! {
        c = McpContext::from_config(&config) => Arc::new(c?),
        _ = int.recv() => return Err("interrupted while connecting".into()),
        _ = term.recv() => return Err("terminated while connecting".into()),
        _ = hup.recv() => return Err("hung up while connecting".into()),
    };
    drop(int); // from here Ctrl-C stops an answer (or the line input), not the chat
    for f in context.hub().failures() {
        eprintln!("warning: server {} failed: {}", f.server, f.error);
    }
    let mut openai = OpenAIConfig::new();
    if let Some(b) = base {
        openai = openai.with_api_base(b.trim_end_matches('/'));
    }
    let client = ContextClient::new(async_openai::Client::with_config(openai), context.clone());
    let result = tokio::select! {
        r = chat(&client, &mut args, interactive) => r,
        _ = term.recv() => Ok(()),
        _ = hup.recv() => Ok(()),
    };
    context.close().await;
    result
}

async fn chat(
    client: &ContextClient<OpenAIConfig>,
    args: &mut Args,
    interactive: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = client.context().clone();
    let mut input = if interactive {
        println!(
            "mcp-context chatbot: user {}, model {}. /resources /context /user NAME /clear /quit",
            args.user, args.model
        );
        Input::Editor(Box::new(rustyline::DefaultEditor::new()?))
    } else {
        use tokio::io::AsyncBufReadExt;
        Input::Lines(tokio::io::BufReader::new(tokio::io::stdin()).lines())
    };
    let mut history: Vec<ChatCompletionRequestMessage> = Vec::new();
    let mut last_report: Option<Report> = None;
    let out = |s: &str| {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{s}");
        let _ = o.flush();
    };
    while let Some(line) = input.next(&format!("{}> ", args.user)).await {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(cmd) = line.strip_prefix('/') {
            let (name, rest) = cmd.split_once(' ').unwrap_or((cmd, ""));
            match name {
                "quit" | "exit" => break,
                "clear" => {
                    history.clear();
                    out("(conversation cleared)");
                }
                "user" if !rest.trim().is_empty() => {
                    args.user = rest.trim().to_owned();
                    out(&format!("(now chatting as {})", args.user));
                }
                "resources" => out(format_listing(&ctx.visible_resources(&args.user).await, None).trim_end()),
                "context" => match &last_report {
                    Some(r) => out(r.to_string().trim_end()),
                    None => out("(no context injected yet)"),
                },
                _ => out("commands: /resources /context /user NAME /clear /quit"),
            }
            continue;
        }
        // @server:uri mentions narrow this turn's context.
        let mentions: Vec<&str> = line.split_whitespace().filter_map(|w| w.strip_prefix('@')).collect();
        let mut selection = None;
        if !mentions.is_empty() {
            let mut chosen = Vec::new();
            for m in mentions {
                let id = match ResourceId::parse(m) {
                    Ok(id) => allowed_mention(&ctx, &args.user, &id).await,
                    Err(_) => None,
                };
                match id {
                    Some(id) => chosen.push(id),
                    None => out(&format!("(@{m} is not available to {}; left out of the context)", args.user)),
                }
            }
            selection = Some(chosen);
        }
        history.push(ChatCompletionRequestUserMessage::from(line).into());
        let request =
            CreateChatCompletionRequestArgs::default().model(args.model.clone()).messages(history.clone()).build()?;
        let creq = ContextRequest::for_user(args.user.clone()).with_selection(selection);
        // The context is injected here, before the endpoint is called, so
        // `/context` shows what was injected even when the call then fails.
        let injected = if args.inject {
            match ctx.inject(request, &creq).await {
                Ok((request, report)) => {
                    last_report = Some(report);
                    Ok(request)
                }
                Err(e) => Err(one_line(&e.to_string())),
            }
        } else {
            Ok(request)
        };
        let answer = match injected {
            Err(e) => Err(e),
            Ok(request) if args.dry_run => dry_run(request, args.tools),
            Ok(request) if args.tools => with_tools(client, request, &creq, &mut history).await,
            Ok(request) => stream_answer(client, request).await,
        };
        match answer {
            Ok(text) => history.push(ChatCompletionRequestAssistantMessage::from(text.as_str()).into()),
            Err(e) => {
                // The failed turn stays out of the history so the next one is clean.
                history.pop();
                out(&format!("error: {e}"));
            }
        }
    }
    Ok(())
}

/// A mention passes the library's gate for requested URIs, then the policy
/// decides on what the gate admitted (the id that will be read).
async fn allowed_mention(ctx: &McpContext, user: &str, id: &ResourceId) -> Option<ResourceId> {
    let admitted = ctx.admit(user, id).await.ok()?;
    ctx.policy().for_user(user).decide(&admitted.resource).allowed.then(|| admitted.resource.id.clone())
}

/// Streams the answer to stdout as it arrives; Ctrl-C stops this answer only.
/// `request` already carries the context.
async fn stream_answer(
    client: &ContextClient<OpenAIConfig>,
    mut request: CreateChatCompletionRequest,
) -> Result<String, String> {
    let endpoint_error = |e| one_line(&mcp_context::Error::from(e).to_string());
    request.stream = Some(true);
    let mut stream = client.inner().chat().create_stream(request).await.map_err(endpoint_error)?;
    let mut text = String::new();
    let mut stdout = std::io::stdout();
    loop {
        tokio::select! {
            chunk = stream.next() => match chunk {
                None => break,
                Some(Err(e)) => return Err(endpoint_error(e)),
                Some(Ok(c)) => {
                    for choice in c.choices {
                        if let Some(t) = choice.delta.content {
                            text.push_str(&t);
                            let _ = write!(stdout, "{t}");
                            let _ = stdout.flush();
                        }
                    }
                }
            },
            _ = tokio::signal::ctrl_c() => {
                let _ = writeln!(stdout, " [stopped]");
                return Ok(text);
            }
        }
    }
    let _ = writeln!(stdout);
    Ok(text)
}

/// The tool loop on a request that already carries the context (or not,
/// with `--tools-only`): the library adds the tools and runs our calls.
async fn with_tools(
    client: &ContextClient<OpenAIConfig>,
    request: CreateChatCompletionRequest,
    creq: &ContextRequest,
    history: &mut Vec<ChatCompletionRequestMessage>,
) -> Result<String, String> {
    let done = client
        .create_with_tools(request, creq, false, 4, |r| eprintln!("[tool {}] {}", r.name, r.display))
        .await
        .map_err(|e| one_line(&e.to_string()))?;
    history.extend(done.messages);
    let text = done.response.choices.first().and_then(|c| c.message.content.clone()).unwrap_or_default();
    println!("{text}");
    Ok(text)
}

/// Prints the request that would be sent: the context injected (unless
/// `--tools-only`) and, with `--tools`, the tools the model would be offered.
fn dry_run(mut request: CreateChatCompletionRequest, tools: bool) -> Result<String, String> {
    if tools {
        mcp_context::tools::add_tools(&mut request);
    }
    let json = serde_json::to_string_pretty(&request).map_err(|e| e.to_string())?;
    println!("--- request (dry run, not sent) ---\n{json}\n--- end ---");
    Ok("(dry run: nothing was sent)".into())
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
