//! Unit tests of the child-process pipe.

use super::*;
use rmcp::model::{ClientRequest, ReadResourceRequest, ReadResourceRequestParams, ServerNotification};

fn rmcp_decode(raw: &str) -> Option<ReadResourceResult> {
    serde_json::from_str(raw).ok()
}

#[test]
fn fast_decoding_agrees_with_rmcp() {
    let cases = [
        r#"{"contents":[{"uri":"a://1","mimeType":"text/plain","text":"line\nline \"q\" \u00e9 \ud83d\ude00"}]}"#,
        r#"{"contents":[{"uri":"a://1","mimeType":"image/png","blob":"AAEC"}]}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"},{"uri":"a://1#2","blob":"AA=="},{"uri":"a://1#3","text":""}]}"#,
        r#"{"contents":[]}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"}],"ttlMs":5000}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"}],"ttlMs":-3}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"}],"cacheScope":"private"}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"}],"cacheScope":""}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"}],"resultType":"complete"}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"}],"_meta":{"k":1}}"#,
        r#"{"contents":[{"uri":"a://1","text":"x","_meta":{"k":1}}]}"#,
        r#"{"contents":[{"uri":"a://1","text":"x","blob":"AA=="}]}"#,
        r#"{"contents":[{"uri":"a://1"}]}"#,
        r#"{"contents":[{"text":"no uri"}]}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"}],"ttlMs":null,"unknown":[1,2]}"#,
        // 2026-07-28 answers: decoded on the fast path, the same as rmcp.
        r#"{"contents":[{"uri":"a://1","text":"x"}],"resultType":"complete","ttlMs":0,"cacheScope":"private"}"#,
        r#"{"contents":[{"uri":"a://1","blob":"AA=="}],"resultType":"complete","ttlMs":3600000,"cacheScope":"public"}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"}],"ttlMs":1.5}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"}],"cacheScope":"shared"}"#,
        r#"{"contents":[{"uri":"a://1","text":"x"}],"cacheScope":null}"#,
        r#"{"contents":"not a list"}"#,
        r#"{"resources":[]}"#,
    ];
    for raw in cases {
        assert_eq!(decode_read_result(raw), rmcp_decode(raw), "for {raw}");
    }
}

/// A result that is not `complete` is not a read result: the fast path
/// must hand it on whole, whatever else it carries.
#[test]
fn unfinished_results_are_left_to_rmcp() {
    for t in ["input_required", "task", "COMPLETE", ""] {
        let raw = format!(r#"{{"contents":[],"resultType":"{t}","ttlMs":0,"cacheScope":"private"}}"#);
        assert_eq!(decode_read_result(&raw), None, "{raw}");
    }
}

/// Fails when rmcp's read result (or one of its parts) gains a field: the
/// fast path ignores fields it does not know, and a new one may change
/// what a result means (as `resultType` did). Teach the fast path the new
/// field (or to hand results with it to rmcp), then add it to the list.
#[test]
fn the_fast_path_knows_every_field_of_a_read_result() {
    let part = ResourceContents::TextResourceContents {
        uri: "a://1".into(),
        mime_type: Some("text/plain".into()),
        text: "x".into(),
        meta: Some(Default::default()),
    };
    let mut result = ReadResourceResult::new(vec![part]).with_ttl_ms(1);
    result.cache_scope = Some(rmcp::model::CacheScope::Private);
    result.meta = Some(Default::default());
    let json = serde_json::to_value(&result).unwrap();
    let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
    for k in &keys {
        assert!(READ_RESULT_FIELDS.contains(&k.as_str()), "rmcp's ReadResourceResult has a new field `{k}`");
    }
    assert_eq!(keys.len(), READ_RESULT_FIELDS.len(), "{keys:?}");
    let blob = ResourceContents::BlobResourceContents {
        uri: "a://1".into(),
        mime_type: Some("image/png".into()),
        blob: "AA==".into(),
        meta: Some(Default::default()),
    };
    for part in [&json["contents"][0], &serde_json::to_value(&blob).unwrap()] {
        for k in part.as_object().unwrap().keys() {
            assert!(READ_PART_FIELDS.contains(&k.as_str()), "rmcp's ResourceContents has a new field `{k}`");
        }
    }
    // Same names as the decoder's.
    let probe = r#"{"contents":[{"uri":"u","text":"t"}],"resultType":"complete","ttlMs":5,"cacheScope":"public"}"#;
    let fast = decode_read_result(probe).unwrap();
    assert_eq!((fast.ttl_ms, fast.cache_scope), (Some(5), Some(rmcp::model::CacheScope::Public)));
}

/// A real child process printing scripted lines; the pipe must frame
/// them the way rmcp's transport does.
fn scripted(lines: &str) -> ChildPipe {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c").arg(format!("cat >/dev/null & printf '{lines}'; wait"));
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).process_group(0);
    ChildPipe::new(cmd.spawn().expect("sh"), Diagnostics::new("t"), 1 << 20).expect("pipes")
}

