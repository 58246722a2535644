//! Every metric the client records, and the fields of its acquire span, in
//! one place.
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
use tracing::field::Empty;
use tracing::Span;

use crate::error::Error;

/// The span of one acquire call (level DEBUG), named and filled after the
/// OpenTelemetry conventions, so that a `tracing-opentelemetry` pipeline
/// shows the wait inside the caller's request trace:
/// - `otel.kind` is `internal` (the Redis calls inside are `client` spans,
///   see [`script_span`]);
/// - `otel.status_code` is `ERROR` and `error.type` names the failure when
///   the acquire fails (a busy `try_lock` is not a failure);
/// - `fairlock.*` attributes carry the lock: its name, the mode, the
///   ticket and queue position if it queued, the fencing token of the
///   grant, and the outcome (as in `fairlock_acquire_total`).
pub(crate) fn acquire_span(name: &str, mode: &'static str) -> Span {
    tracing::debug_span!(
        "fairlock.acquire",
        otel.name = "fairlock.acquire",
        otel.kind = "internal",
        otel.status_code = Empty,
        error.type = Empty,
        fairlock.lock.name = name,
        fairlock.acquire.mode = mode,
        fairlock.ticket = Empty,
        fairlock.queue.position = Empty,
        fairlock.token = Empty,
        fairlock.outcome = Empty,
    )
}

/// The span of one script call (level TRACE): an OpenTelemetry database
/// client span, `EVALSHA <script>`, with `db.system.name` `redis` and the
/// script as `db.stored_procedure.name`.
pub(crate) fn script_span(script: &str) -> Span {
    tracing::trace_span!(
        "redis.script",
        otel.name = %format_args!("EVALSHA {script}"),
        otel.kind = "client",
        otel.status_code = Empty,
        error.type = Empty,
        db.system.name = "redis",
        db.operation.name = "EVALSHA",
        db.stored_procedure.name = script,
    )
}

/// Marks the current span failed with `error` (OpenTelemetry status and
/// `error.type`).
pub(crate) fn span_failed(error: &Error) {
    let span = Span::current();
    span.record("otel.status_code", "ERROR");
    span.record("error.type", error_type(error));
}

/// A short, stable name for the kind of `error`, for `error.type`.
pub(crate) fn error_type(error: &Error) -> &'static str {
    match error {
        Error::InvalidName { .. } => "invalid_name",
        Error::InvalidOptions { .. } => "invalid_options",
        Error::WaitTimeout { .. } => "wait_timeout",
        Error::WouldMissDeadline { .. } => "would_miss_deadline",
        Error::NotOwner { .. } => "not_owner",
        Error::LeaseLost { .. } => "lease_lost",
        Error::WrongType { .. } => "wrong_type",
        Error::Unreachable { .. } => "unreachable",
        Error::Timeout { .. } => "timeout",
        Error::ScriptMissing { .. } => "script_missing",
        Error::StaleToken { .. } => "stale_token",
        Error::UnsafeServer { .. } => "unsafe_server",
        Error::NotReplicated { .. } => "not_replicated",
        Error::ReadOnly { .. } => "read_only",
        Error::OutOfMemory { .. } => "out_of_memory",
        Error::Busy { .. } => "busy_script",
        Error::NoPermission { .. } => "no_permission",
        Error::ScriptFailed { .. } => "script_failed",
        Error::Protocol { .. } => "protocol",
        Error::Redis { .. } => "redis",
        Error::Closed => "closed",
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

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
    /// The outcome is also recorded on the current (acquire) span.
    pub(crate) fn acquire_ended(&self, outcome: &'static str, started: Instant) {
        let span = Span::current();
        span.record("fairlock.outcome", outcome);
        if !matches!(outcome, "acquired" | "busy") {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", outcome);
        }
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

    /// An acquire had to queue behind `position` waiters, with `ticket`.
    pub(crate) fn contended(&self, position: u64, ticket: u64) {
        let span = Span::current();
        span.record("fairlock.ticket", ticket);
        span.record("fairlock.queue.position", position);
        // The gauge first: once the count includes this acquire, so does
        // the gauge (the tests rely on it to queue waiters in order).
        metrics::gauge!(names::QUEUE_DEPTH, self.labels.iter()).set(position as f64);
        metrics::counter!(names::CONTENDED_TOTAL, self.labels.iter()).increment(1);
    }

    /// The acquire was granted with fencing token `token` (recorded on
    /// the current span).
    pub(crate) fn granted(&self, token: u64) {
        Span::current().record("fairlock.token", token);
        if !self.labels.is_empty() {
            // This lock's lost-lease series exists at 0 from its first
            // grant (see `start_alerting_counters`).
            metrics::counter!(names::LEASE_LOST_TOTAL, self.labels.iter()).increment(0);
        }
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

/// Makes the counters that alerts watch for a first event exist at 0 from
/// the start: Prometheus's `increase()` sees nothing of a series whose
/// first sample already holds its first events, so a process's first
/// lost leases or evictions would never alert (the alerts also catch a
/// series born above 0, for events before the first scrape). The
/// lost-lease counter is made here for the unlabelled series only; with a
/// `lock` label, each lock's series is made at its first grant
/// (`LockTelemetry::granted`).
pub(crate) fn start_alerting_counters(labels: &MetricsLockLabel) {
    if matches!(labels, MetricsLockLabel::Off) {
        metrics::counter!(names::LEASE_LOST_TOTAL).increment(0);
    }
    metrics::counter!(names::LEASE_RENEWALS_TOTAL, "result" => "lost").increment(0);
    metrics::counter!(names::WAITERS_EVICTED_TOTAL).increment(0);
}

/// Watchdog renewals of `locks` locks: `renewed`, `lost`, `error` or
/// `unreplicated`. Counted per lock, also when one call failed for all.
pub(crate) fn lease_renewals(result: &'static str, locks: usize) {
    if locks > 0 {
        metrics::counter!(names::LEASE_RENEWALS_TOTAL, "result" => result).increment(locks as u64);
    }
}

/// The pub/sub connection came back.
pub(crate) fn pubsub_reconnected() {
    metrics::counter!(names::PUBSUB_RECONNECTS_TOTAL).increment(1);
}
