//! Client configuration and per-call lock options, validated before any
//! Redis call so that bad input never reaches Redis.
//!
//! [`ClientConfig::builder`] checks every value when the configuration is
//! built; a configuration changed field by field is checked again when a
//! client connects with it. The structs are `#[non_exhaustive]`: fields can
//! be added without breaking code that builds them through the builder or
//! [`ClientConfig::new`] and field assignment.

use std::time::Duration;

use fairlock_core::{KeyPrefix, Timings};

use crate::error::{Error, Result};
use crate::telemetry::MetricsLockLabel;

/// The longest lease or timing fairlock accepts: anything longer is almost
/// certainly a unit mistake (seconds given as milliseconds).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// How a lock's lease is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// A fixed lease: the lock expires this long after the grant unless
    /// the holder calls `extend`. No background renewal.
    Fixed(Duration),
    /// The client's watchdog renews the lease while the guard lives
    /// (see [`ClientConfig::watchdog_lease`]).
    Watchdog,
}

/// How many replicas must acknowledge a lock write, and how long to wait
/// for them (see [`ClientConfig::replica_acks`]).
///
/// ```
/// use std::time::Duration;
/// let acks = fairlock::ReplicaAcks::new(1, Duration::from_millis(100));
/// assert_eq!(acks.replicas, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaAcks {
    /// Replicas that must acknowledge.
    pub replicas: u32,
    /// How long `WAIT` may block.
    pub timeout: Duration,
}

impl ReplicaAcks {
    /// `replicas` must acknowledge within `timeout` (checked when the
    /// configuration is built or a client connects).
    pub fn new(replicas: u32, timeout: Duration) -> Self {
        Self { replicas, timeout }
    }
}

/// What a client does at connect when the server may evict lock keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionCheck {
    /// Log a warning and expose it as [`crate::LockClient::eviction_warning`].
    #[default]
    Warn,
    /// Refuse to connect with [`Error::UnsafeServer`].
    Fail,
    /// Do not check (e.g. `CONFIG` is renamed and the setting is known).
    Off,
}

/// Options of one lock call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockOptions {
    pub(crate) lease: Lease,
    pub(crate) wait_timeout: Option<Duration>,
    pub(crate) admission: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            lease: Lease::Watchdog,
            wait_timeout: None,
            admission: false,
        }
    }
}

impl LockOptions {
    /// Watchdog-renewed lease, wait without limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fixed lease: the lock frees itself this long after the grant.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Lease::Fixed(lease);
        self
    }

    /// Give up with [`Error::WaitTimeout`] after waiting this long in the
    /// queue. When the error is returned the caller's entry has left the
    /// queue (a grant that raced the timeout is passed on), unless Redis
    /// failed that cancel too: the heartbeat then tries it again.
    ///
    /// It bounds the wait for the lock, not a Redis call in flight: the
    /// first call is always answered (a free lock is granted even with a
    /// zero wait timeout), and each call, the cancel included, is bounded
    /// by [`crate::ClientConfig::command_timeout`] instead. Against a
    /// server that stops answering, a call can take the wait timeout plus
    /// two command timeouts. For a hard bound on the whole call, wrap its
    /// future in `tokio::time::timeout`: dropping it is safe, and the
    /// cancel then runs in the background.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = Some(timeout);
        self
    }

    /// Deadline-aware admission (off by default; needs a wait timeout):
    /// when the caller's place in the queue means it cannot be served
    /// within its wait timeout, at the grant rate this client has seen on
    /// the lock, it leaves the queue at once and fails with
    /// [`Error::WouldMissDeadline`] instead of holding a place in line until
    /// the timeout. Callers that joined before the client had seen a grant
    /// rate (the head of a burst) are checked again, with the position they
    /// joined at, whenever the estimate is new or moves by more than a
    /// quarter: those that cannot make it leave then, within one grant of
    /// the first estimate. The estimate is a guess: a caller refused on it
    /// might have been served had the holders ahead been quicker. One that
    /// no grant after a wait has confirmed for 60 s is forgotten.
    pub fn admission(mut self, on: bool) -> Self {
        self.admission = on;
        self
    }

    /// Checks the options without calling Redis; every lock call does this
    /// first.
    pub fn validate(&self) -> Result<()> {
        if let Lease::Fixed(lease) = self.lease {
            check_duration("lease", lease, Duration::from_millis(1))?;
        }
        if let Some(timeout) = self.wait_timeout {
            if timeout > MAX_DURATION {
                return Err(Error::InvalidOptions(format!(
                    "wait timeout {timeout:?} is longer than {MAX_DURATION:?}; leave it unset to wait without limit"
                )));
            }
        }
        if self.admission && self.wait_timeout.is_none() {
            return Err(Error::InvalidOptions(
                "admission needs a wait timeout: it refuses the waits that would miss it".into(),
            ));
        }
        Ok(())
    }
}

