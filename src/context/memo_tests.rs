//! Tests of `memo.rs`.
use super::*;
use crate::config::Config;
use crate::mode::MessageRole;

fn key(user: &str) -> WarmKey {
    WarmKey {
        user: user.into(),
        roles: Vec::new(),
        source: None,
        model: "gpt-4o".into(),
        budget: None,
        select: None,
        query: None,
    }
}

fn entry(policy: &Arc<Policy>, message_bytes: usize) -> WarmEntry {
    let message = ContextMessage {
        role: MessageRole::System,
        content: Arc::new("m".repeat(message_bytes)),
        tokens: 1,
        derived: Default::default(),
    };
    WarmEntry {
        policy: policy.clone(),
        listing_generation: 0,
        stamp: CacheStamp { version: 0, expires: None },
        connections: Connections(Vec::new()),
        message: Some(message),
        report: Report::default(),
    }
}

async fn hub() -> Hub {
    let config = Config::from_yaml_with_env("{}", std::path::Path::new("/c.yaml"), &|_| None).unwrap();
    Hub::connect(&config).await
}

#[tokio::test]
async fn the_warm_memo_stays_under_its_bytes_least_recently_used_first() {
    let (hub, policy) = (hub().await, Arc::new(Policy::allow_all()));
    let one = entry(&policy, 10_000).bytes(&key("u00"));
    let memo = WarmMemo::new(one * 10);
    for i in 0..10 {
        memo.put(key(&format!("u{i:02}")), entry(&policy, 10_000));
    }
    assert_eq!((memo.len(), memo.bytes()), (10, one * 10));
    // u00 answers again: the most recent now.
    assert!(memo.get(&key("u00"), &policy, 0, 0, &hub).is_some());
    memo.put(key("u10"), entry(&policy, 10_000));
    assert!(memo.bytes() <= crate::lru::low_water(one * 10));
    assert!(memo.get(&key("u00"), &policy, 0, 0, &hub).is_some(), "used lately: kept");
    assert!(memo.get(&key("u10"), &policy, 0, 0, &hub).is_some(), "the newest: kept");
    assert!(memo.get(&key("u01"), &policy, 0, 0, &hub).is_none(), "the oldest: gone");
    for i in 0..1000 {
        memo.put(key(&format!("v{i}")), entry(&policy, 5_000 + i * 7));
        assert!(memo.bytes() <= one * 10);
    }
    // The count is the sum of what is kept.
    let w = memo.entries.lock().unwrap();
    assert_eq!(w.bytes, w.users.values().map(|s| s.bytes).sum::<usize>());
}

#[test]
fn a_users_new_answer_replaces_the_old_and_one_too_large_is_not_kept() {
    let policy = Arc::new(Policy::allow_all());
    let memo = WarmMemo::new(50_000);
    memo.put(key("ann"), entry(&policy, 20_000));
    memo.put(key("ann"), entry(&policy, 1_000));
    assert_eq!((memo.len(), memo.bytes()), (1, entry(&policy, 1_000).bytes(&key("ann"))));
    // Too large for the bound: not kept, and ann's old answer is gone too.
    memo.put(key("ann"), entry(&policy, 60_000));
    assert_eq!((memo.len(), memo.bytes()), (0, 0));
    let off = WarmMemo::new(0);
    off.put(key("ann"), entry(&policy, 1));
    assert_eq!(off.len(), 0);
}

#[test]
fn an_answers_bytes_count_its_message_report_and_query() {
    let policy = Arc::new(Policy::allow_all());
    let mut e = entry(&policy, 4_000);
    let small = e.bytes(&key("ann"));
    assert!(small >= 4_000);
    e.report.excluded.push(Excluded {
        id: "fx:fx://doc".into(),
        reason: crate::report::ExcludeReason::Budget,
        detail: Some("d".repeat(3_000)),
    });
    let k = WarmKey { query: Some("q".repeat(16_000)), ..key("ann") };
    assert!(e.bytes(&k) >= small + 19_000);
}

/// A warm answer is served while nothing it was made from changed, and
/// not once any one thing did: the policy (a new `Arc`, even with the
/// same rules), the listing generation, the cache's version, an expired
/// entry, or anything else the request asks (model, budget, mode, query).
#[tokio::test]
async fn a_warm_answer_lives_exactly_as_long_as_its_inputs() {
    let (hub, policy) = (hub().await, Arc::new(Policy::allow_all()));
    let memo = WarmMemo::new(1 << 20);
    memo.put(key("ann"), entry(&policy, 10));
    // What does not invalidate: asking again, another user's answer.
    assert!(memo.get(&key("ann"), &policy, 0, 0, &hub).is_some());
    memo.put(key("bob"), entry(&policy, 10));
    assert!(memo.get(&key("ann"), &policy, 0, 0, &hub).is_some());
    // What does.
    let same_rules = Arc::new(Policy::allow_all());
    assert!(memo.get(&key("ann"), &same_rules, 0, 0, &hub).is_none(), "a replaced policy");
    assert!(memo.get(&key("ann"), &policy, 1, 0, &hub).is_none(), "a new listing");
    assert!(memo.get(&key("ann"), &policy, 0, 1, &hub).is_none(), "a cache change");
    for other in [
        WarmKey { model: "gpt-4.1".into(), ..key("ann") },
        WarmKey { budget: Some(10), ..key("ann") },
        WarmKey { select: Some(SelectMode::Relevance), ..key("ann") },
        WarmKey { query: Some("q".into()), ..key("ann") },
    ] {
        assert!(memo.get(&other, &policy, 0, 0, &hub).is_none());
    }
    // None of these lookups removed it: the unchanged request still hits.
    assert!(memo.get(&key("ann"), &policy, 0, 0, &hub).is_some());
    let mut expired = entry(&policy, 10);
    expired.stamp.expires = Some(Instant::now());
    memo.put(key("ann"), expired);
    assert!(memo.get(&key("ann"), &policy, 0, 0, &hub).is_none(), "an expired entry");
    // An answer that read a server whose connection is gone.
    let mut gone = entry(&policy, 10);
    gone.connections = Connections(vec![("nowhere".into(), 0)]);
    memo.put(key("ann"), gone);
    assert!(memo.get(&key("ann"), &policy, 0, 0, &hub).is_none(), "a connection that is not up");
    memo.clear();
    assert!(memo.get(&key("bob"), &policy, 0, 0, &hub).is_none(), "cleared");
}

