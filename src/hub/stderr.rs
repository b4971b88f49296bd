//! A stdio server's stderr: forwarded to tracing (debug), its last lines
//! kept, and, when it fails to start, the lines that explain it chosen for
//! the message: the `Error: Cannot find module …` of Node or the final
//! line of a Python traceback before the stack frames around them, and a
//! hint at `inherit_env` when it complains of a variable that the host has
//! but the server was not given.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Longest stderr line forwarded to tracing.
const MAX_STDERR_LINE: usize = 4096;
/// Lines kept, to choose the quoted ones from.
const KEPT_LINES: usize = 100;
/// Lines quoted when a server fails to start.
pub(super) const TAIL_LINES: usize = 8;
/// Longest stderr line quoted, in characters.
const TAIL_WIDTH: usize = 200;

/// The last lines a server wrote on stderr, each cut to a readable width.
pub(super) type StderrTail = Arc<Mutex<VecDeque<String>>>;

/// Forwards a server's stderr to tracing and keeps its last lines.
pub(super) async fn drain_stderr(server: String, stderr: tokio::process::ChildStderr, tail: StderrTail) {
    use tokio::io::AsyncBufReadExt;
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf[..buf.len().min(MAX_STDERR_LINE)]);
                let line = line.trim_end();
                tracing::debug!(target: "mcp_stderr", server = %server, "{line}");
                if line.trim().is_empty() {
                    continue;
                }
                let mut kept: String =
                    line.chars().filter(|c| !c.is_control() || *c == '\t').take(TAIL_WIDTH).collect();
                if line.chars().count() > TAIL_WIDTH {
                    kept.push('…');
                }
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == KEPT_LINES {
                    tail.pop_front();
                }
                tail.push_back(kept);
            }
        }
    }
}

/// A stack frame or the code quoted under one (`    at f (file:1:2)`,
/// `  File "x.py", line 3`, any indented line): the least telling lines.
fn is_frame(line: &str) -> bool {
    line.starts_with([' ', '\t']) || line.trim_start().starts_with("at ")
}

/// A line that says what went wrong: `Error: …`, `TypeError: …`,
/// `ModuleNotFoundError: …` (Python's final traceback line), `error: …`.
fn explains(line: &str) -> bool {
    let Some((head, _)) = line.split_once(':') else { return false };
    let word = head.rsplit(['.', ' ']).next().unwrap_or(head);
    !head.contains(' ')
        && (word.ends_with("Error") || word.ends_with("Exception") || word.eq_ignore_ascii_case("error"))
        || line.starts_with("Error [")
}

/// At most `n` of `lines` to quote, in their order, `None` where lines were
/// left out: the last `n`, except that the first two lines that explain
/// (when not among them) take the places of stack frames, else of the
/// earliest lines.
pub(super) fn pick(lines: &[String], n: usize) -> Vec<Option<&str>> {
    if lines.len() <= n {
        return lines.iter().map(|l| Some(l.as_str())).collect();
    }
    let mut chosen: Vec<usize> = (lines.len() - n..lines.len()).collect();
    let wanted: Vec<usize> = (0..lines.len()).filter(|&i| explains(&lines[i])).take(2).collect();
    for i in wanted {
        if chosen.contains(&i) {
            continue;
        }
        let room = chosen.iter().position(|&c| is_frame(&lines[c])).unwrap_or(0);
        chosen.remove(room);
        chosen.push(i);
    }
    chosen.sort_unstable();
    let mut out = Vec::new();
    let mut next = 0;
    for i in chosen {
        if i > next {
            out.push(None);
        }
        out.push(Some(lines[i].as_str()));
        next = i + 1;
    }
    if next < lines.len() {
        out.push(None);
    }
    out
}

/// The host variables that a server's stderr names as missing and that the
/// server was not given: for a hint at `inherit_env`. `passed(name)` says
/// whether the server got the variable.
pub(super) fn missing_vars(lines: &[String], passed: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in lines {
        let lower = line.to_ascii_lowercase();
        let complains = ["not set", "unset", "missing", "required", "undefined", "must be set", "not defined"]
            .iter()
            .any(|w| lower.contains(w));
        if !complains {
            continue;
        }
        for word in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let looks_like_var = word.len() >= 3
                && word.starts_with(|c: char| c.is_ascii_uppercase())
                && word.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if looks_like_var && !passed(word) && std::env::var_os(word).is_some() && !out.iter().any(|v| v == word) {
                out.push(word.to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect()
    }

    fn shown(picked: &[Option<&str>]) -> String {
        picked.iter().map(|l| l.unwrap_or("…")).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn node_cannot_find_module_is_quoted_before_frames() {
        let node = lines(
            "node:internal/modules/cjs/loader:1228\n  throw err;\n  ^\n\nError: Cannot find module '/srv/inde.js'\n\
             \x20   at Module._resolveFilename (node:internal/modules/cjs/loader:1225:15)\n\
             \x20   at Module._load (node:internal/modules/cjs/loader:1051:27)\n\
             \x20   at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:174:12)\n\
             \x20   at node:internal/main/run_main_module:28:49 {\n  code: 'MODULE_NOT_FOUND',\n  requireStack: []\n}\n\nNode.js v20.11.0\n",
        );
        let picked = shown(&pick(&node, TAIL_LINES));
        assert!(picked.contains("Error: Cannot find module '/srv/inde.js'"), "{picked}");
        assert!(picked.contains("Node.js v20.11.0") && picked.contains("requireStack"), "{picked}");
        assert!(!picked.contains("Module._resolveFilename"), "a frame made room: {picked}");
        assert!(picked.lines().count() <= TAIL_LINES + 2, "{picked}");
    }

    #[test]
    fn python_final_traceback_line_is_quoted() {
        let mut py = lines("Traceback (most recent call last):\n");
        for i in 0..10 {
            py.push(format!("  File \"/srv/m{i}.py\", line {i}, in <module>"));
            py.push(format!("    import m{}", i + 1));
        }
        py.push("ModuleNotFoundError: No module named 'mcp'".into());
        let picked = shown(&pick(&py, TAIL_LINES));
        assert!(picked.contains("ModuleNotFoundError: No module named 'mcp'"), "{picked}");
        assert!(picked.starts_with('…'), "{picked}");
        // Short tails are quoted whole.
        assert_eq!(pick(&py[..3], TAIL_LINES).len(), 3);
    }

    #[test]
    fn a_variable_the_host_has_is_named() {
        // PATH is set in every test environment; the server was not given it here.
        let l = lines("Error: PATH environment variable is not set\n");
        assert_eq!(missing_vars(&l, &|_| false), ["PATH"]);
        assert!(missing_vars(&l, &|v| v == "PATH").is_empty());
        assert!(missing_vars(&lines("PATH is fine\n"), &|_| false).is_empty());
    }
}
