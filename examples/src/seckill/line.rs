//! The service's own line in front of an item's lock or semaphore: a
//! bulkhead that answers 429 at once, without a Redis call, when more
//! buyers are already in line than can be served within the wait budget.
//!
//! Deadline-aware admission in the library refuses a waiter once the queue
//! has told it its position, which costs the waiter an acquire and a cancel
//! script and, at ten thousand buyers arriving at once, a task wake-up each
//! on a runtime already busy with HTTP. The line refuses before any of
//! that: it counts the buyers of this process that are waiting or being
//! served for the item, and lets one more in only while
//!
//! ```text
//! in line < budget × parallel / pass
//! ```
//!
//! (or a fixed capacity, [`Line::fixed`]), where `pass` is a moving average of how long one buyer holds the lock or
//! permit (grant to release), `parallel` is 1 for a lock and the permit
//! count for a semaphore, and `budget` is the wait timeout. Before the
//! first sale `pass` is [`Line::FIRST_GUESS`]. The line never shrinks below
//! [`Line::MIN_CAPACITY`], so a slow sale cannot close it.
//!
//! It counts one process's buyers. Several service processes selling the
//! same item each keep their own line; the library's admission still
//! judges the whole queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Weight of a new hold-time sample in the moving average.
const ALPHA: f64 = 0.1;

/// One item's line in one process.
#[derive(Debug)]
pub struct Line {
    budget: Duration,
    parallel: u64,
    /// A fixed capacity instead of the adaptive one.
    fixed: Option<u64>,
    /// Buyers in line or being served now.
    in_line: AtomicU64,
    /// The most buyers in line at once.
    most: AtomicU64,
    /// Buyers turned away because the line was full.
    shed: AtomicU64,
    /// Moving average of a pass (grant to release), in nanoseconds, as
    /// `f64` bits; 0 until the first sale.
    pass_ns: AtomicU64,
}

/// A buyer's place in the [`Line`]; leaves the line when dropped. It can
/// travel with the sale to another task or runtime.
#[derive(Debug)]
pub struct Place {
    line: Arc<Line>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.line.in_line.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The line was full: how many were in it, and what it could hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineFull {
    /// Buyers in line when this one arrived.
    pub in_line: u64,
    /// What the line could hold at that moment.
    pub capacity: u64,
}

impl Line {
    /// The pass time assumed before the first sale.
    pub const FIRST_GUESS: Duration = Duration::from_millis(1);
    /// The line always admits at least this many.
    pub const MIN_CAPACITY: u64 = 16;

    /// A line for buyers who wait at most `budget`, served `parallel` at a
    /// time (1 for a lock, the permits for a semaphore).
    pub fn new(budget: Duration, parallel: u32) -> Self {
        Self {
            budget,
            parallel: u64::from(parallel.max(1)),
            fixed: None,
            in_line: AtomicU64::new(0),
            most: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            pass_ns: AtomicU64::new(0),
        }
    }

    /// A line that holds at most `capacity` buyers (at least one),
    /// whatever the pass time.
    pub fn fixed(capacity: u64) -> Self {
        Self {
            fixed: Some(capacity.max(1)),
            ..Self::new(Duration::ZERO, 1)
        }
    }

    /// How many buyers the line holds now.
    pub fn capacity(&self) -> u64 {
        if let Some(fixed) = self.fixed {
            return fixed;
        }
        let pass = self.pass().as_secs_f64().max(1e-6);
        let fits = self.budget.as_secs_f64() * self.parallel as f64 / pass;
        (fits as u64).max(Self::MIN_CAPACITY)
    }

    /// The average pass (grant to release) so far, or the first guess.
    pub fn pass(&self) -> Duration {
        match f64::from_bits(self.pass_ns.load(Ordering::Relaxed)) {
            ns if ns > 0.0 => Duration::from_nanos(ns as u64),
            _ => Self::FIRST_GUESS,
        }
    }

    /// A place in line, or [`LineFull`] (the buyer is counted as shed).
    pub fn join(self: &Arc<Self>) -> Result<Place, LineFull> {
        let capacity = self.capacity();
        let in_line = self.in_line.fetch_add(1, Ordering::SeqCst);
        if in_line >= capacity {
            self.in_line.fetch_sub(1, Ordering::SeqCst);
            self.shed.fetch_add(1, Ordering::Relaxed);
            return Err(LineFull { in_line, capacity });
        }
        self.most.fetch_max(in_line + 1, Ordering::Relaxed);
        Ok(Place {
            line: Arc::clone(self),
        })
    }

    /// A buyer held the lock or permit for `held`.
    pub fn served(&self, held: Duration) {
        let sample = held.as_nanos() as f64;
        let _ = self
            .pass_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let average = f64::from_bits(bits);
                let next = if average > 0.0 {
                    average + ALPHA * (sample - average)
                } else {
                    sample
                };
                Some(next.to_bits())
            });
    }

    /// Buyers turned away so far because the line was full.
    pub fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    /// The most buyers that were in line at once.
    pub fn most(&self) -> u64 {
        self.most.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_holds_what_the_budget_can_serve() {
        let line = Line::new(Duration::from_millis(100), 1);
        // First guess: 1 ms a pass, 100 fit.
        assert_eq!(line.capacity(), 100);
        line.served(Duration::from_millis(4));
        assert_eq!(line.capacity(), 25);
        let semaphore = Line::new(Duration::from_millis(100), 8);
        semaphore.served(Duration::from_millis(4));
        assert_eq!(semaphore.capacity(), 200);
    }

    #[test]
    fn a_full_line_turns_buyers_away_until_a_place_frees() {
        let line = Arc::new(Line::new(Duration::from_millis(16), 1));
        line.served(Duration::from_millis(1));
        let places: Vec<_> = (0..16).map(|_| line.join().expect("room")).collect();
        assert_eq!(
            line.join().unwrap_err(),
            LineFull {
                in_line: 16,
                capacity: 16
            }
        );
        assert_eq!(line.shed(), 1);
        drop(places);
        assert!(line.join().is_ok());
        assert_eq!(line.most(), 16);
    }

    #[test]
    fn a_fixed_line_ignores_the_pass_time() {
        let line = Line::fixed(3);
        line.served(Duration::from_nanos(1));
        assert_eq!(line.capacity(), 3);
    }

    #[test]
    fn a_slow_sale_never_closes_the_line() {
        let line = Line::new(Duration::from_millis(10), 1);
        line.served(Duration::from_secs(60));
        assert_eq!(line.capacity(), Line::MIN_CAPACITY);
    }
}
