//! The protocol's TTLs, checked once where they are built.

/// Protocol timings every process touching a lock should agree on.
///
/// Built by [`Timings::new`], which refuses zero (`PEXPIRE` takes it as
/// "delete now") and anything over [`MAX_TIMING_MS`], a year: far more
/// than a lock needs, and far below where `PEXPIRE` refuses a value (about
/// 2^63 ms, which `u64` fields could reach). The scripts pass these on to
/// Redis, and a value refused halfway through a script would leave the
/// writes before it in place.
///
/// ```
/// use fairlock_core::Timings;
/// let timings = Timings::new(5_000, 20_000, 600_000).expect("valid");
/// assert_eq!(timings.waiter_ttl_ms(), 5_000);
/// assert_eq!(timings, Timings::default());
/// assert!(Timings::new(0, 20_000, 600_000).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    waiter_ttl_ms: u64,
    queue_ttl_ms: u64,
    idle_ms: u64,
}

/// The longest TTL [`Timings::new`] accepts: 365 days, in ms.
pub const MAX_TIMING_MS: u64 = 365 * 86_400_000;

impl Timings {
    /// Timings from their three TTLs, each 1 ms to [`MAX_TIMING_MS`], and
    /// the queue's at least the waiters':
    /// - `waiter_ttl_ms`: how long a process's waiters stay alive without
    ///   a heartbeat;
    /// - `queue_ttl_ms`: TTL of the queue keys; enqueues and heartbeats
    ///   refresh it;
    /// - `idle_ms`: TTL of the sequence counter and the last-release
    ///   marker. Losing the counter is safe (it restarts above the server
    ///   clock), so this only bounds how long an idle lock leaves keys
    ///   behind.
    pub const fn new(
        waiter_ttl_ms: u64,
        queue_ttl_ms: u64,
        idle_ms: u64,
    ) -> Result<Self, InvalidTimings> {
        let checked = [
            ("waiter_ttl_ms", waiter_ttl_ms),
            ("queue_ttl_ms", queue_ttl_ms),
            ("idle_ms", idle_ms),
        ];
        let mut i = 0;
        while i < checked.len() {
            let (field, value) = checked[i];
            if value == 0 || value > MAX_TIMING_MS {
                return Err(InvalidTimings {
                    field,
                    value,
                    min: 1,
                });
            }
            i += 1;
        }
        // The queue and its liveness entries expire after queue_ttl_ms:
        // shorter than the waiter TTL, they could vanish while a waiter
        // counts as alive, and take its place with them.
        if queue_ttl_ms < waiter_ttl_ms {
            return Err(InvalidTimings {
                field: "queue_ttl_ms",
                value: queue_ttl_ms,
                min: waiter_ttl_ms,
            });
        }
        Ok(Self {
            waiter_ttl_ms,
            queue_ttl_ms,
            idle_ms,
        })
    }

    /// How long a process's waiters stay alive without a heartbeat, ms.
    pub const fn waiter_ttl_ms(&self) -> u64 {
        self.waiter_ttl_ms
    }

    /// TTL of the queue keys, ms.
    pub const fn queue_ttl_ms(&self) -> u64 {
        self.queue_ttl_ms
    }

    /// TTL of the sequence counter and the last-release marker, ms.
    pub const fn idle_ms(&self) -> u64 {
        self.idle_ms
    }
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            waiter_ttl_ms: 5_000,
            queue_ttl_ms: 20_000,
            idle_ms: 600_000,
        }
    }
}

/// A TTL [`Timings::new`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidTimings {
    /// The field: `waiter_ttl_ms`, `queue_ttl_ms` or `idle_ms`.
    pub field: &'static str,
    /// The value given, ms.
    pub value: u64,
    /// The least value the field takes, ms: 1, or for `queue_ttl_ms` the
    /// waiter TTL given.
    pub min: u64,
}

impl std::fmt::Display for InvalidTimings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} = {} ms is out of range: ", self.field, self.value)?;
        if self.min > 1 {
            write!(
                f,
                "the queue's keys must outlive a waiter (waiter_ttl_ms = {} ms); ",
                self.min
            )?;
        }
        write!(f, "give {} ms to {MAX_TIMING_MS} ms (365 days)", self.min)
    }
}

impl std::error::Error for InvalidTimings {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TTL the scripts would pass to `PEXPIRE` and Redis would refuse
    /// (or take as "delete now") is refused before any script runs; the
    /// limits themselves are accepted.
    #[test]
    fn timings_refuse_a_ttl_redis_cannot_use() {
        for (field, timings) in [
            ("waiter_ttl_ms", Timings::new(0, 1, 1)),
            ("queue_ttl_ms", Timings::new(1, 0, 1)),
            ("idle_ms", Timings::new(1, 1, MAX_TIMING_MS + 1)),
            ("idle_ms", Timings::new(1, 1, u64::MAX)),
        ] {
            let error = timings.expect_err(field);
            assert_eq!(error.field, field);
            assert!(error.to_string().contains(field), "{error}");
        }
        // The queue and liveness keys expire after queue_ttl_ms: shorter
        // than the waiter TTL, they could vanish while a waiter is alive.
        let short_queue = Timings::new(5_000, 4_999, 600_000).expect_err("a short queue TTL");
        assert_eq!(
            (short_queue.field, short_queue.value),
            ("queue_ttl_ms", 4_999)
        );
        assert!(
            short_queue.to_string().contains("waiter_ttl_ms"),
            "{short_queue}"
        );
        Timings::new(5_000, 5_000, 600_000).expect("a queue TTL equal to the waiter TTL");
        let widest = Timings::new(1, MAX_TIMING_MS, MAX_TIMING_MS).expect("the limits");
        assert_eq!(
            (
                widest.waiter_ttl_ms(),
                widest.queue_ttl_ms(),
                widest.idle_ms()
            ),
            (1, MAX_TIMING_MS, MAX_TIMING_MS)
        );
    }
}
