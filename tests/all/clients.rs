//! The verified client list (docs/src/clients.md), driven for real: the pinned Python clients
//! (tests/python-clients: openai, openai-agents, langchain-openai, litellm, pydantic-ai, llama-index-llms-openai,
//! anthropic) and Node clients (tests/node/clients.mjs: openai, the AI SDK with @ai-sdk/openai and
//! @ai-sdk/anthropic, @anthropic-ai/sdk)
//! through the real `serve`, in front of the recording OpenAI upstream and the Messages stand-in. Per client: the
//! plain and the streamed answer arrive whole; each request carries its own user's context (alice's or bob's, once,
//! first in `messages` or last in `system`), the operator's upstream key, and the client's tool as it sent it.
//! (serve.rs and messages.rs test the official packages further: the Responses API, `count_tokens`, the 401s;
//! messages.rs runs Claude Code.) May import: common, serve (the upstream, the proxy), messages (the stand-in, our block).

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Value, json};

use crate::common::*;
use crate::messages::{OPERATOR_KEY, Stand, our_block};
use crate::serve::{Proxy, Upstream, keys_yaml};

const USERS: [&str; 2] = ["alice", "bob"];
const MODES: [&str; 2] = ["plain", "stream"];

/// A proxy in front of both stand-ins, with `key-alice` and `key-bob`.
async fn proxy(up: &Upstream, stand: &Stand) -> Proxy {
    let serve = format!(
        "  upstream_api_key: sk-upstream-1\n{}  anthropic:\n    upstream: {}\n    api_key: {OPERATOR_KEY}\n",
        keys_yaml(),
        stand.base
    );
    Proxy::start(&serve, &up.base).await
}

/// The `[client user mode]` tag a prompt starts with, from a request's last user turn (a string or text blocks).
fn tag_of(messages: &Value) -> (String, String, String) {
    let turn = messages.as_array().unwrap().iter().rev().find(|m| m["role"] == "user").expect("a user turn");
    let text = match &turn["content"] {
        Value::String(s) => s.clone(),
        blocks => blocks.as_array().unwrap().iter().filter_map(|b| b["text"].as_str()).collect(),
    };
    let inner = text.strip_prefix('[').and_then(|t| t.split_once(']')).map(|(t, _)| t).unwrap_or_default();
    let mut parts = inner.split(' ').map(str::to_owned);
    let tag = (parts.next(), parts.next(), parts.next());
    match tag {
        (Some(c), Some(u), Some(m)) => (c, u, m),
        _ => panic!("no [client user mode] tag in {text:?}"),
    }
}

/// Every (client, user, mode) the scripts run, for these clients.
fn expected_runs(clients: &[&str]) -> BTreeSet<(String, String, String)> {
    let mut all = BTreeSet::new();
    for c in clients {
        for u in USERS {
            for m in MODES {
                all.insert((c.to_string(), u.to_owned(), m.to_owned()));
            }
        }
    }
    all
}

/// The scripts' answers: every client, user and mode got the stand-in's whole answer.
fn check_answers(stdout: &[u8], clients: &[&str], answer: &str) {
    let out: Value = serde_json::from_slice(stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(stdout)));
    for c in clients {
        for u in USERS {
            assert_eq!(out[c][u], json!({"plain": answer, "stream": answer}), "{c} as {u}: {out}");
        }
    }
}

/// The chat requests the upstream received: one per client, user and mode, each with its user's context.
fn check_chat_requests(up: &Upstream, proxy: &Proxy, clients: &[&str]) {
    let contexts: Vec<(String, String)> = USERS.iter().map(|u| (u.to_string(), proxy.preview(u).unwrap())).collect();
    assert_ne!(contexts[0].1, contexts[1].1, "alice and bob see different resources");
    let mut runs = BTreeSet::new();
    for seen in up.seen() {
        assert_eq!(seen.path, "/v1/chat/completions", "{seen:?}");
        let (client, user, mode) = tag_of(&seen.body["messages"]);
        let ours = &contexts.iter().find(|(u, _)| *u == user).unwrap().1;
        let messages = seen.body["messages"].as_array().unwrap();
        assert_eq!(messages[0], json!({"role": "system", "content": ours, "name": "mcp_context"}), "{client} {user}");
        assert_eq!(messages.iter().filter(|m| m["name"] == "mcp_context").count(), 1, "{client}: ours once");
        let tool = &seen.body["tools"][0]["function"];
        assert_eq!(tool["name"], "get_weather", "{client}: the client's tool, as it sent it");
        assert_eq!(tool["parameters"]["properties"]["city"]["type"], "string", "{client}: {tool}");
        assert_eq!(seen.headers["authorization"], "Bearer sk-upstream-1", "{client}: the operator's key");
        assert_eq!(seen.body["stream"] == true, mode == "stream", "{client} {mode}");
        assert!(runs.insert((client, user, mode)), "one request per client, user and mode");
    }
    assert_eq!(runs, expected_runs(clients));
}

