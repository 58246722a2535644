//! RedLock mode: one lock over N independent Redis primaries, for users who
//! want no single primary whose loss or fail-over can lose a grant.
//!
//! A lock is held when a majority of the primaries voted for it within its
//! lease: [`RedLock::lock`] asks every primary at once, and keeps the lock
//! only if a majority answered yes and time is left after subtracting what
//! the asking took and an allowance for clock drift (the guard's
//! [`RedLockGuard::validity`]). Otherwise it gives every vote back.
//!
//! What it adds to the single-primary lock, and what it gives up:
//!
//! * **Survives a minority.** Any minority of primaries may be down, slow
//!   or restarted; locks, renewals and releases go on.
//! * **Fencing tokens over a majority.** Each primary keeps a counter; a
//!   grant takes the maximum over the majority it won, plus one, and writes
//!   it back there, so tokens strictly increase as long as consecutive
//!   majorities overlap (a counter lost in a restart is covered by a
//!   server-clock floor).
//! * **The delayed-restart rule.** A primary up for less than
//!   [`RedLockConfig::restart_delay`] does not vote: restarted without
//!   persistence, it forgot its votes, and voting again before those leases
//!   ran out could make a second majority. Enforced by the vote script
//!   itself.
//! * **Not fair.** There is no queue: a release wakes every waiter of this
//!   client on that lock (by pub/sub, on one subscriber connection per
//!   primary), and they race for the majority after a random jitter;
//!   whoever gets a majority of the primaries' votes first wins. Waiters on
//!   other clients race the same way. A waiter can lose any number of
//!   races; the order of grants is not the order of arrival. Use
//!   [`crate::LockClient`] for first-come-first-served.
//! * **Timing assumptions.** Safety rests on bounded clock drift, bounded
//!   process pauses and bounded network delay (see the README's RedLock
//!   section). Fencing tokens are what protects a resource when those
//!   assumptions break.
//!
//! Metrics: RedLock records under the same names as [`crate::LockClient`]
//! (docs/METRICS.md): each acquire's outcome and wait, each hold, watchdog
//! renewals by result and lost leases; with
//! [`RedLockConfig::metrics_lock_label`], a `lock` label. It has no queue,
//! so it records no contention, queue depth, handoffs or rechecks.
//!
//! ```no_run
//! use std::time::Duration;
//! use fairlock::redlock::{RedLock, RedLockOptions};
//!
//! # async fn demo() -> fairlock::Result<()> {
//! let redlock = RedLock::connect([
//!     "redis://10.0.0.1:6379",
//!     "redis://10.0.0.2:6379",
//!     "redis://10.0.0.3:6379",
//! ])
//! .await?;
//! let guard = redlock
//!     .lock_with("payments:7", RedLockOptions::new().wait_timeout(Duration::from_secs(2)))
//!     .await?;
//! // ... work, passing guard.token() to every write, within guard.validity() ...
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

mod acquire;
mod config;
mod fencing;
mod guard;
mod primaries;
mod quorum;
mod release_retries;
mod renewal;
mod shared;
mod wakeups;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;

pub use config::{RedLockConfig, RedLockOptions};
pub use guard::RedLockGuard;

use crate::error::{Error, Result};
use crate::task::BackgroundTask;

use acquire::{acquire, Mode};
use primaries::Primaries;
use release_retries::ReleaseRetries;
use shared::Shared;
use wakeups::Wakeups;

/// A RedLock client: connections to N independent primaries. Clone it
/// freely; clones share the connections.
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// let redlock = fairlock::redlock::RedLock::connect([
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
///     "redis://127.0.0.1:7003",
/// ])
/// .await?;
/// if let Some(guard) = redlock.try_lock("cron:daily").await? {
///     println!("token {}", guard.token());
///     guard.release().await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedLock {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    reconnector: Mutex<Option<BackgroundTask>>,
}

impl std::fmt::Debug for RedLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedLock")
            .field("primaries", &self.inner.shared.primaries.len())
            .field("connected", &self.connected())
            .finish()
    }
}

