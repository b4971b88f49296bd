//! Byte bounds for what is kept between requests: which least recently
//! used items to drop so that a store (the private cache entries, the warm
//! memo, relevance mode's chunk index) stays under its bound.
//!
//! Stores count the approximate bytes of what they keep and stamp each item
//! with a use tick. Past the bound, one pass drops the oldest items until
//! the store is down to [`LOW_WATER`] of its bound, so the pass (a sort of
//! the items' ticks) runs once per many stores, not on every one.
//!
//! Layer: bottom. Imports only `resource` (to size contents).

/// Share of the bound a store is brought back to when it goes over
/// (numerator over 8): 7/8, i.e. 8 MiB of head room under a 64 MiB bound.
const LOW_WATER_EIGHTHS: usize = 7;

/// What a store over its bound is brought back to.
pub(crate) fn low_water(bound: usize) -> usize {
    bound / 8 * LOW_WATER_EIGHTHS
}

/// Fixed cost counted for every kept item besides its own text: the map
/// slot, the keys' and values' inline parts, the allocator's rounding. An
/// estimate (a `HashMap` slot of a `String` key and an entry is about 100
/// bytes); it keeps millions of tiny items from being counted as free.
pub(crate) const ITEM_OVERHEAD: usize = 128;

/// Approximate bytes a kept `Contents` holds: the capacity of its texts and
/// MIME types, and [`ITEM_OVERHEAD`] for it and for each part.
pub(crate) fn contents_bytes(contents: &crate::resource::Contents) -> usize {
    use crate::resource::ContentPart;
    let parts: usize = contents
        .parts
        .iter()
        .map(|p| match p {
            ContentPart::Text { text, mime_type } => text.capacity() + mime_type.as_ref().map_or(0, String::capacity),
            ContentPart::Blob { mime_type, .. } => mime_type.as_ref().map_or(0, String::capacity),
        } + ITEM_OVERHEAD)
        .sum();
    parts + ITEM_OVERHEAD
}

/// The keys of the least recently used items (`(use tick, bytes, key)`)
/// whose bytes add up to at least `excess`, oldest first.
pub(crate) fn oldest<K>(items: impl Iterator<Item = (u64, usize, K)>, excess: usize) -> Vec<K> {
    if excess == 0 {
        return Vec::new();
    }
    let mut items: Vec<(u64, usize, K)> = items.collect();
    items.sort_unstable_by_key(|(used, _, _)| *used);
    let mut freed = 0;
    let mut out = Vec::new();
    for (_, bytes, key) in items {
        if freed >= excess {
            break;
        }
        freed += bytes;
        out.push(key);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_until_enough_is_freed() {
        let items = [(5, 10, "e"), (1, 10, "a"), (3, 30, "c"), (2, 10, "b"), (4, 10, "d")];
        assert_eq!(oldest(items.into_iter(), 0), Vec::<&str>::new());
        assert_eq!(oldest(items.into_iter(), 1), ["a"]);
        assert_eq!(oldest(items.into_iter(), 20), ["a", "b"]);
        assert_eq!(oldest(items.into_iter(), 21), ["a", "b", "c"]);
        assert_eq!(oldest(items.into_iter(), 1000), ["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn low_water_is_seven_eighths() {
        assert_eq!(low_water(64 << 20), 56 << 20);
        assert_eq!(low_water(0), 0);
    }
}