/// How a [`crate::LockClient`] connects and the protocol timings it uses.
///
/// All processes sharing locks should use the same timings. Build one with
/// [`ClientConfig::builder`], which checks the values, or start from
/// [`ClientConfig::new`] and assign fields (checked at connect).
///
/// ```
/// use std::time::Duration;
/// use fairlock::ClientConfig;
///
/// let config = ClientConfig::builder("redis://127.0.0.1:6379")
///     .prefix("app:")
///     .heartbeat_interval(Duration::from_millis(500))
///     .waiter_timeout(Duration::from_secs(3))
///     .build()?;
/// assert_eq!(config.prefix.as_str(), "app:");
///
/// // A waiter timeout that a heartbeat cannot beat is refused up front.
/// assert!(ClientConfig::builder("redis://127.0.0.1:6379")
///     .heartbeat_interval(Duration::from_secs(5))
///     .waiter_timeout(Duration::from_secs(2))
///     .build()
///     .is_err());
/// # Ok::<(), fairlock::Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// `redis://[user:password@]host:port[/db]` (or `rediss://` with the `tls` feature).
    pub url: String,
    /// Namespace of every key and channel, `fairlock:` by default.
    pub prefix: KeyPrefix,
    /// Limit for connecting; an unreachable Redis fails after this long.
    pub connect_timeout: Duration,
    /// Limit for every Redis call.
    pub command_timeout: Duration,
    /// How often this process refreshes its waiters' deadlines (batched:
    /// one script call per 32 locks waited on, per slot on a cluster).
    /// Also the keep-alive of fairlock's own pub/sub connections: after
    /// this long without a word from Redis one sends `PING`, and is
    /// reopened (on a cluster: closed, until a waiter needs the node again)
    /// if no answer comes within the command timeout; behind Sentinel it
    /// also moves to the primary fred reached after a fail-over at the
    /// next such check.
    pub heartbeat_interval: Duration,
    /// A waiter without a heartbeat for this long is dead and skipped. At
    /// least twice the heartbeat interval (three times or more is safe).
    pub waiter_timeout: Duration,
    /// Lease of watchdog-kept locks. The watchdog ticks every heartbeat
    /// interval, or every third of the lease if that is shorter, and renews
    /// a lease once a third of it is used, so the renewal interval is
    /// derived from the lease and can never outgrow it.
    pub watchdog_lease: Duration,
    /// Opt-in replica acknowledgement: after every write that matters (a
    /// grant, a handoff taken, a release, a renewal) the client runs
    /// `WAIT replicas timeout` and treats fewer acknowledgements as a
    /// failure: an acquire gives back what it took and fails with
    /// [`Error::NotReplicated`], a renewal fires the lease-lost signal.
    /// `None` (the default) waits for no replica. WAIT is not consensus: it
    /// narrows the window in which a fail-over loses a grant, it does not
    /// close it. Its timeout must be at most half the command timeout and,
    /// with the heartbeat interval, shorter than the waiter timeout: `WAIT`
    /// blocks its connection, and the calls behind it must stay in time.
    /// A single server or Sentinel only: refused on a Redis Cluster
    /// ([`Error::InvalidOptions`](crate::Error::InvalidOptions) at connect),
    /// where a `WAIT` would be answered by one arbitrary primary.
    pub replica_acks: Option<ReplicaAcks>,
    /// What to do when the server may evict lock keys (its
    /// `maxmemory-policy` is not `noeviction`): warn (the default), fail
    /// to connect, or not check.
    pub eviction_check: EvictionCheck,
    /// Whether metrics carry a `lock` label (off by default: lock names
    /// can be unbounded).
    pub metrics_lock_label: MetricsLockLabel,
    /// Opt-in bound on the script calls each command connection keeps in
    /// flight at once (`None`, the default: no bound). With a bound, a
    /// burst of `lock()` calls beyond it waits its turn in this process,
    /// in call order, instead of all at once in the connection's pipeline:
    /// each call in flight costs about 6 KB of the Redis client's memory,
    /// and 10,000 at once leave megabytes of freed, fragmented heap
    /// behind. The price: under saturation callers wait in each process's
    /// own line, so callers of different processes can overtake each other
    /// by call time (ticket order is kept). Not applied on a Redis
    /// Cluster, where one window for all nodes would let calls to a node
    /// that is failing over hold up the calls to the others.
    pub max_in_flight: Option<usize>,
    /// Whether a lock's acquire and release calls (and its waiters'
    /// heartbeat; a permit set's likewise) go on a socket of
    /// fairlock's own that the calling task writes and reads itself (on
    /// by default; used on a single server, behind Sentinel, where it
    /// connects only to a server that answers `ROLE` as the primary, and
    /// on a cluster, at the node serving the call's slot). A call through
    /// the Redis client's connection crosses to its connection task and
    /// back, which on a multi-threaded runtime wakes other worker threads:
    /// about 15-20 µs per call on a local server. Each command lane gets
    /// one such socket (two more connections per client; on a cluster two
    /// more per node called); calls made at once are pipelined on it. A
    /// call goes through the Redis client instead while the socket is down
    /// (for a second after a failed connect) or owes a reply to a call
    /// that stopped waiting (a timeout, a dropped future), on a cluster
    /// when the node redirects it (`MOVED`, `ASK`) or cannot serve it yet
    /// (`TRYAGAIN`, `CLUSTERDOWN`), and with `replica_acks`, where the
    /// sockets are not used.
    /// Off: every call goes through the Redis client.
    pub direct_calls: bool,
}

