//! Unit tests of the content cache.

use super::*;
use crate::resource::ContentPart;

fn state(max: usize) -> State {
    State { private_max: max, keep_expired: ["stale".to_owned()].into(), ..State::default() }
}

fn private(text: &str) -> Arc<Contents> {
    let part = ContentPart::Text { text: text.to_owned(), mime_type: None };
    Arc::new(Contents { parts: vec![part], private: true, ..Contents::default() })
}

/// Stores `text` for `user` under `server:doc`, expiring at `expires`.
fn store(s: &mut State, server: &str, user: &str, text: &str, expires: Instant) {
    let contents = private(text);
    let bytes = entry_bytes(&contents, user);
    let entry =
        Entry { contents, expires: Some(expires), epoch: 0, subscribed: false, bytes, used: AtomicU64::new(s.tick()) };
    s.store_private(&ResourceId::from_listing(server, "fx://doc"), user.to_owned(), entry, Instant::now());
}

fn users(s: &State) -> Vec<String> {
    let mut v: Vec<String> =
        s.entries.values().flat_map(|slot| slot.private.iter().flat_map(|p| p.keys().cloned())).collect();
    v.sort();
    v
}

/// The byte count is the sum of what is kept.
fn counted_right(s: &State) -> bool {
    s.private_bytes == s.entries.values().map(Slot::private_bytes).sum::<usize>()
}

#[test]
fn private_entries_stay_under_their_bound_least_recently_used_first() {
    let later = Instant::now() + Duration::from_secs(60);
    let one = entry_bytes(&private(&"x".repeat(1000)), "u00");
    let mut s = state(one * 10);
    for i in 0..10 {
        store(&mut s, "fx", &format!("u{i:02}"), &"x".repeat(1000), later);
    }
    assert_eq!(s.private_bytes, one * 10, "ten fit exactly");
    // u00 is used again: it is now the most recent.
    let id = ResourceId::from_listing("fx", "fx://doc");
    s.entries[&id].for_user("u00").unwrap().used.store(s.tick(), Ordering::Relaxed);
    store(&mut s, "fx", "u10", &"x".repeat(1000), later);
    // Over the bound: back to 7/8 of it, the oldest (u01, u02) gone first.
    assert!(s.private_bytes <= crate::lru::low_water(one * 10), "{}", s.private_bytes);
    assert!(counted_right(&s));
    let kept = users(&s);
    assert!(kept.contains(&"u00".to_owned()) && kept.contains(&"u10".to_owned()), "{kept:?}");
    assert!(!kept.contains(&"u01".to_owned()) && !kept.contains(&"u02".to_owned()), "{kept:?}");
    assert_eq!(kept.len(), 8);
    // A thousand more: never above the bound, and the count stays right.
    for i in 0..1000 {
        store(&mut s, "fx", &format!("v{i}"), &"y".repeat(500 + i % 700), later);
        assert!(s.private_bytes <= one * 10);
    }
    assert!(counted_right(&s));
}

#[test]
fn replacing_a_users_entry_counts_only_the_new_one() {
    let later = Instant::now() + Duration::from_secs(60);
    let mut s = state(1 << 20);
    store(&mut s, "fx", "ann", &"x".repeat(5000), later);
    store(&mut s, "fx", "ann", &"x".repeat(100), later);
    assert_eq!(s.private_bytes, entry_bytes(&private(&"x".repeat(100)), "ann"));
    assert!(counted_right(&s));
}

#[test]
fn an_entry_larger_than_the_bound_is_not_kept_and_zero_keeps_none() {
    let later = Instant::now() + Duration::from_secs(60);
    let mut s = state(1000);
    store(&mut s, "fx", "ann", &"x".repeat(2000), later);
    assert!(s.entries.is_empty() && s.private_bytes == 0);
    let mut s = state(0);
    store(&mut s, "fx", "ann", "x", later);
    assert!(s.entries.is_empty() && s.private_bytes == 0);
}

