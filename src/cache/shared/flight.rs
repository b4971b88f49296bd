//! Single flight across replicas: the held lock released when a read ends,
//! and this replica's waiters for one resource.

use super::*;

/// Releases a held single-flight lock when the read ends or is dropped.
pub(super) struct LockGuard {
    pub(super) shared: Arc<SharedCache>,
    pub(super) key: String,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let shared = self.shared.clone();
        let key = std::mem::take(&mut self.key);
        tokio::spawn(async move {
            let mut invocation = shared.unlock.prepare_invoke();
            invocation.key(&key).arg(&shared.replica);
            let _: Option<i64> =
                shared.run("unlock", |mut c| async move { invocation.invoke_async(&mut c).await }).await;
        });
    }
}

/// This read's place among the waiters for one resource ("filled" events
/// wake them); removed when the last waiter is done or dropped.
pub(super) struct Waiting<'a> {
    shared: &'a SharedCache,
    key: &'a str,
    pub(super) notify: Arc<Notify>,
}

impl<'a> Waiting<'a> {
    pub(super) fn new(shared: &'a SharedCache, key: &'a str) -> Self {
        let notify = shared
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_owned())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone();
        Self { shared, key, notify }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiters = self.shared.waiters.lock().unwrap_or_else(|p| p.into_inner());
        // The map's reference and this one: no other waiter.
        if Arc::strong_count(&self.notify) <= 2 {
            waiters.remove(self.key);
        }
    }
}
