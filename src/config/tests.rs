//! Unit tests of config loading.

mod loading {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use secrecy::ExposeSecret;

    use super::super::env::{expand_vars, unexpanded};
    use super::super::host::SERVER_KEYS;
    use super::super::*;
    use crate::cause::redact_url;
    use crate::mode::MessageRole;

    fn env(k: &str) -> Option<String> {
        match k {
            "TOKEN" => Some("s3cr3t".into()),
            _ => None,
        }
    }

    fn load(src: &str) -> Result<Config> {
        Config::from_yaml_with_env(src, Path::new("/etc/mc/mcp-context.yaml"), &env)
    }

    #[test]
    fn reads_in_flight_default_by_transport() {
        let c = load("servers:\n  s:\n    command: x\n  h:\n    url: http://h/mcp\n  set:\n    url: http://h/mcp\n    max_concurrent_reads: 8\n")
            .unwrap();
        let reads: Vec<usize> = c.servers.iter().map(|s| s.max_concurrent_reads).collect();
        assert_eq!(reads, [DEFAULT_MAX_CONCURRENT_READS, DEFAULT_MAX_CONCURRENT_READS_HTTP, 8]);
    }

    #[test]
    fn full_example_loads_in_order() {
        let c = load(
            "servers:\n  zeta:\n    command: ./bin/srv\n    args: [\"--t\", \"${TOKEN}\"]\n    env: { A: \"${TOKEN}\" }\n    cwd: docs\n    timeout_ms: 500\n  alpha:\n    httpUrl: http://127.0.0.1:1/mcp\n    headers: { Authorization: \"Bearer ${TOKEN}\" }\npolicy: policies/\ncontext:\n  model: gpt-4\n  max_tokens: 100\n  role: developer\n",
        )
        .unwrap();
        assert_eq!(c.servers[0].name, "zeta");
        assert_eq!(c.servers[1].name, "alpha");
        assert_eq!(c.policy.as_deref(), Some(Path::new("/etc/mc/policies/")));
        assert_eq!(c.context.role, MessageRole::Developer);
        match &c.servers[0].transport {
            Transport::Stdio { command, args, env, cwd, .. } => {
                assert_eq!(command, "/etc/mc/./bin/srv");
                assert_eq!(args[1], "s3cr3t");
                assert_eq!(env["A"], "s3cr3t");
                assert_eq!(cwd.as_deref(), Some(Path::new("/etc/mc/docs")));
            }
            _ => panic!(),
        }
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("s3cr3t"), "{dbg}");
    }

    #[test]
    fn protocol_defaults_to_auto_and_pins() {
        let c = load("servers:\n  a:\n    command: x\n  b:\n    command: x\n    protocol: 2025-11-25\n  c:\n    command: x\n    protocol: \"2026-07-28\"\n").unwrap();
        let p: Vec<_> = c.servers.iter().map(|s| s.protocol).collect();
        assert_eq!(p, [Protocol::Auto, Protocol::V2025_11_25, Protocol::V2026_07_28]);
    }

    #[test]
    fn claude_desktop_json_loads() {
        let c = load(r#"{"mcpServers": {"fs": {"command": "npx", "args": ["-y", "x"], "env": {}}}}"#).unwrap();
        assert_eq!(c.servers[0].name, "fs");
    }

    #[test]
    fn errors_name_file_and_line() {
        let cases = [
            ("servers:\n  a:\n    comand: x\n", "3:5", "unknown field `comand`"),
            ("servers:\n  a:\n    command: \"${NOPE}\"\n", ":3:15", "`NOPE` is not set"),
            ("servers:\n  bad name:\n    command: x\n", ":2:3", "invalid server name"),
            ("servers:\n  a:\n    url: ftp://x/mcp\n", ":3:10", "url must start with http://"),
            ("servers:\n  a:\n    command: x\n    url: http://x\n", ":2", "both `command` and `url`"),
            ("servers:\n  a: {}\n", ":2", "needs `command`"),
            ("context:\n  max_tokens: lots\n", "2:15", "invalid type"),
            ("servers:\n\t a: 1\n", ":2", ""),
            ("servers:\n  a:\n    command: x\n  a:\n    command: y\n", "", "defined twice"),
            (
                "servers:\n  a:\n    command: x\n    protocol: 2026\n",
                ":4:15",
                "protocol must be one of auto, 2026-07-28",
            ),
        ];
        for (src, loc, needle) in cases {
            let e = load(src).unwrap_err().to_string();
            assert!(e.starts_with("/etc/mc/mcp-context.yaml"), "{e}");
            assert!(e.contains(loc), "{src:?}: {e}");
            assert!(e.contains(needle), "{src:?}: {e}");
            assert!(!e.contains("s3cr3t"));
        }
    }

    #[test]
    fn errors_point_at_short_names_and_into_flow_style() {
        // A short name that also occurs inside an earlier name: the server
        // `a` is on line 4, not in `xa:` on line 2.
        let e = load("servers:\n  xa:\n    command: x\n  a:\n    command: x\n    url: http://a\n").unwrap_err();
        assert!(e.to_string().contains("mcp-context.yaml:4:3: server `a` has both"), "{e}");
        let e = load("servers:\n  ab:\n    url: http://x\n  b:\n    url: ftp://b\n").unwrap_err();
        assert!(e.to_string().contains(":5:10: server `b`: url must start"), "{e}");
        // Flow style, all on one line: positions still come from the parser.
        let src = "{servers: {ok: {command: x}, a: {url: \"ftp://x\"}}}";
        let e = load(src).unwrap_err().to_string();
        let col = src.find("\"ftp").unwrap() + 1;
        assert!(e.contains(&format!(":1:{col}: server `a`: url")), "{e}");
        let e = load("{servers: {a: {command: \"${NOPE}\"}}, context: {max_tokens: 0}}").unwrap_err().to_string();
        assert!(e.contains(":1:26:") && e.contains("`NOPE` is not set"), "{e}");
        let e = load("{context: {model: m, max_tokens: 0}}").unwrap_err().to_string();
        assert!(e.contains(":1:34: context.max_tokens"), "{e}");
        let e = load("{servers: {a: {command: x}, b: {command: y}, a: {command: z}}}").unwrap_err().to_string();
        assert!(e.contains(":1:46:") && e.contains("server `a` is defined twice"), "{e}");
        let e = load("serve: {keys: [{sha256: abc, user: a}]}").unwrap_err().to_string();
        assert!(e.contains(":1:25:") && e.contains("not a SHA-256"), "{e}");
    }

    #[test]
    fn serve_section() {
        let digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let c = load(&format!(
            "servers: {{}}\nserve:\n  listen: 127.0.0.1:1\n  upstream_api_key: ${{TOKEN}}\n  keys:\n    - {{ sha256: \"{digest}\", user: alice }}\n  user_header: X-User\n  anonymous_user: guest\n  max_body_bytes: 100\n"
        ))
        .unwrap();
        assert_eq!(c.serve.listen, "127.0.0.1:1");
        assert_eq!(c.serve.upstream_api_key.as_ref().map(|k| k.expose_secret()), Some("s3cr3t"));
        assert_eq!(c.serve.keys[0].user, "alice");
        assert_eq!(c.serve.keys[0].sha256.expose_secret()[0], 0x9f);
        assert_eq!(c.serve.max_body_bytes, 100);
        assert!(!format!("{c:?}").contains("s3cr3t"));
        assert_eq!(load("servers: {}\n").unwrap().serve.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    }

    #[test]
    fn serve_anthropic_section() {
        let c = load("serve:\n  anthropic:\n    api_key: ${TOKEN}\n").unwrap();
        let a = c.serve.anthropic.as_ref().unwrap();
        assert_eq!(a.upstream, DEFAULT_ANTHROPIC_UPSTREAM);
        assert_eq!(a.api_key.as_ref().map(|k| k.expose_secret()), Some("s3cr3t"));
        assert_eq!(a.select, crate::mode::SelectMode::Priority, "caches first on this route");
        assert!(!format!("{c:?}").contains("s3cr3t"));
        let c = load("serve:\n  anthropic: { upstream: \"http://h/v1\", select: relevance }\n").unwrap();
        assert_eq!(c.serve.anthropic.unwrap().select, crate::mode::SelectMode::Relevance);
        assert!(load("servers: {}\n").unwrap().serve.anthropic.is_none());
        for (src, at, text) in [
            ("serve:\n  anthropic:\n    upstream: ftp://x\n", ":3:15", "must start with http"),
            ("serve:\n  anthropic:\n    api_key: ${NOPE}\n", ":3:14", "`NOPE` is not set"),
            ("serve:\n  anthropic:\n    key: x\n", ":3", "unknown field `key`"),
            ("serve:\n  forward_authorization: true\n  anthropic:\n    api_key: k\n", ":4:14", "keep one"),
        ] {
            let e = load(src).unwrap_err().to_string();
            assert!(e.contains(at) && e.contains(text), "{src:?}: {e}");
        }
    }

    #[test]
    fn serve_gemini_section() {
        let c = load("serve:\n  gemini:\n    api_key: ${TOKEN}\n").unwrap();
        let g = c.serve.gemini.as_ref().unwrap();
        assert_eq!(g.upstream, DEFAULT_GEMINI_UPSTREAM);
        assert_eq!(g.api_key.as_ref().map(|k| k.expose_secret()), Some("s3cr3t"));
        assert!(!format!("{c:?}").contains("s3cr3t"));
        assert!(load("servers: {}\n").unwrap().serve.gemini.is_none());
        for (src, at, text) in [
            ("serve:\n  gemini:\n    upstream: ftp://x\n", ":3:15", "serve.gemini.upstream must start with http"),
            ("serve:\n  gemini:\n    api_key: ${NOPE}\n", ":3:14", "`NOPE` is not set"),
            ("serve:\n  gemini:\n    select: priority\n", ":3", "unknown field `select`"),
            ("serve:\n  forward_authorization: true\n  gemini:\n    api_key: k\n", ":4:14", "`gemini.api_key`"),
        ] {
            let e = load(src).unwrap_err().to_string();
            assert!(e.contains(at) && e.contains(text), "{src:?}: {e}");
        }
    }

    #[test]
    fn serve_errors_name_file_and_line() {
        let cases = [
            ("serve:\n  listen: x\n  upstream_key: y\n", "3:3", "unknown field `upstream_key`"),
            ("serve:\n  keys:\n    - { sha256: abc, user: a }\n", ":3", "not a SHA-256"),
            ("serve:\n  upstream_api_key: k\n  forward_authorization: true\n", ":3", "keep one"),
            ("serve:\n  upstream: ${NOPE}\n", ":2", "`NOPE` is not set"),
            ("serve:\n  upstream: ftp://x\n", ":2", "http://"),
            ("serve:\n  user_header: \"a b\"\n", ":2", "not an HTTP header name"),
            ("serve:\n  max_body_bytes: 0\n", ":2", "at least 1"),
            ("serve:\n  max_body_fields: 0\n", ":2", "serve.max_body_fields must be at least 1"),
            ("serve:\n  keys_file: nope.yaml\n", "nope.yaml", "cannot read serve.keys_file"),
            (
                "serve:\n  keys:\n    - { sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, user: \"a\\nb\" }\n",
                "3:",
                "control characters",
            ),
            ("serve:\n  anonymous_user: \"\"\n", ":2", "cannot be empty"),
            ("serve:\n  passthrough: [\"GET /v1/files\", \"GET /v2/x\"]\n", ":2", "must start with `/v1/`"),
            ("serve:\n  passthrough:\n    - \"FETCH /v1/x\"\n", ":3", "not GET, POST"),
            ("serve:\n  passthrough:\n    - \"GET /v1/../admin\"\n", ":3", "not a path segment"),
            ("serve:\n  upstream_user: pseudonym\n", ":2", "needs `pseudonym_key`"),
            ("serve:\n  max_body_bytes: 2000\n  max_inflight_body_bytes: 1000\n", ":2", "more than"),
        ];
        for (src, loc, needle) in cases {
            let e = load(src).unwrap_err().to_string();
            assert!(e.starts_with("/etc/mc/"), "{e}");
            assert!(e.contains(loc), "{src:?}: {e}");
            assert!(e.contains(needle), "{src:?}: {e}");
        }
    }

    #[test]
    fn keys_file_is_relative_to_the_config_and_strict() {
        let dir = tempfile::tempdir().unwrap();
        let digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        std::fs::write(dir.path().join("keys.yaml"), format!("- {{ sha256: {digest}, user: bob }}\n")).unwrap();
        let cfg = dir.path().join("c.yaml");
        let c = Config::from_yaml("serve:\n  keys_file: keys.yaml\n", &cfg).unwrap();
        assert_eq!(c.serve.keys[0].user, "bob");
        std::fs::write(dir.path().join("keys.yaml"), "- { sha256: x, usr: bob }\n").unwrap();
        let e = Config::from_yaml("serve:\n  keys_file: keys.yaml\n", &cfg).unwrap_err().to_string();
        assert!(e.contains("keys.yaml:1:"), "{e}");
        assert!(e.contains("unknown field `usr`"), "{e}");
    }

    #[test]
    fn env_vars_expand_and_double_dollar_escapes() {
        assert_eq!(expand_vars("a${TOKEN}b", &env).unwrap(), "as3cr3tb");
        assert_eq!(expand_vars("$${TOKEN}", &env).unwrap(), "${TOKEN}");
        assert_eq!(expand_vars("${X}", &env).unwrap_err(), "X");
        assert!(expand_vars("${MCP_CONTEXT_EXE}", &env).is_ok());
    }

    fn load_json(src: &str, path: &str) -> Result<Config> {
        Config::from_yaml_with_env(src, Path::new(path), &env)
    }

    fn stdio(c: &Config, i: usize) -> (&str, &[String], &BTreeMap<String, String>, Option<&Path>) {
        match &c.servers[i].transport {
            Transport::Stdio { command, args, env, cwd, .. } => (command, args, env, cwd.as_deref()),
            t => panic!("{t:?}"),
        }
    }

    #[test]
    fn each_host_means_its_remote_transport_as_written() {
        let mode = |c: &Config, i: usize| match &c.servers[i].transport {
            Transport::Http { mode, .. } => *mode,
            t => panic!("{t:?}"),
        };
        let servers = r#"{"mcpServers": {"a": {"url": "http://h/sse"}, "b": {"httpUrl": "http://h/mcp"}, "c": {"type": "http", "url": "http://h/mcp"}, "d": {"type": "sse", "url": "http://h/sse"}}}"#;
        // Gemini CLI's settings.json: `url` is SSE, `httpUrl` Streamable HTTP.
        let c = load_json(servers, "/home/u/.gemini/settings.json").unwrap();
        let want = [HttpMode::Sse, HttpMode::Streamable, HttpMode::Streamable, HttpMode::Sse];
        assert_eq!((0..4).map(|i| mode(&c, i)).collect::<Vec<_>>(), want);
        // Elsewhere (Cursor, Claude Code, our YAML) a bare `url` tries Streamable HTTP, then SSE.
        let c = load_json(servers, "/p/.cursor/mcp.json").unwrap();
        assert_eq!(mode(&c, 0), HttpMode::StreamableThenSse);
        let c = load("servers:\n  a:\n    url: http://h/mcp\n  b:\n    type: http\n    url: http://h/mcp\n").unwrap();
        assert_eq!((mode(&c, 0), mode(&c, 1)), (HttpMode::StreamableThenSse, HttpMode::Streamable));
    }

    #[test]
    fn host_files_keep_servers_and_drop_host_keys() {
        // Gemini CLI: other settings, per-server trust and tool lists, its own `context`.
        let c = load_json(
            r#"{"theme": "GitHub", "context": {"fileName": "GEMINI.md"}, "mcpServers": {"g": {"command": "x", "trust": true, "includeTools": ["a"], "excludeTools": [], "timeout": 30000, "cwd": "sub", "description": "d"}}}"#,
            "/home/u/.gemini/settings.json",
        )
        .unwrap();
        assert_eq!(c.servers[0].timeout, Duration::from_millis(30_000));
        assert_eq!(stdio(&c, 0).3, Some(Path::new("/home/u/.gemini/sub")));
        assert_eq!(c.context.model, "gpt-4o", "Gemini's context is not ours");
        // Cline: approvals, `disabled`, `timeout` in seconds; Windsurf: `serverUrl`.
        let c = load_json(
            r#"{"mcpServers": {"c": {"command": "x", "autoApprove": [], "alwaysAllow": ["r"], "timeout": 60}, "off": {"command": "y", "disabled": true}, "w": {"serverUrl": "https://h/mcp", "headers": {"A": "${TOKEN}"}}}}"#,
            "/x/cline_mcp_settings.json",
        )
        .unwrap();
        assert_eq!(c.servers.len(), 2);
        assert_eq!(c.servers[0].timeout, Duration::from_secs(60));
        assert!(
            matches!(&c.servers[1].transport, Transport::Http { url, headers, mode: HttpMode::StreamableThenSse } if url == "https://h/mcp" && headers["A"] == "s3cr3t")
        );
        // Our own sections in a JSON file are still ours, and strict.
        let e = load_json(r#"{"mcpServers": {}, "context": {"max_tokens": 0}}"#, "/x/m.json").unwrap_err();
        assert!(e.to_string().contains("context.max_tokens"), "{e}");
    }

    #[test]
    fn vscode_file_with_comments_workspace_folder_and_inputs() {
        let src = "{\n  // VS Code\n  \"inputs\": [{\"id\": \"k\", \"type\": \"promptString\"},],\n  \"servers\": {\n    \"v\": {\"type\": \"stdio\", \"command\": \"node\", \"args\": [\"${workspaceFolder}/srv.js\", \"${env:TOKEN}\"],},\n    \"s\": {\"type\": \"sse\", \"url\": \"http://h/sse\"},\n  },\n}\n";
        let c = load_json(src, "/p/.vscode/mcp.json").unwrap();
        let (_, args, _, cwd) = stdio(&c, 0);
        assert_eq!(args, ["/p/srv.js", "s3cr3t"]);
        assert_eq!(cwd, Some(Path::new("/p/.vscode")));
        assert!(c.servers[0].unsupported.is_none());
        assert!(
            matches!(&c.servers[1].transport, Transport::Http { url, mode: HttpMode::Sse, .. } if url == "http://h/sse")
        );
        let e = load_json(&src.replace("${env:TOKEN}", "${input:k}"), "/p/.vscode/mcp.json").unwrap_err().to_string();
        assert!(
            e.starts_with("/p/.vscode/mcp.json:5:") && e.contains("`${input:k}`") && e.contains("cannot prompt"),
            "{e}"
        );
        let e = load_json("{\n  \"servers\": {\n    \"v\": {\"command\": 'x'}\n  }\n}\n", "/p/mcp.json").unwrap_err();
        assert!(e.to_string().starts_with("/p/mcp.json:3:"), "{e}");
    }

    #[test]
    fn env_file_loads_and_env_wins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".env"), "A=from-file\nB=file-secret\n").unwrap();
        let cfg = dir.path().join("mcp.json");
        let c = Config::from_yaml_with_env(
            r#"{"servers": {"v": {"command": "x", "envFile": ".env", "env": {"A": "mine"}}}}"#,
            &cfg,
            &env,
        )
        .unwrap();
        let (_, _, e, _) = stdio(&c, 0);
        assert_eq!((e["A"].as_str(), e["B"].as_str()), ("mine", "file-secret"));
        assert_eq!(c.servers[0].scrub("file-secret"), "***");
        let e = Config::from_yaml_with_env(r#"{"servers": {"v": {"command": "x", "envFile": "no.env"}}}"#, &cfg, &env)
            .unwrap_err();
        assert!(e.to_string().contains("mcp.json:1:47: server `v`: cannot read envFile"), "{e}");
    }

    #[test]
    fn stdio_servers_run_in_the_config_folder_by_default() {
        let c = load("servers:\n  a:\n    command: x\n").unwrap();
        assert_eq!(stdio(&c, 0).3, Some(Path::new("/etc/mc")));
        let c = Config::from_yaml("servers:\n  a:\n    command: ./x\n", Path::new("rel/c.yaml")).unwrap();
        let (command, _, _, cwd) = stdio(&c, 0);
        assert!(Path::new(command).is_absolute() && cwd.unwrap().is_absolute() && cwd.unwrap().ends_with("rel"));
    }

    #[test]
    fn every_server_key_is_a_field() {
        for key in SERVER_KEYS {
            let value = match *key {
                "args" | "inherit_env" => "[]",
                "env" | "headers" => "{}",
                "disabled" | "serve_stale" | "cache" => "false",
                "timeout_ms" | "timeout" | "max_concurrent_reads" | "cache_ttl_ms" => "100",
                "type" | "transportType" => "stdio",
                _ => "x",
            };
            let e = load(&format!("servers:\n  a:\n    {key}: {value}\n")).err().map(|e| e.to_string());
            assert!(!e.as_deref().unwrap_or("").contains("unknown field"), "{key}: {e:?}");
        }
    }

    #[test]
    fn defaults_expand_when_unset_or_empty() {
        let env = |k: &str| match k {
            "SET" => Some("v".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        assert_eq!(expand_vars("${SET:-d}/${NOPE:-d2}/${EMPTY:-d3}", &env).unwrap(), "v/d2/d3");
        assert_eq!(expand_vars("${env:SET}", &env).unwrap(), "v");
        assert_eq!(expand_vars("${input:k}", &env).unwrap_err(), "input:k");
        assert!(unexpanded("env:NOPE").contains("`NOPE` is not set"));
    }

    #[test]
    fn urls_lose_userinfo_and_query() {
        assert_eq!(redact_url("https://u:p@h/x?k=1"), "https://***@h/x");
        assert_eq!(redact_url("http://h/a@b"), "http://h/a@b");
    }
}

/// Every problem of a file is reported in one run, each with its line and
/// column, in file order: two bad servers, a bad `context` value and a bad
/// `serve` value, in one load.
mod all_problems {
    use super::super::*;

    #[test]
    fn every_problem_of_a_file_is_reported_at_once() {
        let src = "servers:\n  a:\n    url: ftp://x/mcp\n  b:\n    command: x\n    colour: red\n  c:\n    command: y\n    protocol: 1999\ncontext:\n  max_tokens: 0\nserve:\n  upstream: ftp://u\n";
        let e = Config::from_yaml_with_env(src, Path::new("c.yaml"), &|_| None).unwrap_err();
        let Error::Config { more, .. } = &e else { panic!("{e:?}") };
        assert_eq!(more.len(), 4, "{e}");
        let text = e.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        let at = |i: usize, prefix: &str, words: &str| {
            assert!(lines[i].starts_with(prefix) && lines[i].contains(words), "line {i}: {text}");
        };
        at(0, "c.yaml:3:10: ", "url must start with http://");
        at(1, "c.yaml:6:", "colour");
        at(2, "c.yaml:9:", "protocol must be one of");
        at(3, "c.yaml:11:", "context.max_tokens must be at least 1");
        at(4, "c.yaml:13:", "serve.upstream must start with http://");
    }

    /// Within `serve:` too, every bad value is reported, not only the first.
    #[test]
    fn every_bad_serve_value_is_reported() {
        let src = "serve:\n  upstream: ftp://u\n  max_body_bytes: 0\n  passthrough: [\"GET /v2/x\"]\n  keys:\n    - { sha256: nothex, user: ann }\n";
        let e = Config::from_yaml_with_env(src, Path::new("c.yaml"), &|_| None).unwrap_err();
        let text = e.to_string();
        let starts: Vec<&str> = text.lines().map(|l| l.split(": ").next().unwrap()).collect();
        assert_eq!(starts, ["c.yaml:2:13", "c.yaml:3:19", "c.yaml:4:17", "c.yaml:6:17"], "{text}");
    }

    /// Within one server entry, every problem is reported (not only the
    /// entry's first), each at the value at fault.
    #[test]
    fn every_problem_of_one_server_is_reported() {
        let src = "servers:\n  a:\n    command: ${NOPE}\n    headers: { X: y }\n    timeout_ms: 0\n    max_concurrent_reads: 0\n    protocol: 1999\n";
        let e = Config::from_yaml_with_env(src, Path::new("c.yaml"), &|_| None).unwrap_err();
        let text = e.to_string();
        let starts: Vec<&str> = text.lines().map(|l| l.split(": ").next().unwrap()).collect();
        assert_eq!(starts, ["c.yaml:3:14", "c.yaml:4:14", "c.yaml:5:17", "c.yaml:6:27", "c.yaml:7:15"], "{text}");
        assert!(text.contains("NOPE") && text.contains("`headers` only apply to `url` servers"), "{text}");
    }

    /// A keys file with several bad entries reports each, in that file.
    #[test]
    fn every_bad_entry_of_a_keys_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("keys.yaml"),
            "- { sha256: nothex, user: ann }\n- { sha256: aa, user: bob }\n- { sha256: x, colour: red }\n",
        )
        .unwrap();
        let path = dir.path().join("c.yaml");
        let e = Config::from_yaml_with_env("serve:\n  keys_file: keys.yaml\n", &path, &|_| None).unwrap_err();
        let text = e.to_string();
        let keys = dir.path().join("keys.yaml").display().to_string();
        let starts: Vec<String> = text.lines().map(|l| l.split(": ").next().unwrap().replace(&keys, "k")).collect();
        assert_eq!(starts, ["k:1:13", "k:2:13", "k:3:16"], "{text}");
    }

    /// `telemetry:`: every bad value located, and a good section read.
    #[test]
    fn telemetry_values_are_checked() {
        let src = "telemetry:\n  otlp_endpoint: grpc://c:4317\n  sample_ratio: 1.5\n  service_name: \" \"\n";
        let e = Config::from_yaml_with_env(src, Path::new("c.yaml"), &|_| None).unwrap_err();
        let text = e.to_string();
        let starts: Vec<&str> = text.lines().map(|l| l.split(": ").next().unwrap()).collect();
        assert_eq!(starts, ["c.yaml:2:18", "c.yaml:3:17", "c.yaml:4:17"], "{text}");
        let c = Config::from_yaml_with_env(
            "telemetry:\n  otlp_endpoint: http://${HOST}:4318/\n",
            Path::new("c.yaml"),
            &|k| (k == "HOST").then(|| "collector".to_owned()),
        )
        .unwrap();
        let t = c.telemetry.unwrap();
        assert_eq!((t.traces_url().as_str(), t.sample_ratio), ("http://collector:4318/v1/traces", 1.0));
        assert_eq!(t.service_name, "mcp-context");
        assert!(
            Config::from_yaml_with_env("servers: {}\n", Path::new("c.yaml"), &|_| None).unwrap().telemetry.is_none()
        );
    }

    /// A file with one problem reads as before: one line.
    #[test]
    fn one_problem_is_one_line() {
        let e = Config::from_yaml_with_env("context:\n  max_tokens: 0\n", Path::new("c.yaml"), &|_| None).unwrap_err();
        assert_eq!(e.to_string(), "c.yaml:2:15: context.max_tokens must be at least 1");
    }

    /// `serve.idle_timeout_ms`: 30 s unless set; 0 is refused at its value.
    #[test]
    fn the_idle_timeout_has_a_default_and_refuses_zero() {
        let read = |yaml: &str| Config::from_yaml_with_env(yaml, Path::new("c.yaml"), &|_| None);
        let d = read("servers: {}\n").unwrap();
        assert_eq!(d.serve.idle_timeout, std::time::Duration::from_secs(30));
        let c = read("serve:\n  idle_timeout_ms: 1500\n").unwrap();
        assert_eq!(c.serve.idle_timeout, std::time::Duration::from_millis(1500));
        let e = read("serve:\n  idle_timeout_ms: 0\n").unwrap_err();
        assert_eq!(e.to_string(), "c.yaml:2:20: serve.idle_timeout_ms must be at least 1");
    }
}

