//! Every metric the client records, in one place.
//!
//! Recording goes through the `metrics` facade: without an installed
//! recorder each call is a cheap no-op. Metric names live in
//! `fairlock-metrics`. The lock name becomes a `lock` label only when the
//! user asks for it ([`MetricsLockLabel`]), since names can be unbounded.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use fairlock_metrics as names;
use metrics::Label;

/// Whether and how metrics carry the lock name as a `lock` label.
#[derive(Clone, Default)]
pub enum MetricsLockLabel {
    /// No `lock` label (the default): bounded cardinality whatever the names.
    #[default]
    Off,
    /// The lock name itself. Only for a small, fixed set of names.
    Name,
    /// A function mapping names to a bounded set of groups, e.g.
    /// `"stock:sku-123"` → `"stock"`.
    Group(Arc<dyn Fn(&str) -> String + Send + Sync>),
}

impl fmt::Debug for MetricsLockLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("Off"),
            Self::Name => f.write_str("Name"),
            Self::Group(_) => f.write_str("Group(..)"),
        }
    }
}

impl MetricsLockLabel {
    /// The labels for metrics about lock `name`.
    pub(crate) fn labels(&self, name: &str) -> LockTelemetry {
        let lock = match self {
            Self::Off => None,
            Self::Name => Some(name.to_owned()),
            Self::Group(group) => Some(group(name)),
        };
        LockTelemetry {
            labels: lock
                .map(|l| vec![Label::new("lock", l)])
                .unwrap_or_default(),
        }
    }
}

/// Metrics about one lock, carrying its (optional) `lock` label.
#[derive(Clone, Debug, Default)]
pub(crate) struct LockTelemetry {
    labels: Vec<Label>,
}

impl LockTelemetry {
    fn with(&self, key: &'static str, value: &'static str) -> Vec<Label> {
        let mut labels = self.labels.clone();
        labels.push(Label::new(key, value));
        labels
    }

    /// An acquire ended: `acquired`, `busy`, `timeout`, `cancelled` or `error`.
    pub(crate) fn acquire_ended(&self, outcome: &'static str, started: Instant) {
        let seconds = started.elapsed().as_secs_f64();
        if self.labels.is_empty() {
            // The common case: static labels, no allocation.
            metrics::counter!(names::ACQUIRE_TOTAL, "outcome" => outcome).increment(1);
            metrics::histogram!(names::WAIT_SECONDS, "outcome" => outcome).record(seconds);
            return;
        }
        let labels = self.with("outcome", outcome);
        metrics::counter!(names::ACQUIRE_TOTAL, labels.iter()).increment(1);
        metrics::histogram!(names::WAIT_SECONDS, labels.iter()).record(seconds);
    }

    /// An acquire had to queue behind `position` waiters.
    pub(crate) fn contended(&self, position: u64) {
        // The gauge first: once the count includes this acquire, so does
        // the gauge (the tests rely on it to queue waiters in order).
        metrics::gauge!(names::QUEUE_DEPTH, self.labels.iter()).set(position as f64);
        metrics::counter!(names::CONTENDED_TOTAL, self.labels.iter()).increment(1);
    }

    /// A grant arrived by direct handoff.
    pub(crate) fn handoff(&self) {
        metrics::counter!(names::HANDOFF_TOTAL, self.labels.iter()).increment(1);
    }

    /// A bounded wait fired and re-checked with Redis.
    pub(crate) fn recheck(&self) {
        metrics::counter!(names::WAIT_RECHECK_TOTAL, self.labels.iter()).increment(1);
    }

    /// A hold ended after `since`.
    pub(crate) fn held_for(&self, since: Instant) {
        metrics::histogram!(names::HOLD_SECONDS, self.labels.iter())
            .record(since.elapsed().as_secs_f64());
    }

    /// A held lock's lease was found lost.
    pub(crate) fn lease_lost(&self) {
        metrics::counter!(names::LEASE_LOST_TOTAL, self.labels.iter()).increment(1);
    }
}

/// Dead waiters removed by one of this client's scripts.
pub(crate) fn waiters_evicted(evicted: u64) {
    if evicted > 0 {
        metrics::counter!(names::WAITERS_EVICTED_TOTAL).increment(evicted);
    }
}

/// A watchdog renewal: `renewed`, `lost` or `error`.
pub(crate) fn lease_renewal(result: &'static str) {
    metrics::counter!(names::LEASE_RENEWALS_TOTAL, "result" => result).increment(1);
}

/// The pub/sub connection came back.
pub(crate) fn pubsub_reconnected() {
    metrics::counter!(names::PUBSUB_RECONNECTS_TOTAL).increment(1);
}