#[test]
fn expired_private_entries_are_swept_except_a_stale_serving_servers() {
    let now = Instant::now();
    let (past, later) = (now - Duration::from_millis(1), now + Duration::from_secs(60));
    let mut s = state(1 << 20);
    store(&mut s, "fx", "ann", "gone", past);
    store(&mut s, "fx", "ben", "kept", later);
    store(&mut s, "stale", "ann", "the fallback", past);
    let version = s.version;
    s.sweep(now);
    assert_eq!(users(&s), ["ann", "ben"]);
    assert!(s.entries[&ResourceId::from_listing("fx", "fx://doc")].for_user("ann").is_none());
    assert!(counted_right(&s));
    assert!(s.version > version, "what was built from a swept entry is void");
}

#[test]
fn invalidation_and_clearing_keep_the_count() {
    let later = Instant::now() + Duration::from_secs(60);
    let mut s = state(1 << 20);
    store(&mut s, "fx", "ann", "a", later);
    store(&mut s, "gx", "ann", "b", later);
    invalidate(&mut s, &ResourceId::from_listing("fx", "fx://doc"));
    assert!(counted_right(&s) && s.private_bytes > 0);
    s.clear();
    assert_eq!(s.private_bytes, 0);
}

fn shared_entry(text: &str) -> Entry {
    let contents = Arc::new(Contents {
        parts: vec![ContentPart::Text { text: text.to_owned(), mime_type: None }],
        ..Contents::default()
    });
    Entry { contents, expires: None, epoch: 0, subscribed: true, bytes: 0, used: AtomicU64::new(0) }
}

fn text_of(e: Option<&Entry>) -> Option<&str> {
    match e?.contents.parts.first()? {
        ContentPart::Text { text, .. } => Some(text),
        _ => None,
    }
}

/// A user's private answer is theirs alone; everyone else gets the
/// shared one (or nothing).
#[test]
fn a_private_entry_is_its_users_and_the_shared_one_everyone_elses() {
    let mut slot = Slot { shared: Some(shared_entry("for all")), private: None };
    slot.private.get_or_insert_default().insert("ann".into(), shared_entry("ann's"));
    assert_eq!(text_of(slot.for_user("ann")), Some("ann's"));
    assert_eq!(text_of(slot.for_user("bob")), Some("for all"));
    slot.shared = None;
    assert_eq!(text_of(slot.for_user("bob")), None);
    assert!(!slot.is_empty());
    assert!(Slot::default().is_empty());
}

/// An invalidation bumps the version (what was built from hits is
/// stale) and that id's generation (a read in flight for it must not
/// store its now old answer), no other id's; a resync bumps every id's,
/// those only in flight included.
#[test]
fn invalidation_bumps_the_version_and_only_that_ids_generation() {
    let mut s = state(1 << 20);
    let (a, b) = (ResourceId::from_listing("s", "fx://a"), ResourceId::from_listing("s", "fx://b"));
    store(&mut s, "s", "ann", "x", Instant::now() + Duration::from_secs(60));
    let v = s.version;
    invalidate(&mut s, &a);
    assert_eq!(s.version, v + 1);
    assert_eq!((s.generation.get(&a), s.generation.get(&b)), (Some(&1), None));
    let flight: Flight = futures::future::ready(Err(Error::NotFound { id: b.to_string() })).boxed().shared();
    s.inflight.insert(b.clone(), (flight, "ann".into()));
    bump_all(&mut s);
    assert_eq!(s.version, v + 2);
    assert_eq!((s.generation.get(&a), s.generation.get(&b)), (Some(&2), Some(&1)));
}

/// The error of a read in flight reaches every waiter whole.
#[tokio::test]
async fn every_waiter_of_a_failed_read_gets_the_same_error() {
    let flight: Flight = futures::future::ready(Err(Error::Timeout {
        server: "s".into(),
        what: "resources/read fx://a".into(),
        after_ms: 5,
    }))
    .boxed()
    .shared();
    let (one, two) = futures::join!(flight.clone(), flight);
    let (one, two) = (one.err().unwrap(), two.err().unwrap());
    assert!(one.is_timeout() && two.is_timeout());
    assert_eq!(one.to_string(), two.to_string());
}