/// Printed with the URL's passwords masked (a configuration is often
/// logged at startup).
impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("url", &crate::redis::redact(&self.url))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("waiter_timeout", &self.waiter_timeout)
            .field("watchdog_lease", &self.watchdog_lease)
            .field("replica_acks", &self.replica_acks)
            .field("eviction_check", &self.eviction_check)
            .field("metrics_lock_label", &self.metrics_lock_label)
            .field("max_in_flight", &self.max_in_flight)
            .field("direct_calls", &self.direct_calls)
            .finish()
    }
}

impl ClientConfig {
    /// Defaults for `url`: 5 s timeouts, 1 s heartbeat, 5 s waiter
    /// timeout, 30 s watchdog lease, a warning if the server may evict keys.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: KeyPrefix::default(),
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(5),
            heartbeat_interval: Duration::from_secs(1),
            waiter_timeout: Duration::from_secs(5),
            eviction_check: EvictionCheck::Warn,
            replica_acks: None,
            watchdog_lease: Duration::from_secs(30),
            metrics_lock_label: MetricsLockLabel::Off,
            max_in_flight: None,
            direct_calls: true,
        }
    }

    /// A builder starting from the defaults of [`ClientConfig::new`];
    /// [`ClientConfigBuilder::build`] checks every value.
    pub fn builder(url: impl Into<String>) -> ClientConfigBuilder {
        ClientConfigBuilder {
            config: Self::new(url),
            prefix: None,
        }
    }

    /// Checks every value; the message of the error names the bad one.
    pub fn validate(&self) -> Result<()> {
        check_duration(
            "connect timeout",
            self.connect_timeout,
            Duration::from_millis(1),
        )?;
        check_duration(
            "command timeout",
            self.command_timeout,
            Duration::from_millis(1),
        )?;
        check_duration(
            "heartbeat interval",
            self.heartbeat_interval,
            Duration::from_millis(10),
        )?;
        check_duration(
            "waiter timeout",
            self.waiter_timeout,
            Duration::from_millis(20),
        )?;
        check_duration(
            "watchdog lease",
            self.watchdog_lease,
            Duration::from_millis(30),
        )?;
        if let Some(acks) = self.replica_acks {
            check_duration(
                "replica ack timeout",
                acks.timeout,
                Duration::from_millis(1),
            )?;
            if acks.replicas == 0 {
                return Err(Error::InvalidOptions(
                    "replica_acks with 0 replicas waits for nothing; leave it None instead".into(),
                ));
            }
        }
        if let Some(calls) = self
            .max_in_flight
            .filter(|calls| !(1..=MAX_IN_FLIGHT_LIMIT).contains(calls))
        {
            return Err(Error::InvalidOptions(format!(
                "max_in_flight {calls} is out of range: give 1 to {MAX_IN_FLIGHT_LIMIT} script calls per connection, or leave it None for no bound"
            )));
        }
        // Half the waiter timeout is left for a heartbeat call to take:
        // an interval just under the timeout was accepted, and a heartbeat
        // a little slow then cost every live waiter of the process its
        // place.
        if self.heartbeat_interval * 2 > self.waiter_timeout {
            return Err(Error::InvalidOptions(format!(
                "heartbeat interval {:?} must be at most half the waiter timeout {:?} (a third of it or less is safe), or a slow heartbeat would evict live waiters",
                self.heartbeat_interval, self.waiter_timeout
            )));
        }
        if let Some(acks) = self.replica_acks {
            // `WAIT` blocks the connection it runs on for up to its
            // timeout, and it runs on both command connections.
            if acks.timeout * 2 > self.command_timeout {
                return Err(Error::InvalidOptions(format!(
                    "replica ack timeout {:?} must be at most half the command timeout {:?}: WAIT holds its connection that long, and the calls queued behind it (a release, a renewal, giving back an unacknowledged grant) must still finish in time",
                    acks.timeout, self.command_timeout
                )));
            }
            if acks.timeout + self.heartbeat_interval >= self.waiter_timeout {
                return Err(Error::InvalidOptions(format!(
                    "replica ack timeout {:?} plus the heartbeat interval {:?} must be shorter than the waiter timeout {:?}: a heartbeat queued behind a WAIT would come too late and live waiters would be taken for dead",
                    acks.timeout, self.heartbeat_interval, self.waiter_timeout
                )));
            }
        }
        self.timings().map(drop)
    }

    /// The scripts' timings. `validate` has checked them: the waiter
    /// timeout and heartbeat interval are at most a day, so every TTL is
    /// in the range `Timings::new` takes.
    pub(crate) fn timings(&self) -> Result<Timings> {
        Timings::new(
            millis(self.waiter_timeout),
            // An abandoned queue vanishes; a live one is refreshed by every heartbeat.
            millis(self.waiter_timeout.max(self.heartbeat_interval) * 4),
            // Losing the counter is safe (it restarts above the server
            // clock); this only bounds how long an idle lock leaves keys.
            600_000,
        )
        .map_err(|invalid| Error::InvalidOptions(format!("timings: {invalid}")))
    }
}

