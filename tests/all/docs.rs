//! The documentation, executed. Every ```` ```console ```` block of README.md and docs/src/*.md is run (each `$ `
//! line in `sh`, from the repository root, with the built `mcp-context` first on PATH) and its output compared
//! with the block, so output drift fails here with the file and line of the block. The README's library quick
//! start is examples/quickstart.rs, run against a local upstream; its `serve` quick start is run as written on a
//! fresh `git clone` of the repository. May import: common (the binary, `skip`, the chat stand-in) and serve (its
//! recording upstream).
//!
//! A block's syntax is trycmd's, in small: `$ command` (a trailing `\` continues it), then the expected output,
//! stdout and stderr together; a line `...` stands for any number of lines, `[..]` inside a line for any text;
//! a last line `? N` expects exit status N (default 0).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::*;
use crate::serve::{ANSWER, Upstream};

/// One `$ ` command of a console block and the output the documentation shows for it.
#[derive(Debug)]
struct Case {
    /// Where it is written: `README.md:31`.
    at: String,
    command: String,
    expected: Vec<String>,
    status: i32,
}

/// The documentation files whose console blocks are run.
fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut files = vec![root.join("README.md")];
    let mut book: Vec<PathBuf> = std::fs::read_dir(root.join("docs/src"))
        .expect("docs/src exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    book.sort();
    files.extend(book);
    files
}

/// The console blocks of one Markdown text, as cases.
fn console_cases(file: &str, text: &str) -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    let mut in_console = false;
    let mut in_fence = false;
    let mut continued = false;
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            if in_fence {
                in_fence = false;
                in_console = false;
            } else {
                in_fence = true;
                in_console = line.trim() == "```console";
            }
            continue;
        }
        if !in_console {
            continue;
        }
        if continued {
            let case = cases.last_mut().unwrap();
            case.command.push('\n');
            case.command.push_str(line);
            continued = line.ends_with('\\');
        } else if let Some(command) = line.strip_prefix("$ ") {
            cases.push(Case {
                at: format!("{file}:{}", i + 1),
                command: command.to_owned(),
                expected: vec![],
                status: 0,
            });
            continued = command.ends_with('\\');
        } else {
            let case = cases.last_mut().unwrap_or_else(|| panic!("{file}:{}: output before any `$ ` line", i + 1));
            match line.strip_prefix("? ").and_then(|n| n.parse().ok()) {
                Some(status) => case.status = status,
                None => case.expected.push(line.to_owned()),
            }
        }
    }
    cases
}

/// Whether one output line matches one expected line (`[..]`: any text; trailing blanks, which Markdown drops, are
/// not compared).
fn line_matches(expected: &str, actual: &str) -> bool {
    let (expected, actual) = (expected.trim_end(), actual.trim_end());
    let mut parts = expected.split("[..]");
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = actual.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    for (n, part) in parts.iter().enumerate() {
        if n + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Whether the output lines match the expected ones (`...`: any number of lines).
fn lines_match(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e == "..." => (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..])),
        Some((e, rest)) => actual.split_first().is_some_and(|(a, more)| line_matches(e, a) && lines_match(rest, more)),
    }
}

/// A folder holding `mcp-context` (the binary under test), to put first on PATH.
fn bin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(MCP_CONTEXT, dir.path().join("mcp-context")).unwrap();
    dir
}

/// `cargo test` builds the examples next to the test binaries (target/<profile>/examples/).
fn example(name: &str) -> PathBuf {
    let test_exe = std::env::current_exe().unwrap();
    test_exe.parent().unwrap().parent().unwrap().join("examples").join(name)
}

/// A command as the documentation writes it, in `sh`: `cargo run --release --` is the binary on PATH, and the
/// example chatbot the one `cargo test` built. The environment is a reader's fresh shell: no upstream, no config.
fn shell(command: &str, bins: &Path) -> std::process::Command {
    let command = command
        .replace("cargo run --release -- ", "mcp-context ")
        .replace("cargo run -q --example chatbot -- ", &format!("{} ", example("chatbot").display()));
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", &format!("exec 2>&1\n{command}")]).current_dir(ROOT).stdin(Stdio::null());
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("{}:{path}", bins.display())).env("NO_COLOR", "1");
    for var in ["OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "MCP_CONTEXT_CONFIG", "MCP_CONTEXT_LOG"] {
        cmd.env_remove(var);
    }
    cmd
}

