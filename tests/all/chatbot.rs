//! The example chatbot, end to end: its binary in line mode against a local
//! OpenAI-compatible server (streaming SSE) and the demo MCP server.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

/// `cargo test` builds the examples next to the test binaries.
pub(crate) fn chatbot_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("examples").join("chatbot")
}

pub(crate) fn write_config(dir: &std::path::Path, t: &str) -> PathBuf {
    let path = dir.join("chat.yaml");
    std::fs::write(
        &path,
        format!("servers:\n{}policy: {:?}\ncontext:\n  max_tokens: 4000\n", demo_server("demo", t), policies_dir()),
    )
    .unwrap();
    path
}

/// The chatbot as alice, talking to `llm_base` (none: no endpoint configured).
pub(crate) fn chat_command(config: &std::path::Path, llm_base: Option<&str>) -> Command {
    let mut cmd = Command::new(chatbot_binary());
    cmd.args(["--config", config.to_str().unwrap(), "--user", "alice"])
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY");
    if let Some(base) = llm_base {
        cmd.env("OPENAI_BASE_URL", base).env("OPENAI_API_KEY", "test-key");
    }
    cmd
}

pub(crate) fn run_chat(
    llm_base: Option<&str>,
    config: &std::path::Path,
    input: &str,
    extra: &[&str],
) -> (String, String) {
    let mut child = chat_command(config, llm_base)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chatbot example is built by `cargo test`");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "chatbot failed: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_conversation_carries_one_context_message_per_turn() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &t);
    let llm = FakeLlm::start(Reply::Stream(vec!["Hello ".into(), "from the model".into()])).await;
    // Turn 4 fails with a 500; async-openai retries it three times, so four calls.
    let script = "hello\n/user bob\nsecond question\n@demo:demo://public/faq what is free?\n/resources\nthis one fails\nafter the error\n/context\n/quit\n";
    llm.state.lock().unwrap().fail_on = Some(("this one fails".into(), 500));
    let base = llm.base.clone();
    let (stdout, stderr) =
        tokio::task::spawn_blocking(move || run_chat(Some(&base), &config, script, &[])).await.unwrap();
    let requests = llm.requests();
    assert_eq!(requests.len(), 3 + 4 + 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let ok: Vec<&serde_json::Value> = [0, 1, 2, 7].iter().map(|i| &requests[*i]).collect();
    for (turn, r) in ok.iter().enumerate() {
        let m = r["messages"].as_array().unwrap();
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[0]["name"], "mcp_context");
        assert_eq!(m.iter().filter(|x| x["name"] == "mcp_context").count(), 1);
        // History grows by user + assistant per successful turn.
        assert_eq!(m.len(), 2 + 2 * turn, "turn {turn}");
        assert_eq!(r["stream"], true);
    }
    let sys = |i: usize| ok[i]["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(sys(0).contains("demo://users/alice/profile"));
    assert!(sys(1).contains("demo://users/bob/profile") && !sys(1).contains("users/alice"));
    // The @ mention narrows the context to the FAQ.
    assert!(sys(2).contains("demo:demo://public/faq"));
    assert_eq!(sys(2).matches("<resource ").count(), 1);
    // The failed turn is not in the history of the next request.
    let last = ok[3]["messages"].as_array().unwrap();
    assert!(last.iter().all(|m| m["content"] != "this one fails"));
    assert_eq!(last[last.len() - 1]["content"], "after the error");
    // stdout: answers streamed, one error line, then the chat goes on.
    assert_eq!(stdout.matches("Hello from the model").count(), 4, "{stdout}");
    let errors: Vec<&str> = stdout.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{stdout}");
    assert!(errors[0].contains("upstream exploded"), "{}", errors[0]);
    assert!(stdout.contains("(now chatting as bob)"));
    assert!(stdout.contains("Available MCP Resources:\n- demo:demo://docs/changelog"));
    assert!(stdout.contains("user bob") && stdout.contains("included"), "/context prints the report: {stdout}");
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty(), "the demo server was left running");
}