/// The Python of target/py-clients (tests/python-clients/requirements.txt, installed by .ci/run).
fn python_clients() -> Option<std::path::PathBuf> {
    let python = Path::new(ROOT).join("target/py-clients/bin/python");
    let probe = "import agents, anthropic, langchain_openai, litellm, pydantic_ai, llama_index.llms.openai";
    let ok = std::process::Command::new(&python).args(["-c", probe]).output().is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

#[tokio::test]
async fn the_python_client_libraries_get_each_users_context_through_serve() {
    let test = "the_python_client_libraries_get_each_users_context_through_serve";
    let Some(python) = python_clients() else {
        return skip(test, "no target/py-clients venv (.ci/run installs tests/python-clients/requirements.txt)");
    };
    let clients = ["openai", "openai-agents", "langchain-openai", "litellm", "pydantic-ai", "llama-index"];
    let up = Upstream::start().await;
    let stand = Stand::start().await;
    let proxy = proxy(&up, &stand).await;
    // Offline: llama-index looks for NLTK data (and would download it) and litellm for its model cost map.
    let nltk = tempfile::tempdir().unwrap();
    for d in ["tokenizers/punkt", "corpora/stopwords"] {
        std::fs::create_dir_all(nltk.path().join(d)).unwrap();
    }
    let out = tokio::process::Command::new(python)
        .arg(Path::new(ROOT).join("tests/python-clients/clients.py"))
        .arg(&proxy.url)
        .env("NLTK_DATA", nltk.path())
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_answers(&out.stdout, &clients, crate::serve::ANSWER);
    check_answers(&out.stdout, &["anthropic"], crate::messages::ANSWER);
    check_chat_requests(&up, &proxy, &clients);
    check_messages_requests(&stand, &proxy, &["anthropic"]);
}

#[tokio::test]
async fn the_node_client_libraries_get_each_users_context_through_serve() {
    let test = "the_node_client_libraries_get_each_users_context_through_serve";
    let modules = Path::new(ROOT).join("tests/node/node_modules");
    let node_ok = std::process::Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if !node_ok
        || !["ai", "@ai-sdk/openai", "@ai-sdk/anthropic", "@anthropic-ai/sdk"].iter().all(|m| modules.join(m).exists())
    {
        return skip(test, "node or the clients in tests/node/node_modules missing (`npm ci --prefix tests/node`)");
    }
    let up = Upstream::start().await;
    let stand = Stand::start().await;
    let proxy = proxy(&up, &stand).await;
    let out = tokio::process::Command::new("node")
        .arg(Path::new(ROOT).join("tests/node/clients.mjs"))
        .arg(&proxy.url)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_answers(&out.stdout, &["openai", "ai-sdk-openai"], crate::serve::ANSWER);
    check_answers(&out.stdout, &["ai-sdk-anthropic", "anthropic-sdk"], crate::messages::ANSWER);
    check_chat_requests(&up, &proxy, &["openai", "ai-sdk-openai"]);

    check_messages_requests(&stand, &proxy, &["ai-sdk-anthropic", "anthropic-sdk"]);
}

/// The Messages API requests the stand-in received: one per client, user and mode, each with its user's block.
fn check_messages_requests(stand: &Stand, proxy: &Proxy, clients: &[&str]) {
    let blocks: Vec<(String, Value)> = USERS.iter().map(|u| (u.to_string(), our_block(proxy, u))).collect();
    let mut runs = BTreeSet::new();
    for got in stand.messages() {
        let (client, user, mode) = tag_of(&got.body["messages"]);
        let ours = &blocks.iter().find(|(u, _)| *u == user).unwrap().1;
        let system = got.body["system"].as_array().unwrap_or_else(|| panic!("{client}: {}", got.body));
        assert_eq!(system.last().unwrap(), ours, "{client} {user}: our block last in system");
        let tool = &got.body["tools"][0];
        assert_eq!(tool["name"], "get_weather", "{client}: the client's tool, as it sent it");
        assert_eq!(tool["input_schema"]["properties"]["city"]["type"], "string", "{client}: {tool}");
        assert_eq!(got.headers["x-api-key"], OPERATOR_KEY, "{client}: the operator's key");
        assert!(!got.headers.contains_key("authorization"), "{client}: the caller's key stays here");
        assert_eq!(got.body["stream"] == true, mode == "stream", "{client} {mode}");
        assert!(runs.insert((client, user, mode)), "one request per client, user and mode");
    }
    assert_eq!(runs, expected_runs(clients));
}