#[test]
fn the_matcher_catches_drift() {
    let shown = ["tokens 349/3000  in [..] ms".to_owned()];
    assert!(lines_match(&shown, &["tokens 349/3000  in 6.2 ms"]));
    assert!(!lines_match(&shown, &["tokens 345/3000  in 6.2 ms"]), "a changed count is drift");
    assert!(!lines_match(&shown, &["tokens 349/3000  in 6.2 ms", "an extra line"]), "so is an extra line");
    let elided = ["first".to_owned(), "...".to_owned(), "last".to_owned()];
    assert!(lines_match(&elided, &["first", "a", "b", "last"]));
    assert!(lines_match(&elided, &["first", "last"]));
    assert!(!lines_match(&elided, &["first", "a", "not last"]));
    let cases = console_cases("x.md", "```console\n$ a \\\n  b\nout\n? 1\n```\n```sh\n$ not run\n```\n");
    assert_eq!(cases.len(), 1);
    assert_eq!((cases[0].command.as_str(), cases[0].status, cases[0].at.as_str()), ("a \\\n  b", 1, "x.md:2"));
}

#[test]
fn every_console_block_of_the_readme_and_the_book_prints_what_it_shows() {
    if !example("chatbot").exists() {
        return skip(
            "every_console_block_of_the_readme_and_the_book_prints_what_it_shows",
            "the chatbot example is not built (`cargo test` builds it; a targeted run: `cargo build --example chatbot`)",
        );
    }
    let bins = bin_dir();
    let mut cases = Vec::new();
    for file in doc_files() {
        let name = file.strip_prefix(ROOT).unwrap().to_string_lossy().into_owned();
        cases.extend(console_cases(&name, &std::fs::read_to_string(&file).unwrap()));
    }
    assert!(cases.iter().any(|c| c.at.starts_with("README.md")), "the README's preview is a console block");
    let mut failures = Vec::new();
    for case in &cases {
        let out = shell(&case.command, bins.path()).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let actual: Vec<&str> = text.lines().collect();
        let status = out.status.code().unwrap_or(-1);
        if status != case.status || !lines_match(&case.expected, &actual) {
            failures.push(format!(
                "{}: `{}` (exit {status}, the block says {}) printed:\n{text}\n-- the block shows:\n{}\n",
                case.at,
                case.command,
                case.status,
                case.expected.join("\n")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} documented commands print something else; update the block (or the code):\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The fenced block of `lang` right after the heading that starts with `heading`.
fn block_after(text: &str, heading: &str, lang: &str) -> String {
    let from = text.find(heading).unwrap_or_else(|| panic!("README has no heading {heading:?}"));
    let open = format!("```{lang}\n");
    let start = from + text[from..].find(&open).unwrap() + open.len();
    let len = text[start..].find("```").unwrap();
    text[start..start + len].to_owned()
}

/// Runs `command` (a `serve` line of the docs, in `sh`, on a free port) and waits for the line saying
/// `listening on URL, …` (other start lines may come first): the child and the URL; panics with its stderr if it
/// does not start.
async fn start_serve(mut command: tokio::process::Command, shown: &str) -> (tokio::process::Child, String) {
    let mut child =
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.split("listening on ").nth(1) {
                return Some(rest.split(',').next().unwrap().to_owned());
            }
        }
        None
    });
    let Ok(Some(url)) = listening.await else {
        let mut err = String::new();
        use tokio::io::AsyncReadExt;
        let _ = child.stderr.take().unwrap().read_to_string(&mut err).await;
        panic!("`{shown}` did not start: {err}");
    };
    (child, url)
}

/// What `preview --json` injects for `user` with `config`, run in `dir`.
fn preview(dir: &Path, config: &str, user: &str) -> String {
    let out = std::process::Command::new(MCP_CONTEXT)
        .args(["preview", "--json", "--user", user, "--config", config])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["message"]["content"].as_str().expect("alice sees something").to_owned()
}

#[tokio::test]
async fn the_library_quick_start_is_the_example_and_sends_alices_context_upstream() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let shown = block_after(&readme, "## Quick start: the library", "rust");
    let source = std::fs::read_to_string(Path::new(ROOT).join("examples/quickstart.rs")).unwrap();
    let body: String = source
        .split_once("// The README's quick start, from here to the end.\n")
        .expect("examples/quickstart.rs marks where the README's part starts")
        .1
        .lines()
        .take_while(|l| !l.contains("Ok(())"))
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    assert_eq!(shown, body, "the README's library quick start is examples/quickstart.rs, as it is");

    let exe = example("quickstart");
    if !exe.exists() {
        return skip(
            "the_library_quick_start_is_the_example_and_sends_alices_context_upstream",
            "examples/quickstart is not built (`cargo test` builds it; or `cargo build --example quickstart`)",
        );
    }
    let llm = FakeLlm::start(Reply::Text("Share it from the menu.".into())).await;
    let out = tokio::process::Command::new(&exe)
        .current_dir(ROOT)
        .env("OPENAI_BASE_URL", &llm.base)
        .env("OPENAI_API_KEY", "sk-upstream-1")
        .env_remove("MCP_CONTEXT_CONFIG")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let requests = llm.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    let expected = preview(Path::new(ROOT), "mcp-context.yaml", "alice");
    assert_eq!(
        requests[0]["messages"],
        json!([
            {"role": "system", "content": expected, "name": "mcp_context"},
            {"role": "user", "content": "How do I share a note?"}
        ])
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.ends_with("tokens of context; Some(\"Share it from the menu.\")\n"), "{stdout}");
}

