//! Deadline-aware admission: how long a turn of a queue takes, per lock,
//! as this client has seen it.
//!
//! A turn grants the next caller of a lock, or as many callers as fit
//! together in a permit set (a semaphore of `n` permits: `n` requests of
//! one permit each; a writer alone). Every grant after a wait gives one
//! sample: the waiter had `t` turns ahead when it joined (`position / n`
//! for `position` callers ahead) and was granted `waited` later, so a turn
//! took about `waited / (t + 1)`. The estimate is a moving average of
//! those samples. With it, a caller that joins `t` turns behind the holder
//! can be told at once that it would wait about `(t + 1) × per_turn`,
//! instead of holding a place in line until its timeout. Counting places
//! instead of turns, a set of 5 permits expected up to 5 times the real
//! wait and refused callers it would have served in time.
//!
//! It is a guess from this process's own grants: one unusually long hold
//! moves it by a fifth of the difference, the table starts again past
//! 10,000 locks, and a re-check late in a wait can refuse a caller whose
//! line moved faster than the estimate said. An estimate no grant has
//! confirmed for [`STALE_AFTER`] is forgotten: otherwise one slow spell
//! would refuse every later caller with a shorter timeout, none of them
//! would be granted after a wait, and no sample would ever correct it.
//!
//! A burst can queue thousands of callers before the lock's first grant
//! gives an estimate. So the estimate also announces itself: when a lock
//! gets its first estimate, or it moves by more than a quarter, waiters
//! that asked for admission are woken (a local `watch`, no Redis call) and
//! check again with the position they joined at.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Weight of a new sample in the moving average.
const ALPHA: f64 = 0.2;
/// Locks remembered; beyond that the table starts again (names can be
/// unbounded, e.g. one per SKU).
const MAX_LOCKS: usize = 10_000;

/// How far (as a fraction) an estimate moves before waiters re-check.
const ANNOUNCE_CHANGE: f64 = 0.25;

/// How long an estimate lasts without a new sample.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(60);

/// One lock's estimate: the moving average, its value when waiters were
/// last told, and when its last sample came.
#[derive(Clone, Copy)]
struct Estimate {
    average: f64,
    announced: f64,
    sampled_at: Instant,
}

impl Estimate {
    fn is_stale(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.sampled_at) >= STALE_AFTER
    }
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
    /// A waiter that had `turns_ahead` turns of the queue ahead was
    /// granted after `waited`.
    pub(crate) fn record(&self, lock: &str, turns_ahead: u64, waited: Duration) {
        self.record_at(lock, turns_ahead, waited, Instant::now());
    }

    fn record_at(&self, lock: &str, turns_ahead: u64, waited: Duration, now: Instant) {
        let sample = waited.as_secs_f64() / (turns_ahead as f64 + 1.0);
        let announce = {
            let mut table = self.per_grant.lock().unwrap_or_else(|p| p.into_inner());
            if table.len() >= MAX_LOCKS && !table.contains_key(lock) {
                table.clear();
            }
            let fresh = Estimate {
                average: sample,
                announced: 0.0,
                sampled_at: now,
            };
            let estimate = table.entry(lock.to_owned()).or_insert(fresh);
            if estimate.is_stale(now) {
                *estimate = fresh;
            }
            estimate.average += ALPHA * (sample - estimate.average);
            estimate.sampled_at = now;
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

    /// The time a turn of the queue takes on `lock`, if any sample came within
    /// [`STALE_AFTER`].
    pub(crate) fn per_grant(&self, lock: &str) -> Option<Duration> {
        self.per_grant_at(lock, Instant::now())
    }

    fn per_grant_at(&self, lock: &str, now: Instant) -> Option<Duration> {
        let table = self.per_grant.lock().unwrap_or_else(|p| p.into_inner());
        table
            .get(lock)
            .filter(|e| !e.is_stale(now))
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

    /// An estimate nobody has confirmed for a while is forgotten. Before,
    /// one slow spell stayed the lock's pace for good: admission refused
    /// every caller whose timeout was shorter, so none of them was ever
    /// granted after a wait, and no sample could correct it.
    #[test]
    fn an_estimate_no_grant_confirms_is_forgotten() {
        let rates = GrantRates::default();
        let then = Instant::now();
        rates.record_at("a", 0, Duration::from_secs(10), then);
        assert_eq!(
            rates.per_grant_at("a", then + STALE_AFTER / 2),
            Some(Duration::from_secs(10))
        );
        assert_eq!(rates.per_grant_at("a", then + STALE_AFTER), None);
        // A fresh sample starts a fresh estimate, not an average with the
        // forgotten one.
        rates.record_at("a", 0, Duration::from_millis(50), then + STALE_AFTER);
        assert_eq!(
            rates.per_grant_at("a", then + STALE_AFTER),
            Some(Duration::from_millis(50))
        );
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