/// The largest [`ClientConfig::max_in_flight`] accepted.
const MAX_IN_FLIGHT_LIMIT: usize = 1_000_000;

/// Builds a [`ClientConfig`], checking every value at [`build`]: zero or
/// absurd durations, a waiter timeout the heartbeat cannot keep alive, a
/// key prefix with braces, replica acknowledgement of zero replicas.
///
/// [`build`]: ClientConfigBuilder::build
///
/// ```
/// use std::time::Duration;
/// use fairlock::{ClientConfig, EvictionCheck};
///
/// let config = ClientConfig::builder("redis://127.0.0.1:6379")
///     .command_timeout(Duration::from_secs(2))
///     .watchdog_lease(Duration::from_secs(10))
///     .eviction_check(EvictionCheck::Fail)
///     .build()?;
/// assert_eq!(config.watchdog_lease, Duration::from_secs(10));
/// # Ok::<(), fairlock::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "call .build() to get the configuration"]
pub struct ClientConfigBuilder {
    config: ClientConfig,
    /// Checked at `build`, so the builder chain never fails halfway.
    prefix: Option<String>,
}

impl ClientConfigBuilder {
    /// Namespace of every key and channel (see [`ClientConfig::prefix`]);
    /// at most [`fairlock_core::MAX_PREFIX_BYTES`] bytes, no braces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// See [`ClientConfig::connect_timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// See [`ClientConfig::command_timeout`].
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.config.command_timeout = timeout;
        self
    }

    /// See [`ClientConfig::heartbeat_interval`]; must be shorter than the
    /// waiter timeout.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.config.heartbeat_interval = interval;
        self
    }

    /// See [`ClientConfig::waiter_timeout`]; must be longer than the
    /// heartbeat interval.
    pub fn waiter_timeout(mut self, timeout: Duration) -> Self {
        self.config.waiter_timeout = timeout;
        self
    }

    /// See [`ClientConfig::watchdog_lease`].
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.config.watchdog_lease = lease;
        self
    }

    /// See [`ClientConfig::replica_acks`]: at least one replica, within
    /// `timeout`.
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.config.replica_acks = Some(ReplicaAcks::new(replicas, timeout));
        self
    }

    /// See [`ClientConfig::direct_calls`].
    pub fn direct_calls(mut self, on: bool) -> Self {
        self.config.direct_calls = on;
        self
    }

    /// See [`ClientConfig::max_in_flight`]: 1 to 1,000,000.
    pub fn max_in_flight(mut self, calls: usize) -> Self {
        self.config.max_in_flight = Some(calls);
        self
    }

    /// See [`ClientConfig::eviction_check`].
    pub fn eviction_check(mut self, check: EvictionCheck) -> Self {
        self.config.eviction_check = check;
        self
    }

    /// See [`ClientConfig::metrics_lock_label`].
    pub fn metrics_lock_label(mut self, label: MetricsLockLabel) -> Self {
        self.config.metrics_lock_label = label;
        self
    }

    /// The configuration, or [`Error::InvalidOptions`] /
    /// [`Error::InvalidName`] naming the first bad value.
    pub fn build(self) -> Result<ClientConfig> {
        let mut config = self.config;
        if let Some(prefix) = self.prefix {
            config.prefix = KeyPrefix::new(prefix)?;
        }
        config.validate()?;
        Ok(config)
    }
}

