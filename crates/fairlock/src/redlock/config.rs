//! RedLock's configuration and per-call options, checked before any Redis
//! call so that bad input never reaches a primary.

use std::collections::HashMap;
use std::time::Duration;

use fairlock_core::KeyPrefix;
use fred::prelude::Config;
use fred::types::config::ServerConfig;

use crate::config::MAX_DURATION;
use crate::error::{Error, Result};
use crate::redis::{check_scheme, redact};
use crate::telemetry::MetricsLockLabel;

/// How a [`crate::redlock::RedLock`] reaches its primaries, and the timings
/// of the algorithm. Build it with [`RedLockConfig::new`] and set fields.
///
/// All processes sharing locks should use the same primaries, in any
/// order, and the same key prefix.
///
/// ```
/// use std::time::Duration;
/// use fairlock::redlock::RedLockConfig;
///
/// let mut config = RedLockConfig::new([
///     "redis://10.0.0.1:6379",
///     "redis://10.0.0.2:6379",
///     "redis://10.0.0.3:6379",
/// ]);
/// config.call_timeout = Duration::from_millis(100);
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct RedLockConfig {
    /// One `redis://` URL per independent primary (no replication between
    /// them, no cluster); at least 3, an odd number is best. Each server
    /// once: [`RedLockConfig::validate`] refuses one host and port listed
    /// twice, and connecting refuses two URLs whose servers answer with the
    /// same `run_id`.
    pub urls: Vec<String>,
    /// Namespace of RedLock's keys and channels on every primary,
    /// `fairlock:redlock:` by default (apart from the fair lock's keys).
    pub prefix: KeyPrefix,
    /// Limit for connecting to one primary. The client starts once a
    /// majority is connected and keeps trying the rest in the background.
    pub connect_timeout: Duration,
    /// Limit for every call to one primary. Keep it small next to the
    /// lease: a slow primary is counted as failed rather than eating the
    /// lease's validity.
    pub call_timeout: Duration,
    /// Lease of watchdog-kept locks ([`RedLockOptions::new`]); renewed by
    /// majority every third of it.
    pub watchdog_lease: Duration,
    /// The longest lease a caller may ask for.
    pub max_lease: Duration,
    /// The delayed-restart rule: a primary whose uptime is below this does
    /// not vote. Without persistence a restarted primary has forgotten the
    /// votes it gave, so until every lease it may have granted has run out
    /// its vote could make a second majority. It must be zero or at least
    /// [`RedLockConfig::max_lease`] (60 s by default, like the max lease;
    /// raise both together), and every client's max lease should be the
    /// same. Zero turns the rule off, which is safe only with `appendonly
    /// yes` and `appendfsync always` on every primary.
    pub restart_delay: Duration,
    /// The clock drift allowed between the client and the primaries, as a
    /// fraction of the lease (0.01 by default); with
    /// [`RedLockConfig::drift_floor`] it is taken off a grant's validity.
    pub drift_factor: f64,
    /// A fixed part of the drift allowance (2 ms by default).
    pub drift_floor: Duration,
    /// A waiter woken by a release waits a random time up to this before
    /// trying (10 ms by default), so the woken waiters do not all reach the
    /// primaries in the same order.
    pub wake_jitter: Duration,
    /// After an attempt in which no one won a majority (votes split between
    /// contenders), a waiter backs off a random time up to this, doubling on
    /// each further split up to 32 times it (20 ms by default).
    pub split_backoff: Duration,
    /// Whether metrics carry a `lock` label, as
    /// [`crate::ClientConfig::metrics_lock_label`] (off by default: lock
    /// names can be unbounded). RedLock records under the same metric
    /// names as [`crate::LockClient`]; a label is also how one process
    /// using both tells their series apart (docs/METRICS.md).
    pub metrics_lock_label: MetricsLockLabel,
}

/// Printed with the URLs' passwords masked.
impl std::fmt::Debug for RedLockConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|url| redact(url)).collect();
        f.debug_struct("RedLockConfig")
            .field("urls", &urls)
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("watchdog_lease", &self.watchdog_lease)
            .field("max_lease", &self.max_lease)
            .field("restart_delay", &self.restart_delay)
            .field("drift_factor", &self.drift_factor)
            .field("drift_floor", &self.drift_floor)
            .field("wake_jitter", &self.wake_jitter)
            .field("split_backoff", &self.split_backoff)
            .field("metrics_lock_label", &self.metrics_lock_label)
            .finish()
    }
}