#[tokio::test]
async fn the_serve_quick_start_runs_as_written_on_a_fresh_clone() {
    let test = "the_serve_quick_start_runs_as_written_on_a_fresh_clone";
    let dir = tempfile::tempdir().unwrap();
    let clone = dir.path().join("clone");
    let cloned = std::process::Command::new("git").args(["clone", "--quiet", ROOT]).arg(&clone).output();
    match cloned {
        Ok(o) if o.status.success() => {}
        other => return skip(test, &format!("git clone of the repository failed: {other:?}")),
    }
    let readme = std::fs::read_to_string(clone.join("README.md")).unwrap();
    let script = block_after(&readme, "## Quick start: `serve`", "sh").replace("\\\n", " ");
    let up = Upstream::start().await;
    let bins = bin_dir();
    let path = format!("{}:{}", bins.path().display(), std::env::var("PATH").unwrap_or_default());
    let tag = tag();
    let mut env: Vec<(String, String)> = vec![("PATH".into(), path), ("MCP_TEST_TAG".into(), tag)];
    let mut proxy: Option<(tokio::process::Child, String)> = None;
    let mut answers = Vec::new();
    for line in script.lines().map(|l| l.split(" # ").next().unwrap().trim()).filter(|l| !l.is_empty()) {
        if let Some(assignment) = line.strip_prefix("export ") {
            let (k, v) = assignment.split_once('=').unwrap();
            // The reader's own upstream: here, the local stand-in.
            let v = if k == "OPENAI_BASE_URL" { up.base.clone() } else { v.to_owned() };
            env.push((k.to_owned(), v));
        } else if let Some(background) = line.strip_suffix('&') {
            // Any free port rather than 8787, so that runs side by side do not collide.
            let mut command = tokio::process::Command::new("sh");
            command
                .args(["-c", &format!("exec {background} --listen 127.0.0.1:0")])
                .current_dir(&clone)
                .env_remove("OPENAI_API_KEY")
                .envs(env.iter().cloned());
            proxy = Some(start_serve(command, background).await);
        } else {
            let url = &proxy.as_ref().expect("serve is started first").1;
            let out = tokio::process::Command::new("sh")
                .args(["-c", &line.replace("http://127.0.0.1:8787", url)])
                .current_dir(&clone)
                .envs(env.iter().cloned())
                .output()
                .await
                .unwrap();
            assert!(out.status.success(), "`{line}`: {}", String::from_utf8_lossy(&out.stderr));
            answers.push(String::from_utf8_lossy(&out.stdout).into_owned());
        }
    }
    let (mut child, _) = proxy.expect("the quick start starts serve");
    let answer: Value = serde_json::from_str(answers.last().expect("the quick start asks something")).unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], ANSWER, "{answer}");

    let seen = up.seen();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(seen[0].path, "/v1/chat/completions");
    let expected = preview(&clone, "examples/serve-demo.yaml", "alice");
    assert!(expected.contains("demo://users/alice/profile"), "alice's own profile: {expected}");
    assert_eq!(
        seen[0].body["messages"],
        json!([
            {"role": "system", "content": expected, "name": "mcp_context"},
            {"role": "user", "content": "How do I share a note?"}
        ])
    );
    let auth = seen[0].headers.get("authorization").map(String::as_str);
    assert_ne!(auth, Some("Bearer sk-alice-demo"), "the caller's demo key never goes upstream");
    child.kill().await.unwrap();
}

