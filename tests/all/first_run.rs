//! Issue 49 item 4, no silent traps on the first run of `mcp-context
//! serve` (the real binary, the demo server, a recording upstream): the
//! upstream key from `$OPENAI_API_KEY` / `$ANTHROPIC_API_KEY` and a line
//! saying so (never the key, never the caller's); no start without a way
//! to identify callers (the bundled config included); a 404 naming the base
//! URL expected, in the route family's shape; the unknown-model warning
//! without `-v`; the demo's cache hints making a second request warm.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;
use crate::serve::{Proxy, Upstream, chat_body, http, keys_yaml};

/// A `serve` of `body` (a whole config, next to a copy of the demo
/// policies) with `env` set and no log filter (what an operator sees
/// without `-v`), nor upstream keys but those in `env`.
pub(crate) async fn serve(body: &str, upstream: &str, env: &[(&str, &str)]) -> Proxy {
    let mut vars: Vec<(&str, Option<&str>)> =
        vec![("MCP_CONTEXT_LOG", None), ("OPENAI_API_KEY", None), ("ANTHROPIC_API_KEY", None)];
    vars.extend(env.iter().map(|(k, v)| (*k, Some(*v))));
    Proxy::start_config_env(body, upstream, tag(), &[], &vars).await
}

/// The demo server (protocol `auto`, as the bundled config has it), the demo policy, caller keys.
fn config_with(serve_extra: &str) -> String {
    format!(
        "servers:\n  demo:\n    command: {MCP_CONTEXT:?}\n    args: [demo-server]\npolicy: policies/\ncontext:\n  \
         max_tokens: 4000\nserve:\n{}{serve_extra}",
        keys_yaml()
    )
}