impl RedLockConfig {
    /// Defaults for `urls`: 2 s connect timeout, 200 ms call timeout, 30 s
    /// watchdog lease, 60 s longest lease and restart delay, drift 1% + 2 ms.
    pub fn new<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            urls: urls.into_iter().map(Into::into).collect(),
            prefix: default_prefix(),
            connect_timeout: Duration::from_secs(2),
            call_timeout: Duration::from_millis(200),
            watchdog_lease: Duration::from_secs(30),
            max_lease: Duration::from_secs(60),
            restart_delay: Duration::from_secs(60),
            drift_factor: 0.01,
            drift_floor: Duration::from_millis(2),
            wake_jitter: Duration::from_millis(10),
            split_backoff: Duration::from_millis(20),
            metrics_lock_label: MetricsLockLabel::Off,
        }
    }

    /// Sets [`RedLockConfig::metrics_lock_label`].
    ///
    /// ```
    /// use fairlock::redlock::RedLockConfig;
    /// use fairlock::MetricsLockLabel;
    ///
    /// let config = RedLockConfig::new(["redis://a:1", "redis://b:1", "redis://c:1"])
    ///     .metrics_lock_label(MetricsLockLabel::Name);
    /// assert!(config.validate().is_ok());
    /// ```
    #[must_use]
    pub fn metrics_lock_label(mut self, label: MetricsLockLabel) -> Self {
        self.metrics_lock_label = label;
        self
    }

    /// Checks every value; the error names the bad one. Every URL is
    /// parsed as [`crate::LockClient`] parses its URL (a TLS URL needs the
    /// `tls` feature), and one host and port may not be listed twice.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the bad value (a URL with its
    /// password redacted).
    pub fn validate(&self) -> Result<()> {
        if self.urls.len() < 3 {
            return Err(Error::InvalidOptions(format!(
                "RedLock needs at least 3 independent primaries, got {}; for one primary use LockClient",
                self.urls.len()
            )));
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (index, url) in self.urls.iter().enumerate() {
            let server = check_url(index, url)?;
            if let Some(&first) = seen.get(&server) {
                return Err(Error::InvalidOptions(format!(
                    "primaries {first} ({}) and {index} ({}) are the same server ({server}); \
                     a server counted twice would make a false majority: list each server once",
                    redact(&self.urls[first]),
                    redact(url)
                )));
            }
            seen.insert(server, index);
        }
        let ms = Duration::from_millis(1);
        check("connect timeout", self.connect_timeout, ms)?;
        check("call timeout", self.call_timeout, ms)?;
        check("max lease", self.max_lease, Duration::from_millis(10))?;
        check(
            "watchdog lease",
            self.watchdog_lease,
            Duration::from_millis(10),
        )?;
        if self.watchdog_lease > self.max_lease {
            return Err(Error::InvalidOptions(format!(
                "watchdog lease {:?} is longer than the max lease {:?}",
                self.watchdog_lease, self.max_lease
            )));
        }
        if self.call_timeout >= self.watchdog_lease / 3 {
            return Err(Error::InvalidOptions(format!(
                "call timeout {:?} must be shorter than a third of the watchdog lease {:?} (the renewal interval)",
                self.call_timeout, self.watchdog_lease
            )));
        }
        if !self.restart_delay.is_zero() && self.restart_delay < self.max_lease {
            return Err(Error::InvalidOptions(format!(
                "restart delay {:?} is shorter than the max lease {:?}: a primary restarted without persistence could vote while a lease it forgot still runs; make it at least the max lease, or zero to turn the rule off (safe only with appendfsync always)",
                self.restart_delay, self.max_lease
            )));
        }
        for (what, value) in [
            ("restart delay", self.restart_delay),
            ("drift floor", self.drift_floor),
            ("wake jitter", self.wake_jitter),
            ("split backoff", self.split_backoff),
        ] {
            if value > MAX_DURATION {
                return Err(Error::InvalidOptions(format!(
                    "{what} is {value:?}; the limit is {MAX_DURATION:?}"
                )));
            }
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(Error::InvalidOptions(format!(
                "drift factor {} must be at least 0 and below 0.5",
                self.drift_factor
            )));
        }
        self.check_drift(self.watchdog_lease, "watchdog lease")?;
        Ok(())
    }

    /// Refuses a lease the drift allowance uses up: no attempt could leave
    /// it any validity, so none is made (each would vote on every primary,
    /// raise the fence counter and give its votes back with a notice).
    pub(crate) fn check_drift(&self, lease: Duration, what: &str) -> Result<()> {
        let drift = self.drift(lease);
        if drift >= lease {
            return Err(Error::InvalidOptions(format!(
                "{what} {lease:?} is used up by the drift allowance {drift:?} (drift factor {} of it plus the drift floor {:?}): no grant could be valid; lower the drift floor or ask for a longer lease",
                self.drift_factor, self.drift_floor
            )));
        }
        Ok(())
    }

    /// The majority: more than half of the primaries.
    pub fn quorum(&self) -> usize {
        self.urls.len() / 2 + 1
    }

    /// What a grant of `lease` loses to clock drift.
    pub(crate) fn drift(&self, lease: Duration) -> Duration {
        lease.mul_f64(self.drift_factor) + self.drift_floor
    }
}

fn default_prefix() -> KeyPrefix {
    KeyPrefix::new("fairlock:redlock:").unwrap_or_default()
}

