//! Unit tests of the streaming reader of large answers.

use super::*;
use proptest::prelude::*;

fn decode(line: &str, max_text: usize, chunk: usize) -> Option<ServerJsonRpcMessage> {
    let mut d = LargeAnswer::new(max_text, 99);
    for c in line.as_bytes().chunks(chunk.max(1)) {
        d.feed(c);
    }
    d.finish()
}

fn read_result(m: Option<ServerJsonRpcMessage>) -> (RequestId, ReadResourceResult) {
    match m {
        Some(JsonRpcMessage::Response(r)) => match r.result {
            ServerResult::ReadResourceResult(x) => (r.id, x),
            other => panic!("not a read result: {other:?}"),
        },
        other => panic!("not a response: {other:?}"),
    }
}

#[test]
fn keeps_the_first_bytes_of_text_and_counts_the_rest() {
    let line = r#"{"jsonrpc":"2.0","id":7,"result":{"contents":[{"uri":"a://1","mimeType":"text/plain","text":"h\u00e9llo \"w\"\n"},{"uri":"a://2","blob":"AAAA"}],"ttlMs":5000}}"#;
    for chunk in [1, 2, 3, 7, 1000] {
        let (id, r) = read_result(decode(line, 3, chunk));
        assert_eq!(id, RequestId::Number(7));
        assert_eq!(r.ttl_ms, Some(5000));
        let ResourceContents::TextResourceContents { uri, mime_type, text, meta } = &r.contents[0] else { panic!() };
        assert_eq!((uri.as_str(), mime_type.as_deref(), text.as_str()), ("a://1", Some("text/plain"), "hé"));
        assert_eq!(marks(meta.as_ref()), (8, None), "llo \"w\"\n is 8 bytes");
        let ResourceContents::BlobResourceContents { blob, meta, .. } = &r.contents[1] else { panic!() };
        assert_eq!((blob.as_str(), marks(meta.as_ref())), ("", (0, Some(4))));
    }
}

#[test]
fn a_cut_in_the_middle_of_a_character_drops_it() {
    let (_, r) =
        read_result(decode(r#"{"id":"x","jsonrpc":"2.0","result":{"contents":[{"uri":"u","text":"aé"}]}}"#, 2, 1));
    let ResourceContents::TextResourceContents { text, meta, .. } = &r.contents[0] else { panic!() };
    assert_eq!((text.as_str(), marks(meta.as_ref()).0), ("a", 2));
}

#[test]
fn what_cannot_be_cut_is_an_error_for_its_id_wherever_the_id_is() {
    for line in [
        r#"{"jsonrpc":"2.0","result":{"resources":[{"uri":"x","name":"n"}]},"id":5}"#,
        r#"{"jsonrpc":"2.0","id":5,"error":{"code":1,"message":"m"}}"#,
        r#"{"jsonrpc":"2.0","id":5,"result":{"contents":[{"uri":"x","text":"trunc"#,
    ] {
        match decode(line, 10, 4) {
            Some(JsonRpcMessage::Error(e)) => {
                assert_eq!(e.id, Some(RequestId::Number(5)));
                assert_eq!(e.error.code.0, TOO_LARGE);
                assert_eq!(e.error.message, "answer larger than 99 bytes");
            }
            other => panic!("{line}: {other:?}"),
        }
    }
    assert!(decode("not json at all", 10, 3).is_none());
}

proptest! {
    /// Under the cap, split anywhere: the same text serde_json decodes.
    #[test]
    fn agrees_with_serde_json(text in "\\PC{0,40}", chunk in 1usize..9, cap in 0usize..64) {
        let line = serde_json::json!({"jsonrpc":"2.0","id":1,"result":{"contents":[{"uri":"u","text":text}]}}).to_string();
        let (_, r) = read_result(decode(&line, cap, chunk));
        let ResourceContents::TextResourceContents { text: got, meta, .. } = &r.contents[0] else { panic!() };
        prop_assert!(text.starts_with(got.as_str()));
        prop_assert!(got.len() <= cap);
        prop_assert_eq!(got.len() + marks(meta.as_ref()).0, text.len());
        if text.len() <= cap { prop_assert_eq!(got, &text); }
    }
}
