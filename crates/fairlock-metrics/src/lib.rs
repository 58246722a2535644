//! Metric names, descriptions and the optional Prometheus exporter of
//! fairlock.
//!
//! The `fairlock` client records through the [`metrics`] facade. Until a
//! recorder is installed, a recording finds no recorder and returns: about
//! 15-25 ns on the 2-core development machine
//! (`tests/no_recorder_cost.rs`), a few recordings per acquisition against
//! a Redis round trip of tens of microseconds at least.
//!
//! Names follow the Prometheus conventions: base units in the name
//! (`_seconds`), counters end in `_total`, labels have bounded cardinality.
//! **The lock name is not a label by default**: a service that locks one
//! key per SKU, order or job would otherwise create one time series per
//! key and swamp Prometheus. Every series below is per process, unless
//! the client opts into a bounded `lock` label
//! (`ClientConfig::metrics_lock_label`).
//!
//! # Exporting to Prometheus
//!
//! With the `prometheus` feature, one call installs a recorder, describes
//! every metric and serves the text format over HTTP:
//!
//! ```no_run
//! # #[cfg(feature = "prometheus")]
//! # fn demo() -> Result<(), fairlock_metrics::MetricsError> {
//! // Inside or outside a Tokio runtime; once per process.
//! let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 9464));
//! let handle = fairlock_metrics::install_prometheus(addr)?;
//! // Prometheus scrapes http://127.0.0.1:9464/metrics; the handle renders
//! // the same text in-process.
//! let _text = handle.render();
//! # Ok(())
//! # }
//! ```
//!
//! With another recorder (OpenTelemetry, StatsD, a recorder of your own),
//! install it yourself and call [`describe_metrics`] once afterwards.
//!
//! # The metrics, and when to alarm
//!
//! | metric | type | labels | counts |
//! |---|---|---|---|
//! | [`fairlock_acquire_total`](ACQUIRE_TOTAL) | counter | `outcome` | finished acquire calls |
//! | [`fairlock_wait_seconds`](WAIT_SECONDS) | histogram | `outcome` | how long each acquire call took |
//! | [`fairlock_hold_seconds`](HOLD_SECONDS) | histogram | | grant to release |
//! | [`fairlock_contended_total`](CONTENDED_TOTAL) | counter | | acquire calls that joined a queue |
//! | [`fairlock_queue_depth`](QUEUE_DEPTH) | gauge | | waiters ahead of the latest task to queue |
//! | [`fairlock_handoff_total`](HANDOFF_TOTAL) | counter | | grants to calls that queued |
//! | [`fairlock_lease_renewals_total`](LEASE_RENEWALS_TOTAL) | counter | `result` | watchdog renewals |
//! | [`fairlock_lease_lost_total`](LEASE_LOST_TOTAL) | counter | | grants whose lease was lost |
//! | [`fairlock_waiters_evicted_total`](WAITERS_EVICTED_TOTAL) | counter | | dead waiters purged |
//! | [`fairlock_wait_recheck_total`](WAIT_RECHECK_TOTAL) | counter | | waits that re-ran the acquire script |
//! | [`fairlock_pubsub_reconnects_total`](PUBSUB_RECONNECTS_TOTAL) | counter | | pub/sub reconnections |
//!
//! Each constant's documentation says exactly what is counted and when to
//! alarm on it. In short, page on any increase of
//! `fairlock_lease_lost_total` (two holders may have overlapped; only
//! fencing tokens protected the resource) and on a sustained rate of
//! `outcome="error"`; warn on wait p99 above your latency budget and on
//! a rising `outcome="timeout"` share.
#![deny(missing_docs)]

#[cfg(feature = "prometheus")]
mod prometheus;
#[cfg(feature = "prometheus")]
pub use prometheus::{install_prometheus, prometheus_builder, MetricsError, PrometheusHandle};

/// `fairlock_acquire_total{outcome}`: counter of finished acquire calls
/// (`lock`, `lock_with`, `try_lock`, `try_lock_with`), one per call,
/// labelled with how the call ended:
///
/// * `acquired`: the caller got the lock (at once, by handoff, or after a
///   re-check);
/// * `busy`: a `try_lock` found the lock held or waiters queued;
/// * `timeout`: the `wait_timeout` ran out in the queue;
/// * `refused`: deadline-aware admission found the line too long for the
///   wait timeout;
/// * `cancelled`: the acquire future was dropped before a grant (e.g. by
///   `tokio::time::timeout` or `select!`), or the client was shut down
///   while it waited (`Error::Closed`);
/// * `error`: a Redis call failed (unreachable, command timeout, wrong key
///   type), or with `replica_acks` on, the replicas did not acknowledge
///   the grant (`Error::NotReplicated`; the grant is given back and counts
///   as `acquired` only once acknowledged).
///
/// Each call is counted once, when its outcome is known, also when the
/// caller drops it during the cleanup that follows (the cancel after a
/// wait timeout).
///
/// Calls refused before touching Redis (an invalid name or options) are
/// not counted.
///
/// Alarm: a sustained rate of `outcome="error"` (Redis is unreachable or a
/// lock key has the wrong type); the share of `timeout` (and, with
/// admission, `refused`) among all outcomes rising above what your callers
/// tolerate (the lock is a bottleneck).
pub const ACQUIRE_TOTAL: &str = "fairlock_acquire_total";