#[tokio::test]
async fn without_key_or_base_url_it_runs_dry() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &t);
    let (stdout, stderr) =
        tokio::task::spawn_blocking(move || run_chat(None, &config, "how do I share?\n", &[])).await.unwrap();
    assert!(stderr.contains("--dry-run"), "{stderr}");
    assert!(stdout.contains("--- request (dry run, not sent) ---"));
    let json_start = stdout.find('{').unwrap();
    let json_end = stdout.find("--- end ---").unwrap();
    let request: serde_json::Value = serde_json::from_str(&stdout[json_start..json_end]).unwrap();
    assert_eq!(request["messages"][0]["name"], "mcp_context");
    assert_eq!(request["messages"][1]["content"], "how do I share?");
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty());
}

#[tokio::test]
async fn a_mention_the_user_may_not_see_is_refused() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &t);
    let llm = FakeLlm::start(Reply::Stream(vec!["ok".into()])).await;
    let base = llm.base.clone();
    let (stdout, _) = tokio::task::spawn_blocking(move || {
        run_chat(Some(&base), &config, "@demo:secret://payroll/2026 salaries?\n", &[])
    })
    .await
    .unwrap();
    assert!(stdout.contains("(@demo:secret://payroll/2026 is not available to alice"), "{stdout}");
    let sent = &llm.requests()[0];
    let first = &sent["messages"][0];
    assert!(first["name"] != "mcp_context" || !first["content"].as_str().unwrap().contains("91000"));
}

#[tokio::test]
async fn tools_flag_runs_the_resource_tools() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &t);
    let llm = FakeLlm::start(Reply::Text("The guide says: use n share.".into())).await;
    llm.push(Reply::ToolCalls(vec![(
        "call_1".into(),
        "read_mcp_resource".into(),
        r#"{"uri":"demo:demo://docs/guide"}"#.into(),
    )]));
    let base = llm.base.clone();
    let (stdout, stderr) =
        tokio::task::spawn_blocking(move || run_chat(Some(&base), &config, "how do I share?\n", &["--tools"]))
            .await
            .unwrap();
    assert!(stdout.contains("The guide says: use n share."), "{stdout}");
    assert!(stderr.contains("[tool read_mcp_resource] Read demo:demo://docs/guide."), "{stderr}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let second = reqs[1]["messages"].as_array().unwrap();
    assert_eq!(second[0]["name"], "mcp_context", "injection stays on next to the tools");
    let tool = second.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool["tool_call_id"], "call_1");
    assert!(tool["content"].as_str().unwrap().starts_with("# Acme Notes guide"));
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_the_answer_and_the_chat_goes_on() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &t);
    // The first answer streams one chunk and then never ends; the second is whole.
    let llm = FakeLlm::start(Reply::Stream(vec!["second answer".into()])).await;
    llm.push(Reply::StreamThenHang(vec!["partial ".into()]));
    let mut child = chat_command(&config, Some(&llm.base))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let output = Output::collect(child.stdout.take().unwrap());
    let wait_for = |needle: &str| output.wait_until(needle, |out| out.contains(needle));
    stdin.write_all(b"first question\n").unwrap();
    tokio::task::block_in_place(|| wait_for("partial "));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    tokio::task::block_in_place(|| wait_for("[stopped]"));
    // Not unwrapped: a chatbot that died of the signal shows in its status below.
    let _ = stdin.write_all(b"second question\n/quit\n");
    drop(stdin);
    let status = tokio::task::block_in_place(|| child.wait()).unwrap();
    let out = output.finish();
    assert!(status.success(), "Ctrl-C during an answer ends that answer, not the chat: {status:?}\n{out}");
    assert!(out.contains("second answer"), "{out}");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "{out}");
    let m = requests[1]["messages"].as_array().unwrap();
    assert_eq!(m[0]["name"], "mcp_context");
    // The stopped answer stays in the history as far as it got.
    let roles: Vec<(&str, &str)> =
        m[1..].iter().map(|x| (x["role"].as_str().unwrap(), x["content"].as_str().unwrap())).collect();
    assert_eq!(roles, [("user", "first question"), ("assistant", "partial "), ("user", "second question")], "{out}");
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty(), "the demo server was left running");
}

