//! `${VAR}` expansion: `${VAR}`, `${VAR:-default}`, `${env:VAR}` and
//! VS Code's `${workspaceFolder}` / `${userHome}`, and the record of every
//! value that came from the environment (a server's secrets, scrubbed from
//! what is said about it). Imports nothing of the crate.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

/// Expands a server's values from an environment, recording each value it
/// used (see `ServerConfig::scrub`).
pub(super) struct Expander<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    /// VS Code's `${workspaceFolder}`: the folder holding `.vscode/`.
    workspace: PathBuf,
    /// Values used since the last [`Expander::take_secrets`].
    pub(super) secrets: RefCell<Vec<String>>,
}

impl<'a> Expander<'a> {
    /// Over `env`, for a config in the (absolute) folder `abs_base`.
    pub(super) fn new(env: &'a dyn Fn(&str) -> Option<String>, abs_base: &Path) -> Self {
        let workspace = match abs_base.file_name() {
            Some(n) if n == ".vscode" => abs_base.parent().unwrap_or(abs_base).to_path_buf(),
            _ => abs_base.to_path_buf(),
        };
        Expander { env, workspace, secrets: RefCell::new(Vec::new()) }
    }

    /// The value of `k`, recorded when it could be a secret (4 bytes or more).
    fn var(&self, k: &str) -> Option<String> {
        match k {
            "workspaceFolder" => return Some(self.workspace.to_string_lossy().into_owned()),
            "userHome" => return (self.env)("HOME"),
            _ => {}
        }
        let v = (self.env)(k);
        if let Some(v) = &v
            && k != "MCP_CONTEXT_EXE"
        {
            self.record(v);
        }
        v
    }

    /// Records a value that must never be shown (4 bytes or more: shorter
    /// ones would scrub ordinary words).
    pub(super) fn record(&self, value: &str) {
        if value.len() >= 4 {
            self.secrets.borrow_mut().push(value.to_owned());
        }
    }

    /// `s` expanded; the text between the braces of the first `${…}` that
    /// cannot be.
    pub(super) fn expand(&self, s: &str) -> Result<String, String> {
        expand_vars(s, &|k| self.var(k))
    }

    /// The values recorded so far, forgotten here.
    pub(super) fn take_secrets(&self) -> Vec<String> {
        std::mem::take(&mut *self.secrets.borrow_mut())
    }
}

/// Expands `${VAR}`, `${VAR:-default}` (the default when VAR is unset or
/// empty, as Claude Code and the shell do) and `${env:VAR}` (VS Code,
/// Cursor); `$${` is a literal `${`. Returns the text between the braces of
/// the first that cannot be expanded (see [`unexpanded`]).
pub(super) fn expand_vars(s: &str, env: &dyn Fn(&str) -> Option<String>) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        if rest[..i].ends_with('$') {
            out.push_str(&rest[..i - 1]);
            out.push_str("${");
            rest = &rest[i + 2..];
            continue;
        }
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[i..]);
            return Ok(out);
        };
        let token = &after[..end];
        let inner = token.strip_prefix("env:").unwrap_or(token);
        let (var, default) = match inner.split_once(":-") {
            Some((var, default)) => (var, Some(default)),
            None => (inner, None),
        };
        let value = if token.starts_with("input:") { None } else { env(var).or_else(|| builtin_var(var)) };
        match (value, default) {
            (Some(v), Some(d)) if v.is_empty() => out.push_str(d),
            (Some(v), _) => out.push_str(&v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => return Err(token.to_owned()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Why `${token}` could not be expanded, and what to do.
pub(super) fn unexpanded(token: &str) -> String {
    if let Some(id) = token.strip_prefix("input:") {
        return format!(
            "`${{input:{id}}}` asks VS Code to prompt for a value, and mcp-context cannot prompt; \
             put the value in an environment variable and write `${{VAR}}` instead"
        );
    }
    let var = token.strip_prefix("env:").unwrap_or(token);
    format!("environment variable `{var}` is not set; set it or remove `${{{token}}}` from the config")
}

fn builtin_var(var: &str) -> Option<String> {
    match var {
        "MCP_CONTEXT_EXE" => std::env::current_exe().ok().map(|p| p.to_string_lossy().into_owned()),
        _ => None,
    }
}