/// `fairlock_wait_seconds{outcome}`: histogram of the time from the start
/// of an acquire call to its end, labelled like [`ACQUIRE_TOTAL`], so each
/// outcome's `_count` equals that outcome's acquire count.
///
/// Alarm: p99 of `outcome="acquired"` above your latency budget. In a fair
/// queue the wait is about (waiters ahead) x (hold time), so look at
/// [`QUEUE_DEPTH`] and [`HOLD_SECONDS`] next.
pub const WAIT_SECONDS: &str = "fairlock_wait_seconds";

/// `fairlock_hold_seconds`: histogram of the time from grant to release,
/// one sample per release (explicit, or by dropping the guard), including
/// a release that found the lease already lost. A grant given back
/// because the replicas did not acknowledge it was never held: no sample.
///
/// Alarm: p99 approaching the lease (a fixed lease, or the watchdog lease
/// when renewals fail): holders are about to lose their lease. Long holds
/// also lengthen every waiter's wait.
pub const HOLD_SECONDS: &str = "fairlock_hold_seconds";

/// `fairlock_contended_total`: counter of acquire calls that found the
/// lock held (or other waiters queued) and joined the queue. Counted once
/// per call, whatever its outcome: a queued call that later times out or
/// is cancelled is counted here too.
///
/// `rate(fairlock_contended_total) / rate(fairlock_acquire_total)` is the
/// contention ratio. Alarm: only together with wait times; contention by
/// itself is what a fair lock is for.
pub const CONTENDED_TOTAL: &str = "fairlock_contended_total";

/// `fairlock_queue_depth`: gauge of the waiters ahead of the task in this
/// process that most recently joined a queue (0 = first in line), over all
/// locks (per lock with a `lock` label). A sample, not a running total: it changes only when a task
/// queues.
///
/// Alarm: sustained high values. Each waiter ahead costs one hold time of
/// wait, so depth x hold p50 approaches the wait p50.
pub const QUEUE_DEPTH: &str = "fairlock_queue_depth";

/// `fairlock_handoff_total`: counter of grants this process's waiters
/// received from the queue: a release (or an admin `force_release`, or a
/// heartbeat after a holder's lease ran out) made the waiter the owner and
/// notified it, by pub/sub, by the heartbeat that re-delivers lost
/// messages, or by the waiter's own re-check (a permit its set's
/// heartbeat found it holding). Every call that queued and was granted
/// counts once.
///
/// Alarm: `fairlock_contended_total` minus handoffs, timeouts and
/// cancellations growing: queued calls neither get the lock nor give up,
/// as when holders die with the lock held (an approximation: queued calls
/// that ended refused or in an error are in the difference too).
pub const HANDOFF_TOTAL: &str = "fairlock_handoff_total";

/// `fairlock_lease_renewals_total{result}`: counter of lease renewals by
/// the watchdog (locks held without a fixed lease), by `result`, one per
/// lock (a watchdog call covers many locks; a failed call counts one
/// `error` for each of them). The watchdog checks every lock each
/// heartbeat interval and renews a lease a third of the way through it,
/// so while Redis fails, `error` grows once per check (every second by
/// default), faster than `renewed` ever does (every 10 s by default):
///
/// * `renewed`: the lease was extended;
/// * `lost`: the watchdog's check found the lock gone or owned by another
///   (expired, or taken by `force_release` before its revocation notice
///   arrived); the guard's lease-lost signal fires (a fixed lease
///   found lost by the same check is counted in [`LEASE_LOST_TOTAL`]
///   only);
/// * `error`: the Redis call failed; it is retried at the next tick, and
///   the lease counts as lost once no renewal succeeded for a whole lease;
/// * `unreplicated`: with replica acknowledgement on, too few replicas
///   acknowledged the renewal; the lease counts as lost.
///
/// Alarm: any `lost`; `error` at more than a trickle (Redis slow or
/// unreachable: holders are about to lose their leases).
pub const LEASE_RENEWALS_TOTAL: &str = "fairlock_lease_renewals_total";