/// Without `serve.upstream_api_key`, the chat upstream gets `$OPENAI_API_KEY`
/// and the Messages upstream `$ANTHROPIC_API_KEY`, never the caller's own
/// key; stderr says where each comes from (without -v), never the key.
#[tokio::test]
async fn serve_takes_the_upstream_keys_from_the_environment_and_says_so() {
    let up = Upstream::start().await;
    let extra = format!("  anthropic:\n    upstream: {}\n", up.base);
    let env = [("OPENAI_API_KEY", "sk-env-0penai"), ("ANTHROPIC_API_KEY", "ak-env-anthr0pic")];
    let proxy = serve(&config_with(&extra), &up.base, &env).await;
    let r = proxy.post("/v1/chat/completions", Some("key-bob"), &chat_body("hi")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = http()
        .post(format!("{}/v1/messages", proxy.url))
        .header("x-api-key", "key-bob")
        .json(&json!({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    drop(r);
    let seen = up.seen();
    let chat = seen.iter().find(|s| s.path.ends_with("/chat/completions")).expect("the chat request went upstream");
    assert_eq!(chat.headers.get("authorization").map(String::as_str), Some("Bearer sk-env-0penai"));
    let messages = seen.iter().find(|s| s.path.ends_with("/messages")).expect("the Messages request went upstream");
    assert_eq!(messages.headers.get("x-api-key").map(String::as_str), Some("ak-env-anthr0pic"));
    assert!(!messages.headers.contains_key("authorization"), "{:?}", messages.headers);
    for s in &seen {
        assert!(!s.headers.values().any(|v| v.contains("key-bob")), "the caller's key went upstream: {s:?}");
    }
    let err = proxy.stderr();
    assert!(err.contains("mcp-context serve: upstream key: $OPENAI_API_KEY"), "{err}");
    assert!(err.contains("mcp-context serve: Messages API upstream key: $ANTHROPIC_API_KEY"), "{err}");
    assert!(!err.contains("sk-env-0penai") && !err.contains("ak-env-anthr0pic"), "a key was printed: {err}");
}

/// With no key anywhere, the line says so: requests go upstream without
/// `Authorization`, and the caller's key is still not passed on.
#[tokio::test]
async fn serve_without_any_upstream_key_says_none_and_forwards_nothing() {
    let up = Upstream::start().await;
    let proxy = serve(&config_with(""), &up.base, &[]).await;
    let r = proxy.post("/v1/chat/completions", Some("key-bob"), &chat_body("hi")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(!up.seen()[0].headers.contains_key("authorization"), "{:?}", up.seen()[0].headers);
    let err = proxy.stderr();
    assert!(err.contains("upstream key: none: neither serve.upstream_api_key nor $OPENAI_API_KEY is set"), "{err}");
}

/// A `serve` that could only answer 401 refuses to start, naming the ways
/// to identify callers: a config without them, and the bundled
/// `mcp-context.yaml` as a fresh clone has it.
#[tokio::test]
async fn serve_with_no_way_to_identify_callers_refuses_to_start() {
    let (_dir, path) = temp_config("servers: {}\nserve:\n  upstream_api_key: sk-1\n");
    for config in [path, PathBuf::from(ROOT).join("mcp-context.yaml")] {
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::process::Command::new(MCP_CONTEXT)
                .args(["serve", "--listen", "127.0.0.1:0", "--config"])
                .arg(&config)
                .stdin(Stdio::null())
                .output(),
        )
        .await
        .expect("serve stopped at once")
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", config.display());
        assert!(err.contains(&config.display().to_string()) && err.contains("every request would be answered 401"));
        for way in ["serve.keys", "serve.jwt", "serve.user_header", "serve.user_from_body", "serve.anonymous_user"] {
            assert!(err.contains(way), "{way}: {err}");
        }
        assert!(err.contains("mcp-context serve hash-key"), "{err}");
        assert!(out.stdout.is_empty(), "it never listened");
    }
}

/// A path that looks like a misplaced base URL gets a 404 naming the path,
/// the one meant and the base URL to give the client, OpenAI-shaped for
/// OpenAI-looking paths and Anthropic-shaped for `messages`; nothing is
/// relayed. A forged `Host` is not echoed unless it is a plain host name.
#[tokio::test]
async fn misplaced_base_urls_get_a_404_naming_the_base_expected() {
    let up = Upstream::start().await;
    let proxy = serve(&config_with("  anthropic:\n    upstream: http://127.0.0.1:9/v1\n"), &up.base, &[]).await;
    let origin = proxy.url.clone();
    let c = http();
    for (path, meant) in [
        ("/chat/completions", "/v1/chat/completions"),
        ("/v1/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/chat/completion", "/v1/chat/completions"),
        ("/responses", "/v1/responses"),
    ] {
        let r = c.post(format!("{origin}{path}")).bearer_auth("key-bob").json(&chat_body("hi")).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let v: Value = r.json().await.unwrap();
        let m = v["error"]["message"].as_str().unwrap_or_else(|| panic!("{path}: OpenAI-shaped: {v}"));
        assert_eq!(v["error"]["code"], "unknown_url", "{v}");
        assert!(m.contains(&format!("`{path}`")) && m.contains(&format!("did you mean `{meant}`")), "{m}");
        assert!(m.contains(&format!("`{origin}/v1`")), "{m}");
    }
    for (path, meant) in [("/messages", "/v1/messages"), ("/v1/v1/messages", "/v1/messages")] {
        let r = c.post(format!("{origin}{path}")).header("x-api-key", "key-bob").json(&json!({})).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error", "{path}: Anthropic-shaped: {v}");
        assert_eq!(v["error"]["type"], "not_found_error", "{v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(&format!("did you mean `{meant}`")) && m.contains(&format!("`{origin}` (without `/v1`")));
    }
    // Our own spelling of an endpoint the proxy does not open keeps the generic answer.
    let r = c.post(format!("{origin}/v1/files")).bearer_auth("key-bob").json(&json!({})).send().await.unwrap();
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().starts_with("Unknown endpoint"), "{v}");
    // A forged Host with a quote or a space is not written into the message.
    let (status, _, body) = crate::attack::raw_http(
        &proxy.url,
        "POST /chat/completions HTTP/1.1\nHost: evil\"host\nContent-Length: 0\nConnection: close\n\n",
        b"",
    )
    .await;
    assert_eq!(status, 404);
    assert!(!body.contains("evil") && body.contains("http://HOST:PORT/v1"), "{body}");
    assert!(up.seen().is_empty(), "nothing was relayed: {:?}", up.seen());
}

/// A request for a model tiktoken does not know is counted with o200k_base,
/// and the operator is told so without `-v`, once.
#[tokio::test]
async fn the_unknown_model_fallback_warns_without_verbose() {
    let up = Upstream::start().await;
    let proxy = serve(&config_with(""), &up.base, &[]).await;
    for _ in 0..2 {
        let body = json!({"model": "my-local-llm", "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(proxy.post("/v1/chat/completions", Some("key-bob"), &body).send().await.unwrap().status(), 200);
    }
    let err = proxy.stderr();
    let warned = err.lines().filter(|l| l.contains("unknown model `my-local-llm`") && l.contains("o200k_base"));
    assert_eq!(warned.count(), 1, "{err}");
}

/// The demo server's read answers carry cache hints (`ttlMs`, public), so
/// a second request for the same user is answered from the cache: the warm
/// path, counted in `/metrics`.
#[tokio::test]
async fn the_demo_servers_cache_hints_make_a_second_request_warm() {
    let up = Upstream::start().await;
    let proxy = serve(&config_with(""), &up.base, &[]).await;
    let hits = async || {
        let m = http().get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
        let line = m.lines().find(|l| l.starts_with("mcp_context_cache_hits_total")).unwrap_or_else(|| panic!("{m}"));
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap()
    };
    for _ in 0..2 {
        let r = proxy.post("/v1/chat/completions", Some("key-alice"), &chat_body("hi")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    assert!(hits().await >= 1.0, "the second request read everything again: {}", proxy.stderr());
}
