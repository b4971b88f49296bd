//! Traces (`telemetry:`), received by a real OTLP/HTTP receiver
//! (`tests/otel/receiver.py`, decoding with the OpenTelemetry protobuf
//! definitions of the `opentelemetry-proto` package, in target/py-otel,
//! which `.ci/run` installs): one request through the real `serve` binary
//! is one trace, from the caller's `traceparent` through the MCP server
//! (which logs the `_meta` of every read) to the upstream (which records
//! its headers).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::common::*;
use crate::serve::{Proxy, Upstream, chat_body, default_serve};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn python_otel() -> Result<PathBuf, String> {
    let py = Path::new(ROOT).join("target/py-otel/bin/python");
    let ok = std::process::Command::new(&py)
        .args(["-c", "import opentelemetry.proto.collector.trace.v1.trace_service_pb2"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok { Ok(py) } else { Err(format!("{} cannot import opentelemetry-proto", py.display())) }
}

/// The receiver, and the file it appends spans to.
struct Receiver {
    child: std::process::Child,
    out: PathBuf,
    port: u16,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    async fn start(py: &Path, dir: &Path) -> Receiver {
        let (port_file, out) = (dir.join("otlp.port"), dir.join("spans.jsonl"));
        let child = std::process::Command::new(py)
            .arg(Path::new(ROOT).join("tests/otel/receiver.py"))
            .args([&port_file, &out])
            .spawn()
            .unwrap();
        // Dropping the receiver kills and waits for the child.
        let mut receiver = Receiver { child, out, port: 0 };
        for _ in 0..400 {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                receiver.port = p.trim().parse().unwrap();
                return receiver;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the OTLP receiver did not start");
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The spans of `trace`, once `until` holds of them (the exporter sends batches every few seconds).
    async fn wait(&self, trace: &str, until: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        for _ in 0..600 {
            let spans: Vec<Value> = self.spans().into_iter().filter(|s| s["trace_id"] == trace).collect();
            if until(&spans) {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("spans of {trace} never arrived: {:#?}", self.spans());
    }
}

fn config(tag: &str, log: &Path, policy: &Path, port: u16, ratio: f64) -> String {
    let fx = fixture_server("fx", tag, &["--n", "3", "--record", log.to_str().unwrap(), "--record-lifecycle"]);
    format!(
        "servers:\n{fx}policy: {}\ncontext:\n  max_tokens: 4000\nserve:\n{}telemetry:\n  otlp_endpoint: http://127.0.0.1:{port}\n  sample_ratio: {ratio}\n  service_name: mcp-context-test\n",
        policy.display(),
        default_serve()
    )
}

/// `00-TRACE-SPAN-FLAGS` in parts.
fn traceparent(v: &str) -> (String, String, String) {
    let p: Vec<&str> = v.split('-').collect();
    assert_eq!((p.len(), p[0]), (4, "00"), "{v}");
    (p[1].to_owned(), p[2].to_owned(), p[3].to_owned())
}

/// The receiver, the upstream and `serve` in front of the fixture MCP
/// server (which logs each read's `_meta`), every resource visible.
struct Setup {
    receiver: Receiver,
    up: Upstream,
    log: PathBuf,
    proxy: Proxy,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start(py: &Path, ratio: f64) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let receiver = Receiver::start(py, dir.path()).await;
        let up = Upstream::start().await;
        let (log, policy) = (dir.path().join("fx.log"), dir.path().join("policy.yaml"));
        std::fs::write(&policy, "default_roles: [all]\nroles:\n  all:\n    allow: [{ server: fx, uri: \"**\" }]\n")
            .unwrap();
        let tag = tag();
        let proxy = Proxy::start_config(&config(&tag, &log, &policy, receiver.port, ratio), &up.base, tag).await;
        Setup { receiver, up, log, proxy, _dir: dir }
    }
}

#[tokio::test]
async fn one_request_is_one_trace_from_the_caller_through_the_mcp_server_to_the_upstream() {
    let py = match python_otel() {
        Ok(p) => p,
        Err(why) => return skip("one_request_is_one_trace…", &why),
    };
    let Setup { receiver, up, log, proxy, _dir } = Setup::start(&py, 1.0).await;

    let resp = proxy
        .post("/v1/chat/completions", Some("key-alice"), &chat_body("what is in the docs?"))
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .header("tracestate", "vendor=caller")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["x-mcp-context"].to_str().unwrap().contains("included=3"), "{:?}", resp.headers());
    let _ = resp.bytes().await.unwrap();

    // The upstream got the caller's trace, from our upstream span.
    let seen = up.seen();
    let (trace, upstream_parent, flags) = traceparent(&seen[0].headers["traceparent"]);
    assert_eq!((trace.as_str(), flags.as_str()), (CALLER_TRACE, "01"));
    assert_ne!(upstream_parent, CALLER_SPAN, "the upstream's parent is our span, not the caller's");
    assert_eq!(seen[0].headers["tracestate"], "vendor=caller", "the caller's trace state goes along");

    // The MCP server got it in each read's `_meta`.
    let meta: HashMap<String, (String, String, String)> = read_log(&log)
        .iter()
        .filter_map(|l| l.strip_prefix("meta "))
        .map(|l| {
            let (uri, tp) = l.split_once(' ').unwrap();
            (uri.to_owned(), traceparent(tp))
        })
        .collect();
    assert_eq!(meta.len(), 3, "every read carried the trace: {:?}", read_log(&log));
    assert!(meta.values().all(|(t, _, _)| t == CALLER_TRACE), "{meta:?}");

    let spans = receiver
        .wait(CALLER_TRACE, |s| {
            ["POST /v1/chat/completions", "chat", "mcp_context.inject"]
                .iter()
                .all(|n| s.iter().any(|x| x["name"] == *n))
                && s.iter().filter(|x| x["name"] == "mcp.read").count() == 3
        })
        .await;
    let by_id: HashMap<&str, &Value> = spans.iter().map(|s| (s["span_id"].as_str().unwrap(), s)).collect();
    let parent_name =
        |s: &Value| by_id.get(s["parent_span_id"].as_str().unwrap()).map(|p| p["name"].as_str().unwrap().to_owned());
    let one = |name: &str| -> &Value {
        let found: Vec<&Value> = spans.iter().filter(|s| s["name"] == name).collect();
        assert_eq!(found.len(), 1, "one {name}: {spans:#?}");
        found[0]
    };
    // The root continues the caller's span.
    let root = spans.iter().find(|s| s["parent_span_id"] == CALLER_SPAN).unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(root["kind"], 2, "a server span");
    assert_eq!(root["name"], "POST /v1/chat/completions");
    assert_eq!(root["attributes"]["http.response.status_code"], 200);
    assert!(spans.iter().all(|s| s["service"] == "mcp-context-test"));
    let root_name = Some(root["name"].as_str().unwrap().to_owned());
    assert_eq!(parent_name(one("mcp_context.identity")), root_name);
    let inject = one("mcp_context.inject");
    assert_eq!(parent_name(inject), root_name);
    assert_eq!(inject["attributes"]["included"], 3);
    for step in ["mcp_context.select", "mcp_context.read", "mcp_context.compose"] {
        assert_eq!(parent_name(one(step)).as_deref(), Some("mcp_context.inject"), "{step}");
    }
    // One span per MCP read, each the parent the server was given.
    let reads: Vec<&Value> = spans.iter().filter(|s| s["name"] == "mcp.read").collect();
    assert_eq!(reads.len(), 3);
    for r in &reads {
        assert_eq!(parent_name(r).as_deref(), Some("mcp_context.read"));
        assert_eq!((r["attributes"]["server"].as_str(), r["attributes"]["cache"].as_str()), (Some("fx"), Some("miss")));
        let uri = r["attributes"]["uri"].as_str().unwrap();
        assert_eq!(meta[uri].1, r["span_id"].as_str().unwrap(), "the server's parent for {uri} is its mcp.read span");
    }
    // The upstream span: a client span with the GenAI attributes of the answer.
    let upstream = spans.iter().find(|s| s["span_id"] == upstream_parent.as_str()).expect("the upstream's parent span");
    assert_eq!(upstream["name"], "chat");
    assert_eq!(upstream["kind"], 3, "a client span");
    assert_eq!(parent_name(upstream), root_name);
    let a = &upstream["attributes"];
    assert_eq!(
        (
            &a["gen_ai.operation.name"],
            &a["gen_ai.response.model"],
            &a["gen_ai.usage.input_tokens"],
            &a["gen_ai.usage.output_tokens"]
        ),
        (&Value::from("chat"), &Value::from("gpt-4o"), &Value::from(1), &Value::from(1))
    );

    // The second, identical request is answered from this process's cache:
    // a trace of its own (no `traceparent` sent), no span per resource, and
    // the read step says how many the cache answered.
    let before = read_log(&log).len();
    let resp =
        proxy.post("/v1/chat/completions", Some("key-alice"), &chat_body("what is in the docs?")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await.unwrap();
    let (trace2, _, _) = traceparent(&up.seen()[1].headers["traceparent"]);
    assert_ne!(trace2, CALLER_TRACE);
    let spans2 = receiver.wait(&trace2, |s| s.iter().any(|x| x["name"] == "mcp_context.inject")).await;
    assert!(spans2.iter().all(|s| s["name"] != "mcp.read"), "{spans2:#?}");
    let read2 = spans2.iter().find(|s| s["name"] == "mcp_context.read").unwrap_or_else(|| panic!("{spans2:#?}"));
    assert_eq!(
        (&read2["attributes"]["resources"], &read2["attributes"]["cache_hits"]),
        (&Value::from(3), &Value::from(3))
    );
    assert_eq!(read_log(&log).len(), before, "nothing read again");
}

/// `sample_ratio: 0`: new traces are not kept (nothing exported), yet the
/// services downstream still see one trace per request, flagged `00`: the
/// upstream's `traceparent` and every MCP read's `_meta` name the same trace
/// id. A caller's unsampled trace is passed on as it came (its trace id, its
/// span as parent, flags `00`, its trace state) and not exported; a caller's
/// sampled trace is followed.
#[tokio::test]
async fn sampling_follows_the_ratio_and_the_callers_decision() {
    let py = match python_otel() {
        Ok(p) => p,
        Err(why) => return skip("sampling_follows_the_ratio…", &why),
    };
    let Setup { receiver, up, log, proxy, _dir } = Setup::start(&py, 0.0).await;
    let resp = proxy.post("/v1/chat/completions", Some("key-bob"), &chat_body("unsampled")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await.unwrap();
    let (unsampled, _, flags) = traceparent(&up.seen()[0].headers["traceparent"]);
    assert_eq!(flags, "00", "a trace not kept says so downstream");
    let metas: Vec<(String, String, String)> = read_log(&log)
        .iter()
        .filter_map(|l| l.strip_prefix("meta "))
        .map(|l| traceparent(l.split_once(' ').unwrap().1))
        .collect();
    assert_eq!(metas.len(), 3, "every read carried a trace: {:?}", read_log(&log));
    assert!(metas.iter().all(|(t, _, f)| *t == unsampled && f == "00"), "one unsampled trace downstream: {metas:?}");

    const OTHER: &str = "0af7651916cd43dd8448eb211c80319c";
    traced(&proxy, "unsampled by the caller", &format!("00-{OTHER}-b7ad6b7169203331-00"), Some("vendor=caller")).await;
    let seen = &up.seen()[1].headers;
    assert_eq!(seen["traceparent"], format!("00-{OTHER}-b7ad6b7169203331-00"), "passed on as it came");
    assert_eq!(seen["tracestate"], "vendor=caller");
    // A trace state that is not W3C's is not relayed as the caller wrote it.
    traced(&proxy, "forged trace state", &format!("00-{OTHER}-b7ad6b7169203331-00"), Some("=x,{}=\"injected\",a=b=c"))
        .await;
    assert!(!up.seen()[2].headers.contains_key("tracestate"), "{:?}", up.seen()[2].headers);

    traced(&proxy, "sampled by the caller", &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"), None).await;
    receiver.wait(CALLER_TRACE, |s| s.iter().any(|x| x["parent_span_id"] == CALLER_SPAN)).await;
    let spans = receiver.spans();
    assert!(spans.iter().all(|s| s["trace_id"] != unsampled.as_str()), "nothing of the unsampled trace");
    assert!(spans.iter().all(|s| s["trace_id"] != OTHER), "nothing of the caller's unsampled trace");
}

/// One chat request of bob's carrying the caller's `traceparent` (and `tracestate`), answered 200.
async fn traced(proxy: &Proxy, question: &str, traceparent: &str, tracestate: Option<&str>) {
    let mut req = proxy.post("/v1/chat/completions", Some("key-bob"), &chat_body(question));
    req = req.header("traceparent", traceparent);
    if let Some(state) = tracestate {
        req = req.header("tracestate", state);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await.unwrap();
}

/// `sample_ratio: 0.5` keeps about half of the new traces, decided once per
/// request: every request the upstream saw flagged `01` is exported whole
/// (its request, inject and upstream spans), none flagged `00` is.
#[tokio::test]
async fn a_ratio_keeps_that_share_of_whole_traces() {
    let py = match python_otel() {
        Ok(p) => p,
        Err(why) => return skip("a_ratio_keeps_that_share…", &why),
    };
    let Setup { receiver, up, proxy, _dir, .. } = Setup::start(&py, 0.5).await;
    const N: usize = 120;
    for i in 0..N {
        let body = chat_body(&format!("request {i}"));
        let resp = proxy.post("/v1/chat/completions", Some("key-bob"), &body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let _ = resp.bytes().await.unwrap();
    }
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for seen in up.seen() {
        let (trace, _, flags) = traceparent(&seen.headers["traceparent"]);
        if flags == "01" { kept.push(trace) } else { dropped.push(trace) }
    }
    assert_eq!(kept.len() + dropped.len(), N);
    // Binomial(120, 0.5): outside 30..=90 has a probability below 1e-7.
    assert!((30..=90).contains(&kept.len()), "kept {} of {N}", kept.len());
    let whole = |s: &[Value]| {
        ["POST /v1/chat/completions", "chat", "mcp_context.inject"].iter().all(|n| s.iter().any(|x| x["name"] == *n))
    };
    for trace in &kept {
        receiver.wait(trace, whole).await;
    }
    let spans = receiver.spans();
    // The traces of chat requests (the proxy's own health checks at start are traces of their own).
    let exported: std::collections::HashSet<&str> = spans
        .iter()
        .filter(|s| s["name"] == "POST /v1/chat/completions")
        .filter_map(|s| s["trace_id"].as_str())
        .collect();
    assert_eq!(exported.len(), kept.len(), "one exported trace per kept request, no other");
    assert!(dropped.iter().all(|t| !exported.contains(t.as_str())), "no span of a trace not kept");
}
