//! Metric names and descriptions for fairlock.
//!
//! The `fairlock` client records through the [`metrics`] facade, so without
//! an installed recorder recording costs next to nothing. Names follow the
//! Prometheus conventions: base units in the name, counters end in `_total`,
//! labels have bounded cardinality (the lock name is not a label unless the
//! user asks for it).
#![deny(missing_docs)]

/// Acquire attempts, by `outcome` (`acquired`, `busy`, `timeout`, `cancelled`, `error`).
pub const ACQUIRE_TOTAL: &str = "fairlock_acquire_total";
/// Time from the start of an acquire to its end, by `outcome`.
pub const WAIT_SECONDS: &str = "fairlock_wait_seconds";
/// Time from grant to release.
pub const HOLD_SECONDS: &str = "fairlock_hold_seconds";
/// Acquisitions that had to wait in the queue.
pub const CONTENDED_TOTAL: &str = "fairlock_contended_total";
/// Waiters ahead of a task when it joined the queue.
pub const QUEUE_DEPTH: &str = "fairlock_queue_depth";
/// Grants received by direct handoff from a release.
pub const HANDOFF_TOTAL: &str = "fairlock_handoff_total";
/// Lease renewals by the watchdog, by `result` (`renewed`, `lost`, `error`).
pub const LEASE_RENEWALS_TOTAL: &str = "fairlock_lease_renewals_total";
/// Held locks whose lease was found lost.
pub const LEASE_LOST_TOTAL: &str = "fairlock_lease_lost_total";
/// Dead waiters removed from queues by this process's scripts.
pub const WAITERS_EVICTED_TOTAL: &str = "fairlock_waiters_evicted_total";
/// Bounded waits whose timer fired and re-checked with Redis.
pub const WAIT_RECHECK_TOTAL: &str = "fairlock_wait_recheck_total";
/// Reconnections of the pub/sub connection.
pub const PUBSUB_RECONNECTS_TOTAL: &str = "fairlock_pubsub_reconnects_total";

/// Registers help text and units for every fairlock metric with the
/// installed recorder. Call it once after installing a recorder.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        ACQUIRE_TOTAL,
        Unit::Count,
        "Lock acquire attempts by outcome."
    );
    describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "Time spent acquiring a lock, by outcome."
    );
    describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "Time a lock was held, from grant to release."
    );
    describe_counter!(
        CONTENDED_TOTAL,
        Unit::Count,
        "Acquisitions that had to wait in the queue."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        Unit::Count,
        "Waiters ahead of the last task that joined a queue."
    );
    describe_counter!(
        HANDOFF_TOTAL,
        Unit::Count,
        "Grants received by direct handoff."
    );
    describe_counter!(
        LEASE_RENEWALS_TOTAL,
        Unit::Count,
        "Watchdog lease renewals by result."
    );
    describe_counter!(
        LEASE_LOST_TOTAL,
        Unit::Count,
        "Held locks whose lease was lost."
    );
    describe_counter!(
        WAITERS_EVICTED_TOTAL,
        Unit::Count,
        "Dead waiters removed from queues."
    );
    describe_counter!(
        WAIT_RECHECK_TOTAL,
        Unit::Count,
        "Bounded waits that fired and re-checked."
    );
    describe_counter!(
        PUBSUB_RECONNECTS_TOTAL,
        Unit::Count,
        "Reconnections of the pub/sub connection."
    );
}