/// The Claude Code quick start as the README writes it: `serve` on the demo config with the operator's
/// `ANTHROPIC_API_KEY` (the README's `…` filled in, as a reader would), a local Messages API stand-in as
/// `$ANTHROPIC_UPSTREAM`, and Claude Code pointed at it with the README's base URL rule and alice's demo key (run as
/// `claude -p`, the same program without its terminal interface): every turn upstream carries alice's own context as
/// the last `system` block and the operator's key, never alice's.
#[tokio::test]
async fn the_claude_code_quick_start_gives_claude_code_alices_context() {
    let test = "the_claude_code_quick_start_gives_claude_code_alices_context";
    let Some(claude) = crate::messages::claude_code() else {
        return skip(test, crate::messages::NO_CLAUDE_CODE);
    };
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let script = block_after(&readme, "## Quick start: Claude Code", "sh");
    let lines: Vec<&str> =
        script.lines().map(|l| l.split(" # ").next().unwrap().trim()).filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 2, "serve, then claude: {script}");
    let operator = "sk-ant-operator-of-the-quick-start";
    let serve = lines[0].strip_suffix('&').expect("serve runs in the background").trim().replace("sk-ant-…", operator);
    assert!(serve.contains(&format!("ANTHROPIC_API_KEY={operator} mcp-context serve")), "{serve}");
    let stand = crate::messages::Stand::start().await;
    let bins = bin_dir();
    let path = format!("{}:{}", bins.path().display(), std::env::var("PATH").unwrap_or_default());
    let mut command = tokio::process::Command::new("sh");
    command
        .args(["-c", &format!("exec env {serve} --listen 127.0.0.1:0")])
        .current_dir(ROOT)
        .env("PATH", &path)
        .env("ANTHROPIC_UPSTREAM", &stand.base)
        .env("MCP_TEST_TAG", tag())
        .env_remove("OPENAI_API_KEY");
    let (mut child, url) = start_serve(command, &serve).await;
    let words: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(words.last(), Some(&"claude"), "{}", lines[1]);
    assert!(words.contains(&"ANTHROPIC_BASE_URL=http://127.0.0.1:8787"), "the base URL without /v1: {}", lines[1]);
    let key = words.iter().find_map(|w| w.strip_prefix("ANTHROPIC_API_KEY=")).expect("alice's demo key");
    assert_eq!(key, "sk-alice-demo");
    let project = tempfile::tempdir().unwrap();
    let r = crate::messages::run_claude(&claude, &url, key, "What is new?", project.path()).await;
    assert_eq!(r["is_error"], false, "{r}");
    assert_eq!(r["result"], crate::messages::ANSWER, "{r}");
    let turns: Vec<_> =
        stand.messages().into_iter().filter(|g| g.body["tools"].as_array().is_some_and(|t| !t.is_empty())).collect();
    assert!(!turns.is_empty(), "Claude Code's turn reached the upstream: {:#?}", stand.got());
    for g in &turns {
        assert_eq!(g.headers.get("x-api-key").map(String::as_str), Some(operator), "the operator's key upstream");
        let text = String::from_utf8_lossy(&g.bytes);
        assert!(!text.contains("sk-alice-demo"), "alice's key never goes upstream");
        let last = g.body["system"].as_array().and_then(|s| s.last()).cloned().unwrap_or_default();
        let ours = last["text"].as_str().unwrap_or_default();
        assert!(ours.contains("demo://users/alice/profile"), "alice's context is the last system block: {last}");
        assert!(!ours.contains("demo://users/bob/"), "nothing of bob's: {ours}");
    }
    child.kill().await.unwrap();
}