impl RedLock {
    /// Connects to `urls` with the defaults of [`RedLockConfig::new`].
    ///
    /// # Errors
    ///
    /// As [`RedLock::with_config`].
    pub async fn connect<I, S>(urls: I) -> Result<RedLock>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_config(RedLockConfig::new(urls)).await
    }

    /// Connects to every primary at once. The client starts when a majority
    /// is connected; the others are retried in the background.
    ///
    /// Each server that answers is asked for its `run_id`, so that one
    /// server listed under two URLs (a host name and its address, two db
    /// numbers) is not counted twice. A primary unreachable now is checked
    /// when it first answers, against the primaries that answer then; if it
    /// is one of them, it is never counted (and an error is logged).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a bad configuration, a URL that does
    /// not parse or a TLS URL without the `tls` feature (nothing
    /// contacted), or two primaries that answer with the same `run_id`;
    /// [`Error::NoQuorum`] if fewer than a majority could be reached within
    /// the connect timeout.
    pub async fn with_config(config: RedLockConfig) -> Result<RedLock> {
        config.validate()?;
        let primaries = Arc::new(Primaries::new(&config));
        let mut connecting = JoinSet::new();
        for primary in primaries.all() {
            let primary = Arc::clone(primary);
            let config = config.clone();
            connecting.spawn(async move { (primary.index, primary.open(&config).await) });
        }
        let mut failures = Vec::new();
        let mut opened = Vec::new();
        while let Some(joined) = connecting.join_next().await {
            match joined {
                Ok((index, Ok(connection))) => opened.push((index, connection)),
                Ok((_, Err(failure))) => failures.push(failure),
                Err(_) => {}
            }
        }
        opened.sort_by_key(|(index, _)| *index);
        if let Some(refusal) = same_server(&primaries, &opened) {
            for (_, connection) in opened {
                connection.connection.quit().await;
            }
            return Err(refusal);
        }
        for (index, connection) in opened {
            if let Some(primary) = primaries.all().get(index) {
                primary.install(connection.connection).await;
            }
        }
        let connected = primaries
            .all()
            .iter()
            .filter(|p| p.connection().is_some())
            .count();
        if connected < config.quorum() {
            for primary in primaries.all() {
                if let Some(connection) = primary.connection() {
                    connection.quit().await;
                }
            }
            failures.sort_by_key(|f| f.index);
            return Err(Error::NoQuorum {
                name: String::new(),
                answered: connected,
                primaries: primaries.len(),
                needed: config.quorum(),
                failures,
            });
        }
        let wakeups = Wakeups::new(Arc::clone(&primaries));
        for primary in primaries.all() {
            wakeups.attach(primary);
        }
        crate::telemetry::start_alerting_counters(&config.metrics_lock_label);
        let shared = Arc::new(Shared {
            config,
            primaries,
            wakeups,
            closed: AtomicBool::new(false),
            closing: tokio::sync::Notify::new(),
            release_retries: ReleaseRetries::default(),
        });
        let reconnector = (connected < shared.primaries.len())
            .then(|| spawn_reconnector(Arc::downgrade(&shared)));
        Ok(RedLock {
            inner: Arc::new(Inner {
                shared,
                reconnector: Mutex::new(reconnector),
            }),
        })
    }

    /// Waits until the lock is held on a majority, with a watchdog-kept
    /// lease.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] (nothing contacted), [`Error::NoQuorum`] when
    /// fewer than a majority of primaries can vote, [`Error::Closed`] once
    /// [`RedLock::close`] was called (also for a call waiting then).
    pub async fn lock(&self, name: &str) -> Result<RedLockGuard> {
        self.lock_with(name, RedLockOptions::new()).await
    }

    /// As [`RedLock::lock`], with a fixed lease or a wait timeout.
    ///
    /// # Errors
    ///
    /// As [`RedLock::lock`], plus [`Error::InvalidOptions`] for a lease out
    /// of range (or so short that winning the majority used it up) and
    /// [`Error::WaitTimeout`] when the wait ran out.
    pub async fn lock_with(&self, name: &str, options: RedLockOptions) -> Result<RedLockGuard> {
        match acquire(&self.inner.shared, name, options, Mode::Wait).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::WaitTimeout {
                name: name.to_owned(),
                waited: Duration::ZERO,
            }),
        }
    }

    /// One attempt: `Some(guard)` if it won a majority, `None` if the lock
    /// is held (or contended) elsewhere.
    ///
    /// # Errors
    ///
    /// As [`RedLock::lock`].
    pub async fn try_lock(&self, name: &str) -> Result<Option<RedLockGuard>> {
        self.try_lock_with(name, RedLockOptions::new()).await
    }

    /// As [`RedLock::try_lock`], with a fixed lease (the wait timeout is
    /// ignored).
    ///
    /// # Errors
    ///
    /// As [`RedLock::lock_with`].
    pub async fn try_lock_with(
        &self,
        name: &str,
        options: RedLockOptions,
    ) -> Result<Option<RedLockGuard>> {
        acquire(&self.inner.shared, name, options, Mode::Try).await
    }

    /// How many primaries are connected right now.
    pub fn connected(&self) -> usize {
        self.inner
            .shared
            .primaries
            .all()
            .iter()
            .filter(|p| p.connection().is_some_and(|c| c.is_connected()))
            .count()
    }

    /// The configuration in use.
    pub fn config(&self) -> &RedLockConfig {
        &self.inner.shared.config
    }

    /// Stops the background tasks and closes every connection. Guards still
    /// alive lose their watchdog; their keys expire with the lease (counted
    /// neither as failed renewals nor as lost leases). Calls waiting for a
    /// lock end at once with [`Error::Closed`] (counted as `cancelled`), as
    /// do later ones.
    pub async fn close(&self) {
        self.inner.shared.close();
        let reconnector = self
            .inner
            .reconnector
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(mut reconnector) = reconnector {
            reconnector.shutdown().await;
        }
        self.inner.shared.release_retries.shutdown().await;
        self.inner.shared.wakeups.shutdown().await;
        for primary in self.inner.shared.primaries.all() {
            if let Some(connection) = primary.connection() {
                connection.quit().await;
            }
        }
    }
}