fn check_duration(what: &str, value: Duration, min: Duration) -> Result<()> {
    if value < min {
        return Err(Error::InvalidOptions(format!(
            "{what} is {value:?}; it must be at least {min:?}"
        )));
    }
    if value > MAX_DURATION {
        return Err(Error::InvalidOptions(format!(
            "{what} is {value:?}; the limit is {MAX_DURATION:?} (was a value in ms given as seconds?)"
        )));
    }
    Ok(())
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_options_are_refused() {
        assert!(LockOptions::new().lease(Duration::ZERO).validate().is_err());
        assert!(LockOptions::new()
            .lease(Duration::from_secs(90_000))
            .validate()
            .is_err());
        assert!(LockOptions::new()
            .lease(Duration::from_secs(1))
            .validate()
            .is_ok());
        let mut config = ClientConfig::new("redis://127.0.0.1");
        assert!(config.validate().is_ok());
        config.heartbeat_interval = config.waiter_timeout;
        assert!(config.validate().is_err());
    }

    /// A configuration printed with `{:?}` (a startup log) shows no
    /// password of the URL.
    #[test]
    fn debug_output_shows_no_password() {
        let config = ClientConfig::new(
            "redis-sentinel://u:secret@h:1?sentinelServiceName=m&sentinelPassword=other",
        );
        let printed = format!("{config:?}");
        assert!(!printed.contains("secret"), "{printed}");
        assert!(!printed.contains("other"), "{printed}");
        assert!(printed.contains("u:***@h:1"), "{printed}");
        assert!(printed.contains("command_timeout"), "{printed}");
    }
}
