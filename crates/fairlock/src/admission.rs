//! Deadline-aware admission: how long a place in a queue takes to reach
//! the head, per lock, as this client has seen it.
//!
//! Every grant after a wait gives one sample: the waiter had `position`
//! callers ahead when it joined and was granted `waited` later, so the lock
//! went to the next caller about every `waited / (position + 1)`. The
//! estimate is a moving average of those samples. With it, a caller that
//! joins at position `p` can be told at once that it would wait about
//! `p × per_grant`, instead of holding a place in line until its timeout.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Weight of a new sample in the moving average.
const ALPHA: f64 = 0.2;
/// Locks remembered; beyond that the table starts again (names can be
/// unbounded, e.g. one per SKU).
const MAX_LOCKS: usize = 10_000;

/// Time per grant, per lock (owner key).
#[derive(Default)]
pub(crate) struct GrantRates {
    per_grant: Mutex<HashMap<String, f64>>,
}

impl GrantRates {
    /// A waiter that had `position` callers ahead was granted after `waited`.
    pub(crate) fn record(&self, lock: &str, position: u64, waited: Duration) {
        let sample = waited.as_secs_f64() / (position as f64 + 1.0);
        let mut table = self.per_grant.lock().unwrap_or_else(|p| p.into_inner());
        if table.len() >= MAX_LOCKS && !table.contains_key(lock) {
            table.clear();
        }
        table
            .entry(lock.to_owned())
            .and_modify(|avg| *avg += ALPHA * (sample - *avg))
            .or_insert(sample);
    }

    /// The time between grants seen on `lock`, if any.
    pub(crate) fn per_grant(&self, lock: &str) -> Option<Duration> {
        let table = self.per_grant.lock().unwrap_or_else(|p| p.into_inner());
        table
            .get(lock)
            .and_then(|secs| Duration::try_from_secs_f64(*secs).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_follows_the_samples() {
        let rates = GrantRates::default();
        assert_eq!(rates.per_grant("a"), None);
        rates.record("a", 9, Duration::from_secs(1));
        assert_eq!(rates.per_grant("a"), Some(Duration::from_millis(100)));
        rates.record("a", 0, Duration::from_millis(100));
        assert_eq!(rates.per_grant("a"), Some(Duration::from_millis(100)));
        rates.record("a", 0, Duration::from_millis(600));
        assert_eq!(rates.per_grant("a"), Some(Duration::from_millis(200)));
    }
}
