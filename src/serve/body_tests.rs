//! Tests of request bodies (serve/body.rs): limits, budgets, raw fields, runs.

use super::*;

#[test]
fn untouched_fields_go_out_byte_for_byte_in_order() {
    let text = r#"{"z":123456789012345678901234567890,"a":1.0,"m":[1,2],"instructions":{"x":1e400}}"#;
    let body = Bytes::from_static(text.as_bytes());
    let mut o = JsonObject::parse(&body, 64).unwrap();
    assert_eq!(String::from_utf8(o.to_vec()).unwrap(), text);
    o.set("m", raw(&["ours"]));
    o.remove("a");
    assert_eq!(
        String::from_utf8(o.to_vec()).unwrap(),
        r#"{"z":123456789012345678901234567890,"m":["ours"],"instructions":{"x":1e400}}"#
    );
}

#[test]
fn an_array_is_written_in_its_fields_place_or_last_its_first_item_shared() {
    let ours = raw(&serde_json::json!({"role": "system", "content": "a \"quoted\" line"}));
    let shared = Bytes::copy_from_slice(ours.get().as_bytes());
    let turn = raw(&serde_json::json!({"role": "user", "content": "hi"}));
    let sent = |o: &JsonObject, first: Option<Bytes>, rest: &[&RawValue]| {
        let items = first.into_iter().chain(rest.iter().map(|r| Bytes::copy_from_slice(r.get().as_bytes())));
        let items = items.map(Item::Shared).collect();
        let chunks = o.to_chunks_with("messages", items);
        let body = chunks.concat();
        assert_eq!(hyper::body::Body::size_hint(&chunks).exact(), Some(body.len() as u64));
        String::from_utf8(body).unwrap()
    };
    let b = Bytes::from_static(br#"{"model":"m","messages":[{"role":"user","content":"old"}],"n":1}"#);
    let o = JsonObject::parse(&b, 64).unwrap();
    let chunks = o.to_chunks_with(
        "messages",
        vec![Item::Shared(Bytes::copy_from_slice(turn.get().as_bytes())), Item::Shared(shared.clone())],
    );
    // The shared message is the very same bytes, not a copy.
    assert!(chunks.chunks.iter().any(|c| c.as_ptr() == shared.as_ptr() && c.len() == shared.len()));
    let last = format!(r#"{{"model":"m","messages":[{},{}],"n":1}}"#, turn.get(), ours.get());
    assert_eq!(String::from_utf8(chunks.concat()).unwrap(), last);
    let want = format!(r#"{{"model":"m","messages":[{},{}],"n":1}}"#, ours.get(), turn.get());
    assert_eq!(sent(&o, Some(shared.clone()), &[&turn]), want);
    let b = Bytes::from_static(br#"{"model":"m"}"#);
    let o = JsonObject::parse(&b, 64).unwrap();
    assert_eq!(sent(&o, Some(shared.clone()), &[]), format!(r#"{{"model":"m","messages":[{}]}}"#, ours.get()));
    assert_eq!(sent(&o, None, &[&turn, &turn]), format!(r#"{{"model":"m","messages":[{0},{0}]}}"#, turn.get()));
    let b = Bytes::from_static(b"{}");
    let o = JsonObject::parse(&b, 64).unwrap();
    assert_eq!(sent(&o, None, &[]), r#"{"messages":[]}"#);
    // A key that needs escaping is written escaped.
    let b = Bytes::from_static(br#"{"a\"b":1}"#);
    let o = JsonObject::parse(&b, 64).unwrap();
    assert_eq!(sent(&o, None, &[]), r#"{"a\"b":1,"messages":[]}"#);
    assert_eq!(String::from_utf8(o.to_vec()).unwrap(), r#"{"a\"b":1}"#);
    let parsed: serde_json::Value = serde_json::from_str(&want).unwrap();
    assert_eq!(parsed["messages"][0]["content"], "a \"quoted\" line");
}

#[test]
fn a_key_twice_or_no_object_is_refused() {
    for bad in [r#"{"messages":[],"messages":[]}"#, r#"{"user":"a","us\u0065r":"b"}"#] {
        assert_eq!(
            JsonObject::parse(&Bytes::from_static(bad.as_bytes()), 64).unwrap_err().code,
            "duplicate_key",
            "{bad}"
        );
    }
    for bad in ["[1]", "{", r#"{"a":1} x"#, "\"s\""] {
        assert_eq!(
            JsonObject::parse(&Bytes::from_static(bad.as_bytes()), 64).unwrap_err().code,
            "invalid_json",
            "{bad}"
        );
    }
}

#[test]
fn more_fields_than_the_limit_are_refused_and_long_values_are_shared_not_copied() {
    let b = Bytes::from_static(br#"{"a":1,"b":2,"c":3}"#);
    assert!(JsonObject::parse(&b, 3).is_ok());
    let e = JsonObject::parse(&b, 2).unwrap_err();
    assert_eq!((e.status.as_u16(), e.code), (400, "too_many_fields"));
    assert!(e.message.contains("serve.max_body_fields"), "{}", e.message);
    let text = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#, "x".repeat(5000));
    let body = Bytes::from(text.clone());
    let o = JsonObject::parse(&body, 8).unwrap();
    let chunks = o.to_chunks();
    assert_eq!(chunks.concat(), text.as_bytes());
    let messages = o.sent("messages").unwrap().get();
    assert!(chunks.chunks.iter().any(|c| c.as_ptr() == messages.as_ptr()), "the long value is the body's own bytes");
}

#[test]
fn runs_are_the_kept_items_text_between_the_left_out_ones() {
    let b = Bytes::from_static(b"{\"m\":[ 1 , 2,3 ,\n4,5 ]}");
    let o = JsonObject::parse(&b, 8).unwrap();
    let array = o.sent("m").unwrap();
    let mut runs = Runs::new(array);
    each_item(array, |item| runs.push(item, item.get() != "3")).unwrap();
    assert!(!runs.all_kept());
    assert_eq!(runs.finish().collect::<Vec<_>>(), ["1 , 2", "4,5"]);
    assert!(each_item(o.get("m").unwrap(), |_| ()).is_some());
    let b = Bytes::from_static(br#"{"m":{"a":1}}"#);
    assert!(each_item(JsonObject::parse(&b, 8).unwrap().get("m").unwrap(), |_| ()).is_none());
}

#[tokio::test]
async fn the_budget_is_held_while_the_body_is_and_refuses_past_it() {
    let budget = Budget::new(100);
    let h = HeaderMap::new();
    let r = read(&h, Body::from(vec![b'x'; 60]), 1000, Duration::from_secs(5), &[&budget]).await.unwrap();
    assert_eq!(budget.available(), 40);
    let e = read(&h, Body::from(vec![b'x'; 60]), 1000, Duration::from_secs(5), &[&budget]).await;
    assert_eq!(e.err().unwrap().status, 503);
    drop(r);
    assert_eq!(budget.available(), 100);
    let e = read(&h, Body::from(vec![b'x'; 60]), 50, Duration::from_secs(5), &[&budget]).await;
    assert_eq!(e.err().unwrap().status, 413);
}