/// Parses primary `index`'s URL as the single-server client does when it
/// connects (fred's URL parser, and a TLS URL only with the `tls`
/// feature), so a bad entry is refused here instead of being retried
/// forever as an unreachable primary. Returns what identifies the server
/// in the URL: `host:port` (without the db number or credentials) for a
/// single server, the whole URL otherwise.
fn check_url(index: usize, url: &str) -> Result<String> {
    check_scheme(url, &format!("{} (RedLock primary {index})", redact(url)))?;
    let parsed = Config::from_url(url).map_err(|e| {
        Error::InvalidOptions(format!(
            "RedLock primary {index} ({}) is not a valid Redis URL: {}; expected redis://[user:password@]host:port[/db]",
            redact(url),
            e.details()
        ))
    })?;
    match &parsed.server {
        ServerConfig::Centralized { server } => {
            Ok(format!("{}:{}", server.host.to_ascii_lowercase(), server.port))
        }
        // A Sentinel group fails over asynchronously, which is what RedLock's
        // independent primaries exist to avoid; a cluster is one primary per
        // slot, not one vote.
        _ => Err(Error::InvalidOptions(format!(
            "RedLock primary {index} ({}) is not a single server: RedLock needs independent standalone primaries (redis://host:port), not a Sentinel group or a cluster",
            redact(url)
        ))),
    }
}

fn check(what: &str, value: Duration, min: Duration) -> Result<()> {
    if value < min || value > MAX_DURATION {
        return Err(Error::InvalidOptions(format!(
            "{what} is {value:?}; it must be between {min:?} and {MAX_DURATION:?}"
        )));
    }
    Ok(())
}

/// Options of one RedLock call.
///
/// ```
/// use std::time::Duration;
/// use fairlock::redlock::RedLockOptions;
///
/// let options = RedLockOptions::new()
///     .lease(Duration::from_secs(10))
///     .wait_timeout(Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RedLockOptions {
    pub(crate) lease: Option<Duration>,
    pub(crate) wait_timeout: Option<Duration>,
}

impl RedLockOptions {
    /// A watchdog-renewed lease ([`RedLockConfig::watchdog_lease`]); wait
    /// without limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fixed lease: never renewed; the lock frees itself this long after
    /// the attempt that won it began.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Give up with [`Error::WaitTimeout`] after waiting this long.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = Some(timeout);
        self
    }

    /// The lease to ask for, checked against `config`.
    pub(crate) fn checked_lease(&self, config: &RedLockConfig) -> Result<Duration> {
        let lease = self.lease.unwrap_or(config.watchdog_lease);
        let min = Duration::from_millis(10);
        if lease < min || lease > config.max_lease {
            return Err(Error::InvalidOptions(format!(
                "lease {lease:?} must be between {min:?} and the max lease {:?}",
                config.max_lease
            )));
        }
        config.check_drift(lease, "lease")?;
        if let Some(timeout) = self.wait_timeout {
            if timeout > MAX_DURATION {
                return Err(Error::InvalidOptions(format!(
                    "wait timeout {timeout:?} is longer than {MAX_DURATION:?}; leave it unset to wait without limit"
                )));
            }
        }
        Ok(lease)
    }
}

#[cfg(test)]
mod tests {
    use super::RedLockConfig;
    use crate::error::Error;

    #[test]
    fn debug_output_shows_no_password() {
        let config = RedLockConfig::new(["redis://:secret@a:1", "redis://b:1", "redis://c:1"]);
        let printed = format!("{config:?}");
        assert!(!printed.contains("secret"), "{printed}");
        assert!(printed.contains("redis://:***@a:1"), "{printed}");
    }

    fn refused(urls: [&str; 3]) -> String {
        match RedLockConfig::new(urls).validate() {
            Err(Error::InvalidOptions(message)) => message,
            other => panic!("{urls:?}: expected InvalidOptions, got {other:?}"),
        }
    }

    #[test]
    fn every_primary_url_is_parsed_and_named_when_bad() {
        let message = refused(["not a url at all", "redis://a:1", "redis://b:1"]);
        assert!(message.contains("not a url at all"), "{message}");
        let message = refused(["redis://a:1", "redis://u:secret@b:port", "redis://c:1"]);
        assert!(message.contains("redis://u:***@b:port"), "{message}");
        assert!(!message.contains("secret"), "{message}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_tls_url_needs_the_tls_feature() {
        let message = refused(["redis://a:1", "redis://b:1", "rediss://u:secret@c:1"]);
        assert!(message.contains("rediss://u:***@c:1"), "{message}");
        assert!(message.contains("`tls` feature"), "{message}");
    }

    #[test]
    fn a_sentinel_group_or_a_cluster_is_no_primary() {
        for url in [
            "redis-sentinel://u:secret@s:26379/0?sentinelServiceName=m",
            "redis-cluster://u:secret@c:7000",
        ] {
            let message = refused(["redis://a:1", url, "redis://b:1"]);
            assert!(message.contains("not a single server"), "{message}");
            assert!(!message.contains("secret"), "{message}");
        }
    }

    #[test]
    fn one_host_and_port_listed_twice_is_refused() {
        for [first, second] in [
            ["redis://a:1", "redis://a:1/0"],
            ["redis://a:1/1", "redis://A:1/2"],
            ["redis://a", "redis://u:p@a:6379"],
        ] {
            let message = refused([first, "redis://b:1", second]);
            assert!(message.contains(first), "{message}");
            assert!(message.contains(&super::redact(second)), "{message}");
        }
    }
}