fn decision_key(policy: &Policy, user: &str) -> DecisionKey {
    policy.for_user(user).decision_key()
}

/// A selection is made once per grant set, listing generation and policy
/// (the very same `Arc`), and again when any of them changes.
#[test]
fn a_selection_is_remade_only_for_a_new_listing_or_policy() {
    let policy = Arc::new(Policy::allow_all());
    let memo = SelectionMemo::default();
    let made = std::cell::Cell::new(0);
    let make = || {
        made.set(made.get() + 1);
        Selection { resources: Vec::new(), excluded: Vec::new() }
    };
    let k = decision_key(&policy, "ann");
    let first = memo.get_or(k.clone(), 0, &policy, make);
    let again = memo.get_or(decision_key(&policy, "bob"), 0, &policy, make);
    assert!(Arc::ptr_eq(&first, &again), "users with the same grants share one selection");
    assert_eq!(made.get(), 1);
    memo.get_or(k.clone(), 1, &policy, make);
    assert_eq!(made.get(), 2, "a new listing generation");
    let reloaded = Arc::new(Policy::allow_all());
    memo.get_or(k.clone(), 1, &reloaded, make);
    assert_eq!(made.get(), 3, "a reloaded policy, though its rules are the same");
    memo.get_or(k.clone(), 1, &reloaded, make);
    assert_eq!(made.get(), 3);
    memo.clear();
    memo.get_or(k, 1, &reloaded, make);
    assert_eq!(made.get(), 4, "cleared");
}

fn resource(id: &str, title: Option<&str>) -> Arc<Resource> {
    let mut r = Resource::unlisted(crate::id::ResourceId::parse(id).unwrap());
    r.title = title.map(Into::into);
    Arc::new(r)
}

fn composition_key(selection: &Arc<Selection>, contents: &Arc<Contents>, mode: SelectMode) -> CompositionKey {
    CompositionKey {
        encoding: "o200k_base",
        preamble: "p".into(),
        budget: 100,
        mode,
        query: Some("q".into()),
        selection: selection.clone(),
        ready: vec![(0, contents.clone())],
    }
}

/// A composition is reused only for the very same contents (the same
/// `Arc`, not equal text), budget, encoding, preamble and listing
/// metadata; in priority mode a new question still hits.
#[test]
fn a_composition_is_reused_only_for_the_same_inputs() {
    let selection = Arc::new(Selection { resources: vec![resource("s:a://1", None)], excluded: Vec::new() });
    let contents = Arc::new(Contents::default());
    let key = composition_key(&selection, &contents, SelectMode::Priority);
    assert!(key.matches(&key.inputs()));
    // Not invalidating: a new question in priority mode, an equal listing
    // of another generation.
    let new_question = CompositionInputs { query: Some("other"), ..key.inputs() };
    assert!(key.matches(&new_question));
    let relisted = Arc::new(Selection { resources: vec![resource("s:a://1", None)], excluded: Vec::new() });
    assert!(key.matches(&CompositionInputs { selection: &relisted, ..key.inputs() }));
    // Invalidating.
    let retitled = Arc::new(Selection { resources: vec![resource("s:a://1", Some("T"))], excluded: Vec::new() });
    assert!(!key.matches(&CompositionInputs { selection: &retitled, ..key.inputs() }), "a new title");
    let reread = [(0, Arc::new(Contents::default()))];
    assert!(!key.matches(&CompositionInputs { ready: &reread, ..key.inputs() }), "contents read again");
    assert!(!key.matches(&CompositionInputs { ready: &[], ..key.inputs() }), "a resource fewer");
    assert!(!key.matches(&CompositionInputs { budget: 99, ..key.inputs() }), "another budget");
    assert!(!key.matches(&CompositionInputs { encoding: "cl100k_base", ..key.inputs() }), "another encoding");
    assert!(!key.matches(&CompositionInputs { preamble: "P", ..key.inputs() }), "another preamble");
    assert!(!key.matches(&CompositionInputs { mode: SelectMode::Relevance, ..key.inputs() }), "another mode");
    let relevance = composition_key(&selection, &contents, SelectMode::Relevance);
    assert!(!relevance.matches(&CompositionInputs { query: Some("other"), ..relevance.inputs() }), "a new question");
    // The memo keeps the last few, one per distinct key.
    let memo = CompositionMemo::default();
    let composed = || {
        Arc::new(Composed::from(Composition {
            content: None,
            tokens: 0,
            included: Vec::new(),
            dropped: Vec::new(),
            semantic: None,
        }))
    };
    memo.put(composition_key(&selection, &contents, SelectMode::Priority), composed());
    memo.put(composition_key(&selection, &contents, SelectMode::Priority), composed());
    assert_eq!(memo.entries.lock().unwrap().len(), 1);
    assert!(memo.find(&key.inputs()).is_some());
    for budget in 0..COMPOSITION_MEMO_SIZE {
        memo.put(CompositionKey { budget, ..composition_key(&selection, &contents, SelectMode::Priority) }, composed());
    }
    assert!(memo.find(&key.inputs()).is_none(), "pushed out by newer ones");
}
