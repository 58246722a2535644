//! The keys of the locks in use, shared. Every acquire of a name needs the
//! lock's five key strings; building them per call cost each waiting task
//! about 300 bytes (ten thousand waiters on one lock held ten thousand
//! copies). The cache hands out one `Arc<LockKeys>` per name while anyone
//! still uses it, and forgets names nobody uses any more: entries are weak,
//! and dead ones are swept whenever the table has doubled since the last
//! sweep, so its size follows the names in use (per-SKU or per-job names
//! stay bounded). The last [`RECENT`] names whose keys were built are kept
//! alive as well, so a name locked again and again by one task at a time
//! (lock, release, lock) does not build its keys on every call (11 of the
//! 59 allocations of an uncontended cycle did).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use fairlock_core::{KeyPrefix, LockKeys, LockName};

/// The table is swept no more often than this size.
const MIN_SWEEP: usize = 64;

/// How many of the names built last are kept alive while nobody uses them
/// (at most about 10 KB of keys).
const RECENT: usize = 32;

#[derive(Default)]
struct Table {
    by_name: HashMap<Box<[u8]>, Weak<LockKeys>>,
    /// Sweep dead entries once the table reaches this size.
    sweep_at: usize,
    /// The keys built last, newest at the back, kept alive.
    recent: VecDeque<Arc<LockKeys>>,
}

/// Lock keys shared by name, for one client.
#[derive(Default)]
pub(crate) struct KeyCache {
    table: Mutex<Table>,
}

impl KeyCache {
    /// The keys of `name` under `prefix`: the ones in use if any, else new.
    pub(crate) fn keys(&self, prefix: &KeyPrefix, name: &LockName) -> Arc<LockKeys> {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(keys) = table.by_name.get(name.as_bytes()).and_then(Weak::upgrade) {
            return keys;
        }
        let keys = Arc::new(LockKeys::new(prefix, name));
        if table.by_name.len() >= table.sweep_at.max(MIN_SWEEP) {
            table.by_name.retain(|_, keys| keys.strong_count() > 0);
            table.sweep_at = table.by_name.len() * 2;
        }
        table
            .by_name
            .insert(name.as_bytes().into(), Arc::downgrade(&keys));
        if table.recent.len() == RECENT {
            table.recent.pop_front();
        }
        table.recent.push_back(Arc::clone(&keys));
        keys
    }

    /// Names remembered now, live or not yet swept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_name
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> LockName {
        LockName::new(text).expect("a valid name")
    }

    #[test]
    fn one_name_shares_one_set_of_keys_while_in_use() {
        let cache = KeyCache::default();
        let prefix = KeyPrefix::default();
        let a = cache.keys(&prefix, &name("a"));
        let again = cache.keys(&prefix, &name("a"));
        assert!(Arc::ptr_eq(&a, &again));
        assert!(!Arc::ptr_eq(&a, &cache.keys(&prefix, &name("b"))));
        drop((a, again));
        let fresh = cache.keys(&prefix, &name("a"));
        assert_eq!(fresh.owner(), LockKeys::new(&prefix, &name("a")).owner());
    }

    #[test]
    fn a_name_locked_again_reuses_its_keys() {
        let cache = KeyCache::default();
        let prefix = KeyPrefix::default();
        let first = Arc::downgrade(&cache.keys(&prefix, &name("hot")));
        // Unused now; other names come and go, fewer than RECENT.
        for i in 0..RECENT - 1 {
            drop(cache.keys(&prefix, &name(&format!("other:{i}"))));
        }
        let kept = first.upgrade().expect("kept alive");
        assert!(Arc::ptr_eq(&cache.keys(&prefix, &name("hot")), &kept));
        drop(kept);
        // RECENT newer names later, it is let go and built again.
        for i in 0..RECENT {
            drop(cache.keys(&prefix, &name(&format!("newer:{i}"))));
        }
        assert!(first.upgrade().is_none(), "let go");
        let again = cache.keys(&prefix, &name("hot"));
        assert_eq!(again.owner(), LockKeys::new(&prefix, &name("hot")).owner());
    }

    #[test]
    fn names_nobody_uses_are_swept() {
        let cache = KeyCache::default();
        let prefix = KeyPrefix::default();
        for i in 0..10_000 {
            drop(cache.keys(&prefix, &name(&format!("job:{i}"))));
        }
        assert!(cache.len() <= 2 * MIN_SWEEP, "{} names kept", cache.len());
        let held: Vec<_> = (0..1_000)
            .map(|i| cache.keys(&prefix, &name(&format!("held:{i}"))))
            .collect();
        assert!(cache.len() >= held.len());
        assert!(cache.len() <= 2 * held.len() + MIN_SWEEP);
    }
}