/// `fairlock_lease_lost_total`: counter of grants whose lease-lost signal
/// fired, at most once per grant: the watchdog found the lock gone, no
/// renewal succeeded for a whole lease, a fixed lease ran out, or a release
/// or extend found the lock no longer held.
///
/// Alarm: any increase. For a while two holders may each have believed
/// they held the lock; only fencing tokens checked by the resource kept
/// that safe. Usual causes: holds longer than a fixed lease, a stalled
/// process (GC, swap, a blocked async runtime), an admin `force_release`.
pub const LEASE_LOST_TOTAL: &str = "fairlock_lease_lost_total";

/// `fairlock_waiters_evicted_total`: counter of dead waiters (their
/// heartbeat deadline passed) removed from queues by scripts this process
/// ran. The waiters may belong to any process.
///
/// Alarm: a sustained rate. Processes are dying while they wait, or live
/// ones cannot heartbeat (a blocked async runtime, Redis too slow).
pub const WAITERS_EVICTED_TOTAL: &str = "fairlock_waiters_evicted_total";

/// `fairlock_wait_recheck_total`: counter of waits that re-ran the
/// acquire script instead of being handed the lock: the heartbeat found
/// the waiter's queue entry gone (it was taken for dead, e.g. after a
/// stall longer than the waiter timeout, or the queue was lost in a
/// fail-over; every waiter of that lock in the process then checks its
/// place), a semaphore's or read-write lock's heartbeat found a grant
/// its waiters were not told of (each waiter of the set checks), or a
/// grant whose message reached nobody ran out of its short lease before
/// the waiter took it. Waiting itself has no timer
/// besides the caller's wait timeout; a client's `shutdown()` ends its
/// waiters without counting here.
///
/// Alarm: a rate comparable to acquisitions. Grants are not arriving by
/// handoff: holders die with the lock held, or grant messages are lost.
pub const WAIT_RECHECK_TOTAL: &str = "fairlock_wait_recheck_total";

/// `fairlock_pubsub_reconnects_total`: counter of reconnections of the
/// client's pub/sub connection. Each one triggers an immediate heartbeat
/// that re-delivers grants sent while it was away.
///
/// Alarm: a sustained rate (network trouble, Redis restarts or failovers,
/// `CLIENT KILL`, output buffer limits on the subscriber).
pub const PUBSUB_RECONNECTS_TOTAL: &str = "fairlock_pubsub_reconnects_total";

/// Histogram bucket upper bounds, in seconds, for [`WAIT_SECONDS`] and
/// [`HOLD_SECONDS`]: lock waits and holds from 100 µs to an hour (a
/// batch job under a de-duplication lock holds for minutes). Longer ones
/// land in `+Inf`, where quantiles read as one hour.
pub const SECONDS_BUCKETS: [f64; 23] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Registers help text and units for every fairlock metric with the
/// installed recorder. Call it once after installing a recorder
/// ([`install_prometheus`](crate#exporting-to-prometheus) calls it for you).
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        ACQUIRE_TOTAL,
        Unit::Count,
        "Finished lock acquire calls by outcome (acquired, busy, timeout, refused, cancelled, error)."
    );
    describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "Time from the start of an acquire call to its end, by outcome."
    );
    describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "Time a lock was held, from grant to release."
    );
    describe_counter!(
        CONTENDED_TOTAL,
        Unit::Count,
        "Acquire calls that found the lock busy and joined the queue, whatever their outcome."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        Unit::Count,
        "Waiters ahead of the task in this process that most recently joined a queue."
    );
    describe_counter!(
        HANDOFF_TOTAL,
        Unit::Count,
        "Grants received by direct handoff from a release."
    );
    describe_counter!(
        LEASE_RENEWALS_TOTAL,
        Unit::Count,
        "Watchdog lease renewals, per lock, by result (renewed, lost, error, unreplicated)."
    );
    describe_counter!(
        LEASE_LOST_TOTAL,
        Unit::Count,
        "Grants whose lease was lost while held: another holder may have overlapped."
    );
    describe_counter!(
        WAITERS_EVICTED_TOTAL,
        Unit::Count,
        "Dead waiters removed from queues by this process's scripts."
    );
    describe_counter!(
        WAIT_RECHECK_TOTAL,
        Unit::Count,
        "Waits that re-ran the acquire script instead of being handed the lock (a lost queue entry, a grant found by the heartbeat)."
    );
    describe_counter!(
        PUBSUB_RECONNECTS_TOTAL,
        Unit::Count,
        "Reconnections of the pub/sub connection."
    );
}