/// The refusal of two opened primaries whose servers answered with the
/// same `run_id`: one server under two URLs would count twice.
fn same_server(primaries: &Primaries, opened: &[(usize, primaries::Opened)]) -> Option<Error> {
    opened.iter().enumerate().find_map(|(at, (second, later))| {
        let (first, _) = opened[..at]
            .iter()
            .find(|(_, earlier)| earlier.run_id == later.run_id)?;
        let url = |index: usize| {
            primaries
                .all()
                .get(index)
                .map(|p| p.redacted_url().to_owned())
                .unwrap_or_default()
        };
        Some(Error::InvalidOptions(format!(
            "primaries {first} ({}) and {second} ({}) are the same server (run_id {}); \
             a server counted twice would make a false majority: list each server once",
            url(*first),
            url(*second),
            later.run_id
        )))
    })
}

/// Connects the primaries that were unreachable at start, once a second,
/// until all are connected or refused; each one is first compared, by
/// `run_id`, with the primaries connected then (one that is the same
/// server as one of them is refused for good and an error logged), and
/// each one connected starts routing release notices.
fn spawn_reconnector(shared: std::sync::Weak<Shared>) -> BackgroundTask {
    BackgroundTask::spawn("redlock reconnect", move |mut stop| async move {
        loop {
            tokio::select! {
                () = stop.requested() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let mut missing = 0;
            for primary in shared.primaries.all() {
                if primary.connection().is_some() || primary.is_refused() {
                    continue;
                }
                let Ok(opened) = primary.open(&shared.config).await else {
                    missing += 1;
                    continue;
                };
                let same = shared
                    .primaries
                    .same_server_as(primary.index, &opened.run_id)
                    .await
                    .and_then(|other| shared.primaries.all().get(other));
                if let Some(other) = same {
                    tracing::error!(
                        primary = primary.index,
                        url = primary.redacted_url(),
                        same_as = other.index,
                        same_as_url = other.redacted_url(),
                        "RedLock: this primary is the same server as another one (same run_id); it is not counted, or that server would vote twice: list each server once"
                    );
                    primary.refuse(other, opened).await;
                } else {
                    primary.install(opened.connection).await;
                    shared.wakeups.attach(primary);
                }
            }
            if missing == 0 {
                return;
            }
        }
    })
}