mod memory_bounds {
    use super::super::*;
    use crate::compose::DEFAULT_CHUNK_INDEX_MAX_BYTES;

    fn load(src: &str) -> Result<Config> {
        Config::from_yaml_with_env(src, Path::new("/etc/mc/mcp-context.yaml"), &|_| None)
    }

    #[test]
    fn the_byte_bounds_default_and_are_read_and_a_bad_one_is_located() {
        let c = load("servers: {}\n").unwrap();
        assert_eq!(c.cache.private_max_bytes, DEFAULT_PRIVATE_MAX_BYTES);
        assert_eq!(c.context.warm_memo_max_bytes, DEFAULT_WARM_MEMO_MAX_BYTES);
        assert_eq!(c.context.chunk_index_max_bytes, DEFAULT_CHUNK_INDEX_MAX_BYTES);
        let c = load(
            "context:\n  warm_memo_max_bytes: 0\n  chunk_index_max_bytes: 5000\ncache:\n  private_max_bytes: 1000\n",
        )
        .unwrap();
        assert_eq!((c.cache.private_max_bytes, c.context.warm_memo_max_bytes), (1000, 0));
        assert_eq!(c.context.chunk_index_max_bytes, 5000);
        match load("context:\n  select: relevance\n  chunk_index_max_bytes: -1\n") {
            Err(Error::Config { line: Some(3), column: Some(_), message, .. }) => {
                assert!(message.contains("chunk_index_max_bytes") || message.contains("invalid"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        match load("cache:\n  private_max_bytes: lots\n") {
            Err(Error::Config { line: Some(2), column: Some(_), message, .. }) => {
                assert!(message.contains("private_max_bytes") || message.contains("invalid"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    #[cfg(feature = "jwt")]
    fn serve_jwt_is_read_strictly() {
        let jwt = |body: &str| load(&format!("serve:\n  jwt:\n    issuer: https://idp\n{body}"));
        let c = jwt("    audience: a\n    roles_claim: groups\n    role_map: { eng: staff, ops: [staff, oncall] }\n")
            .unwrap();
        let j = c.serve.jwt.unwrap().settings;
        assert_eq!((j.audience, j.user_claim.as_str()), (vec!["a".to_owned()], "sub"));
        assert_eq!(j.role_map["ops"], ["staff", "oncall"]);
        assert_eq!(j.algorithms, crate::identity::DEFAULT_ALGORITHMS);
        for (body, says) in [
            ("    audience: a\n    algorithms: [none]\n", "`none` is not accepted"),
            ("    audience: a\n    algorithms: [HS256]\n", "needs `hmac_secret`"),
            ("    audience: a\n    hmac_secret: short\n", "at least 32 characters"),
            ("    roles_claim: groups\n", "serve.jwt.audience"),
            ("    audience: a\n    role_map: { eng: staff }\n", "needs `roles_claim`"),
            ("    audience: a\n    jwks_url: http://k\n    jwks_file: k.json\n", "not both"),
            ("    audience: a\n    nope: 1\n", "nope"),
        ] {
            let e = jwt(body).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("/etc/mc/mcp-context.yaml:"), "{body}: {e}");
        }
        let e =
            load("serve:\n  forward_authorization: true\n  jwt: { issuer: https://idp, audience: a }\n").unwrap_err();
        assert!(e.to_string().contains("keep one"), "{e}");
    }
}

mod audit {
    use secrecy::ExposeSecret;

    use super::super::*;

    fn load(src: &str) -> Result<Config> {
        let env = |k: &str| (k == "PG_PASSWORD").then(|| "s3cret".to_owned());
        Config::from_yaml_with_env(src, Path::new("/etc/mc/mcp-context.yaml"), &env)
    }

    #[test]
    fn sinks_are_read_with_their_defaults_and_the_url_is_a_secret() {
        assert!(load("servers: {}\n").unwrap().audit.sinks.is_empty());
        let c = load(
            "audit:\n  sinks:\n    - file: { path: a/audit.jsonl }\n    - postgres: { url: \"postgres://u:${PG_PASSWORD}@db/ops\", schema: ops }\n  queue: 50\n",
        )
        .unwrap();
        assert_eq!(c.audit.queue, 50);
        assert_eq!(c.audit.batch, DEFAULT_AUDIT_BATCH);
        match &c.audit.sinks[..] {
            [AuditSink::File { path, max_bytes, keep }, AuditSink::Postgres { url, schema, table }] => {
                assert_eq!(path, Path::new("/etc/mc/a/audit.jsonl"));
                assert_eq!((*max_bytes, *keep), (DEFAULT_AUDIT_FILE_MAX_BYTES, DEFAULT_AUDIT_FILE_KEEP));
                assert_eq!(url.expose_secret(), "postgres://u:s3cret@db/ops");
                assert!(!format!("{:?}", c.audit).contains("s3cret"));
                assert_eq!((schema.as_str(), table.as_str()), ("ops", DEFAULT_AUDIT_TABLE));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_bad_sink_is_located() {
        let e = load(
            "audit:\n  sinks:\n    - file: { path: x }\n      postgres: { url: \"postgres://h/d\" }\n    - postgres: { url: \"mysql://h/d\", table: \"a-b\" }\n  batch: 0\n",
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("/etc/mc/mcp-context.yaml:3:"), "{text}");
        assert!(text.contains("either `file:` or `postgres:`"), "{text}");
        assert!(text.contains(":5:") && text.contains("must start with postgres://"), "{text}");
        assert!(text.contains("postgres.table `a-b`"), "{text}");
        assert!(text.contains(":6:") && text.contains("audit.batch must be at least 1"), "{text}");
        let e = load("audit:\n  sinks:\n    - kafka: {}\n").unwrap_err();
        assert!(e.to_string().contains(":3:"), "{e}");
    }
}

/// The `auth:` block of `url:` servers and the `credentials:` section (issue 35).
mod auth_block {
    use std::path::Path;

    use secrecy::ExposeSecret;

    use super::super::*;

    const KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes, base64

    fn env(k: &str) -> Option<String> {
        match k {
            "GW_SECRET" => Some("gw-s3cr3t-value".into()),
            "TOKEN_KEY" => Some(KEY.into()),
            _ => None,
        }
    }

    fn load(src: &str) -> Result<Config> {
        Config::from_yaml_with_env(src, Path::new("/etc/mc/mcp-context.yaml"), &env)
    }

    fn err(src: &str) -> String {
        load(src).unwrap_err().to_string()
    }

    const CRED: &str = "credentials:\n  key: ${TOKEN_KEY}\n";

    #[test]
    fn every_type_parses_with_its_fields_and_static_is_the_default() {
        let c = load(&format!(
            "servers:\n  a:\n    url: http://h/mcp\n  b:\n    url: http://h/mcp\n    auth: {{ type: per_user_headers, headers: [Authorization, X-Api-Key] }}\n  c:\n    url: http://h/mcp\n    auth:\n      type: token_exchange\n      issuer: https://idp.example\n      audience: jira\n      client_id: gw\n      client_secret: ${{GW_SECRET}}\n      scopes: [read]\n  d:\n    url: http://h/mcp\n    auth: {{ type: oauth, client_id: https://app.example/client.json, scopes: [files.read] }}\n  e:\n    url: http://h/mcp\n    auth: {{ type: static }}\n{CRED}"
        ))
        .unwrap();
        assert!(matches!(c.servers[0].auth, ServerAuth::Static));
        match &c.servers[1].auth {
            ServerAuth::PerUserHeaders(s) => assert_eq!(s.headers, ["Authorization", "X-Api-Key"]),
            other => panic!("{other:?}"),
        }
        match &c.servers[2].auth {
            ServerAuth::TokenExchange(s) => {
                assert_eq!(s.client_secret.as_ref().unwrap().expose_secret(), "gw-s3cr3t-value");
                assert_eq!(s.client_auth, ClientAuthMethod::Basic);
                assert_eq!(s.issuer.as_ref().unwrap().as_str(), "https://idp.example/");
                assert_eq!(s.audience.as_deref(), Some("jira"));
                assert_eq!(s.subject_token_type, "urn:ietf:params:oauth:token-type:access_token");
            }
            other => panic!("{other:?}"),
        }
        match &c.servers[3].auth {
            ServerAuth::OAuth(s) => {
                assert_eq!(s.client_auth, ClientAuthMethod::None);
                assert_eq!(s.scopes, ["files.read"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(!c.servers[4].auth.is_per_user());
        // The secret is one of the server's, scrubbed from what is said of it, and never in Debug.
        assert_eq!(c.servers[2].scrub("x gw-s3cr3t-value y"), "x *** y");
        assert!(!format!("{c:?}").contains("gw-s3cr3t-value"));
        assert!(!format!("{c:?}").contains(KEY));
    }

    #[test]
    fn problems_point_at_the_value_at_fault() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "servers:\n  a:\n    url: http://h/mcp\n    auth: { type: magic }\n",
                ":4:19",
                "unknown auth type `magic`",
            ),
            ("servers:\n  a:\n    url: http://h/mcp\n    auth: { type: oauth }\n", ":4:11", "needs `client_id`"),
            (
                "servers:\n  a:\n    command: x\n    auth:\n      type: per_user_headers\n      headers: [A]\n",
                ":5:13",
                "only applies to `url` servers",
            ),
            (
                "servers:\n  a:\n    url: http://h/mcp\n    auth: { type: token_exchange, client_id: c, token_endpoint: 'ftp://x' }\n",
                ":4:65",
                "token_endpoint must be an http",
            ),
            (
                "servers:\n  a:\n    url: http://h/mcp\n    auth: { type: oauth, client_id: c, colour: red }\n",
                ":4:40",
                "colour",
            ),
            (
                "servers:\n  a:\n    url: http://h/mcp\n    auth: { type: oauth, client_id: c, headers: [A] }\n",
                ":4:49",
                "does not apply",
            ),
            (
                "servers:\n  a:\n    url: http://h/mcp\n    auth: { type: per_user_headers }\n",
                ":4:11",
                "needs `headers`",
            ),
            (
                "servers:\n  a:\n    url: http://h/mcp\n    auth: { type: per_user_headers, headers: ['bad name'] }\n",
                ":4:46",
                "not a valid HTTP header name",
            ),
            (
                "servers:\n  a:\n    url: http://h/mcp\n    auth: { type: oauth, client_id: c, client_auth: post }\n",
                ":4:53",
                "needs `client_secret`",
            ),
            (
                "servers:\n  a:\n    url: http://h/mcp\n    auth: { type: token_exchange, client_id: c }\n",
                ":4:19",
                "token_endpoint` or `issuer`",
            ),
            (
                "servers:\n  a:\n    url: http://h/mcp\n    auth: { type: oauth, client_id: c, authorization_server: 'http://as/x?y=1' }\n",
                ":4:62",
                "has no query or fragment",
            ),
        ];
        for (src, at, says) in cases {
            let src = format!("{src}{CRED}");
            let e = err(&src);
            assert!(e.contains(&format!("mcp-context.yaml{at}")) && e.contains(says), "{src}\n=> {e}");
        }
    }

    #[test]
    fn credentials_default_by_cache_backend_and_the_key_is_required_for_per_user_servers() {
        let c = load("servers: {}\n").unwrap();
        assert_eq!(c.credentials.store, CredentialStoreKind::File);
        assert_eq!(c.credentials.path, Path::new("/etc/mc/.mcp-context/tokens.json"));
        assert_eq!(c.credentials.max_users, DEFAULT_MAX_USERS);
        assert_eq!(c.credentials.idle_timeout.as_millis() as u64, DEFAULT_IDLE_TIMEOUT_MS);
        let c = load("cache: { backend: redis }\n").unwrap();
        assert_eq!(c.credentials.store, CredentialStoreKind::Redis);
        let per_user = "servers:\n  a:\n    url: http://h/mcp\n    auth: { type: per_user_headers, headers: [A] }\n";
        let e = err(per_user);
        assert!(e.contains(":4:11") && e.contains("credentials.key") && e.contains(CREDENTIALS_KEY_ENV), "{e}");
        load(&format!("{per_user}credentials: {{ store: memory }}\n")).unwrap();
        let c = load(&format!(
            "{per_user}credentials:\n  store: file\n  path: tok/t.json\n  key: ${{TOKEN_KEY}}\n  idle_timeout_ms: 5\n  max_users: 3\n"
        ))
        .unwrap();
        assert_eq!(c.credentials.path, Path::new("/etc/mc/tok/t.json"));
        assert_eq!((c.credentials.max_users, c.credentials.idle_timeout.as_millis()), (3, 5));
        assert!(format!("{:?}", c.credentials).contains("<redacted>"));
        let e = err("credentials:\n  key: abc\n");
        assert!(e.contains(":2:8") && e.contains("32 bytes") || e.contains("base64"), "{e}");
        let e = err("credentials:\n  store: disk\n");
        assert!(e.contains(":2:10") && e.contains("memory, file, redis"), "{e}");
        let e = err("credentials:\n  max_users: 0\n");
        assert!(e.contains(":2:14"), "{e}");
        assert_eq!(c.credentials.auth_timeout.as_millis() as u64, DEFAULT_AUTH_TIMEOUT_MS);
        assert_eq!(load("credentials:\n  auth_timeout_ms: 250\n").unwrap().credentials.auth_timeout.as_millis(), 250);
        for bad in ["0", "600001"] {
            let e = err(&format!("credentials:\n  auth_timeout_ms: {bad}\n"));
            assert!(e.contains(":2:20") && e.contains("credentials.auth_timeout_ms must be"), "{e}");
        }
        let e = err("credentials:\n  key: ${NOPE}\n");
        assert!(e.contains("NOPE"), "{e}");
        // 64 hex digits are a key too.
        let hex = "ab".repeat(32);
        load(&format!("credentials:\n  key: {hex}\n")).unwrap();
    }
}