fn read_request(id: i64, uri: &str) -> ClientJsonRpcMessage {
    JsonRpcMessage::request(
        ClientRequest::ReadResourceRequest(ReadResourceRequest::new(ReadResourceRequestParams::new(uri))),
        RequestId::Number(id),
    )
}

#[tokio::test]
async fn frames_lines_like_rmcp_and_skips_what_is_not_a_message() {
    let long = "x".repeat(300);
    let script = [
        "\\357\\273\\277{\"jsonrpc\":\"2.0\",\"method\":\"notifications/resources/list_changed\"}\\n".to_owned(),
        "\\n   \\n".to_owned(),
        "not json at all\\n".to_owned(),
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{{\"contents\":[{{\"uri\":\"{long}\",\"text\":\"t\"}}]}}}}\\n"
        ),
        format!(
            "{{\"jsonrpc\":\"2.0\",\"result\":{{\"resources\":[{{\"uri\":\"{long}\",\"name\":\"n\"}}]}},\"id\":10}}\\n"
        ),
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"contents\":[{\"uri\":\"a://1\",\"text\":\"one\"}]}}\\r\\n"
            .to_owned(),
        "{\"jsonrpc\":\"2.0\",\"id\":2,\"error\":{\"code\":-32002,\"message\":\"nope\"}}\\n".to_owned(),
        "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"contents\":[{\"uri\":\"a://3\",\"text\":\"three\"}],\"ttlMs\":7}}"
            .to_owned(),
    ]
    .concat();
    let mut pipe = scripted(&script);
    pipe.max_line = 200;
    for id in 1..=3 {
        pipe.send(read_request(id, "a://x")).await.expect("queued");
    }
    let notification = pipe.receive().await.expect("BOM-prefixed notification");
    assert!(matches!(
        notification,
        JsonRpcMessage::Notification(n) if matches!(n.notification, ServerNotification::ResourceListChangedNotification(_))
    ));
    // Blank lines and junk are skipped; the over-long read answer (id 9) is decoded as it
    // arrives; the over-long listing (id 10) cannot be cut and fails its request at once.
    let JsonRpcMessage::Response(nine) = pipe.receive().await.expect("answer 9") else { panic!("not a response") };
    assert_eq!(nine.id, RequestId::Number(9));
    let ServerResult::ReadResourceResult(r) = nine.result else { panic!("not a read result") };
    assert!(
        matches!(&r.contents[0], ResourceContents::TextResourceContents { text, uri, .. } if text == "t" && uri == &long)
    );
    let JsonRpcMessage::Error(ten) = pipe.receive().await.expect("error 10") else { panic!("not an error") };
    assert_eq!(ten.id, Some(RequestId::Number(10)));
    assert_eq!(ten.error.message, "answer larger than 200 bytes");
    assert_eq!(pipe.diag.first_junk().as_deref(), Some("'not json at all'"));
    let JsonRpcMessage::Response(one) = pipe.receive().await.expect("answer 1") else { panic!("not a response") };
    assert_eq!(one.id, RequestId::Number(1));
    let ServerResult::ReadResourceResult(r) = one.result else { panic!("not a read result") };
    assert!(matches!(&r.contents[0], ResourceContents::TextResourceContents { text, .. } if text == "one"));
    let JsonRpcMessage::Error(two) = pipe.receive().await.expect("error 2") else { panic!("not an error") };
    assert_eq!(two.id, Some(RequestId::Number(2)));
    // The last line has no newline; EOF ends it as rmcp would not deliver it either.
    assert!(pipe.receive().await.is_none());
    assert!(pipe.reads.lock().unwrap().contains(&RequestId::Number(3)));
    assert!(!pipe.reads.lock().unwrap().contains(&RequestId::Number(1)), "answered ids are forgotten");
    pipe.close().await.expect("close");
}

#[tokio::test]
async fn queued_writes_all_arrive_in_order_and_close_ends_the_child() {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c").arg("cat");
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).process_group(0);
    let mut pipe = ChildPipe::new(cmd.spawn().expect("sh"), Diagnostics::new("t"), 1 << 20).expect("pipes");
    let n = 2000;
    for id in 0..n {
        pipe.send(read_request(id, &format!("a://{id}"))).await.expect("queued");
    }
    // `cat` echoes our requests back; rmcp's decoder reads them as requests (rmcp's own shape rules).
    for id in 0..n {
        match pipe.receive().await.expect("echo") {
            JsonRpcMessage::Request(r) => assert_eq!(r.id, RequestId::Number(id)),
            other => panic!("unexpected {other:?}"),
        }
    }
    tokio::time::timeout(std::time::Duration::from_secs(5), pipe.close())
        .await
        .expect("cat exits on EOF")
        .expect("close");
    assert!(pipe.send(read_request(0, "a://0")).await.is_err(), "a closed pipe refuses to send");
}