/// What a child writes (to a pipe or a pty), collected on a thread as it comes.
struct Output {
    seen: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Output {
    fn collect(mut from: impl std::io::Read + Send + 'static) -> Output {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Output { seen, reader }
    }

    /// Blocks until `done` holds for the output so far (60 s at most, then fails naming `what`).
    fn wait_until(&self, what: &str, done: impl Fn(&str) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !done(&self.seen.lock().unwrap()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = self.seen.lock().unwrap();
        assert!(done(&out), "no {what} in {out:?}");
    }

    /// Everything, once the writer has closed its end.
    fn finish(self) -> String {
        self.reader.join().unwrap();
        std::sync::Arc::try_unwrap(self.seen).unwrap().into_inner().unwrap()
    }
}

/// A pseudo-terminal: the master end for the test, the path of the slave
/// end for the chatbot's stdin and stdout. `None` where the system has no
/// pseudo-terminals to give (a sandbox without `/dev/ptmx`).
fn open_pty() -> Option<(std::fs::File, PathBuf)> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain libc calls on a descriptor we own; ptsname's buffer is
    // copied before any other pty call.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        if master < 0 {
            eprintln!("posix_openpt: {}", std::io::Error::last_os_error());
            return None;
        }
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let name = std::ffi::CStr::from_ptr(libc::ptsname(master)).to_string_lossy().into_owned();
        Some((std::fs::File::from_raw_fd(master), PathBuf::from(name)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_it_uses_the_line_editor() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &t);
    let llm = FakeLlm::start(Reply::Stream(vec!["Hello ".into(), "from the model".into()])).await;
    let Some((master, slave)) = open_pty() else {
        skip("on_a_terminal_it_uses_the_line_editor", "no pseudo-terminal on this system");
        return;
    };
    let tty = || std::fs::OpenOptions::new().read(true).write(true).open(&slave).unwrap();
    let mut child = chat_command(&config, Some(&llm.base))
        .env("TERM", "xterm")
        .stdin(tty())
        .stdout(tty())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Reading the master ends with EIO once the chatbot, the last holder of the slave end, exits.
    let output = Output::collect(master.try_clone().unwrap());
    // The n-th prompt (rustyline writes it once the terminal is in raw mode).
    let prompt = |n: usize| output.wait_until(&format!("prompt {n}"), |out| out.matches("alice> ").count() >= n);
    let mut keys = master;
    tokio::task::block_in_place(|| {
        prompt(1);
        keys.write_all(b"first question\r").unwrap();
        prompt(2);
        // Ctrl-C at the prompt drops the line being typed, not the chat.
        keys.write_all(b"never sent\x03").unwrap();
        prompt(3);
        keys.write_all(b"second question\r").unwrap();
        prompt(4);
        // Ctrl-D on an empty line ends the chat.
        keys.write_all(b"\x04").unwrap();
    });
    let status = tokio::task::block_in_place(|| child.wait()).unwrap();
    drop(keys);
    let out = output.finish();
    assert!(status.success(), "{status:?}\n{out}");
    assert!(out.contains("mcp-context chatbot: user alice"), "the banner of the interactive mode: {out}");
    assert_eq!(out.matches("Hello from the model").count(), 2, "{out}");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "{out}");
    let m = requests[1]["messages"].as_array().unwrap();
    assert_eq!(m[0]["name"], "mcp_context");
    let turns: Vec<&str> = m[1..].iter().map(|x| x["content"].as_str().unwrap()).collect();
    assert_eq!(turns, ["first question", "Hello from the model", "second question"], "{out}");
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty(), "the demo server was left running");
}
