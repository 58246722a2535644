//! Deadline-aware admission: how long a place in a queue takes to reach
//! the head, per lock, as this client has seen it.
//!
//! Every grant after a wait gives one sample: the waiter had `position`
//! callers ahead when it joined and was granted `waited` later, so the lock
//! went to the next caller about every `waited / (position + 1)`. The
//! estimate is a moving average of those samples. With it, a caller that
//! joins at position `p` (behind the holder and `p` callers) can be told
//! at once that it would wait about `(p + 1) × per_grant`, instead of
//! holding a place in line until its timeout.
//!
//! It is a guess from this process's own grants: the average does not age
//! (a lock quiet for an hour keeps its last pace), one unusually long hold
//! moves it by a fifth of the difference, the table starts again past
//! 10,000 locks, and a re-check late in a wait can refuse a caller whose
//! line moved faster than the estimate said.
//!
//! A burst can queue thousands of callers before the lock's first grant
//! gives an estimate. So the estimate also announces itself: when a lock
//! gets its first estimate, or it moves by more than a quarter, waiters
//! that asked for admission are woken (a local `watch`, no Redis call) and
//! check again with the position they joined at.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

/// Weight of a new sample in the moving average.
const ALPHA: f64 = 0.2;
/// Locks remembered; beyond that the table starts again (names can be
/// unbounded, e.g. one per SKU).
const MAX_LOCKS: usize = 10_000;

/// How far (as a fraction) an estimate moves before waiters re-check.
const ANNOUNCE_CHANGE: f64 = 0.25;

/// One lock's estimate: the moving average, and its value when waiters
/// were last told.
#[derive(Clone, Copy)]
struct Estimate {
    average: f64,
    announced: f64,
}

/// Time per grant, per lock (owner key).
pub(crate) struct GrantRates {
    per_grant: Mutex<HashMap<String, Estimate>>,
    /// Bumped when some lock's estimate is new or moved: waiters re-check.
    announce: watch::Sender<u64>,
}

impl Default for GrantRates {
    fn default() -> Self {
        Self {
            per_grant: Mutex::default(),
            announce: watch::Sender::new(0),
        }
    }
}

impl GrantRates {
    /// A waiter that had `position` callers ahead was granted after `waited`.
    pub(crate) fn record(&self, lock: &str, position: u64, waited: Duration) {
        let sample = waited.as_secs_f64() / (position as f64 + 1.0);
        let announce = {
            let mut table = self.per_grant.lock().unwrap_or_else(|p| p.into_inner());
            if table.len() >= MAX_LOCKS && !table.contains_key(lock) {
                table.clear();
            }
            let estimate = table.entry(lock.to_owned()).or_insert(Estimate {
                average: sample,
                announced: 0.0,
            });
            estimate.average += ALPHA * (sample - estimate.average);
            let moved = (estimate.average - estimate.announced).abs()
                > ANNOUNCE_CHANGE * estimate.announced;
            if moved {
                estimate.announced = estimate.average;
            }
            moved
        };
        if announce {
            self.announce.send_modify(|version| *version += 1);
        }
    }

    /// The time between grants seen on `lock`, if any.
    pub(crate) fn per_grant(&self, lock: &str) -> Option<Duration> {
        let table = self.per_grant.lock().unwrap_or_else(|p| p.into_inner());
        table
            .get(lock)
            .and_then(|e| Duration::try_from_secs_f64(e.average).ok())
    }

    /// A receiver woken whenever some lock's estimate is new or moved.
    pub(crate) fn announcements(&self) -> watch::Receiver<u64> {
        self.announce.subscribe()
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

    #[test]
    fn waiters_hear_of_new_and_moved_estimates_only() {
        let rates = GrantRates::default();
        let mut heard = rates.announcements();
        rates.record("a", 0, Duration::from_millis(100));
        assert!(heard.has_changed().unwrap(), "a first estimate");
        heard.mark_unchanged();
        rates.record("a", 0, Duration::from_millis(110));
        assert!(!heard.has_changed().unwrap(), "a 2% move is not news");
        for _ in 0..5 {
            rates.record("a", 0, Duration::from_millis(400));
        }
        assert!(heard.has_changed().unwrap(), "a move past a quarter is");
    }
}
