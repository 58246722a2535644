//! The wait for a RedLock: attempt, and between attempts sleep until a
//! release notice, the holder's lease end, or a short random back-off.
//!
//! There is no queue. After a failed attempt the task registers for the
//! lock's release notices and tries once more at once (a release between
//! the first attempt and the registration would otherwise be missed), then
//! sleeps:
//!
//! * another owner holds a majority: until a release notice, or until that
//!   owner's majority would expire by the leases the primaries reported
//!   (a watchdog may have renewed it: then it sleeps again), plus a random
//!   jitter up to `wake_jitter`;
//! * votes split between contenders (no one won): a random back-off up to
//!   `split_backoff`, doubling per consecutive split up to 32 times it;
//! * fewer than a majority could vote: fail at once with
//!   [`Error::NoQuorum`], nothing waits;
//! * a majority was won but the lease was used up meanwhile: fail with
//!   [`Error::InvalidOptions`] (the lease is too short for these
//!   primaries; retrying would only repeat it).
//!
//! Each call that passed the checks of its name and options is counted
//! once in `fairlock_acquire_total` and `fairlock_wait_seconds`, as
//! `LockClient`'s are: `acquired`, `busy` (a try that found the lock held
//! or contended), `timeout`, `cancelled` (the future dropped, or the client
//! closed: [`Error::Closed`]) or `error` (any other failure, e.g.
//! [`Error::NoQuorum`]). A drop guard, [`Outcome`], counts a dropped call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock_core::{LockName, RedLockKeys};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::guard::FencingToken;
use crate::telemetry::LockTelemetry;

use super::config::RedLockOptions;
use super::guard::RedLockGuard;
use super::quorum::{attempt, give_back_later, Attempt, LeftVotes, Won};
use super::renewal::{HoldStatus, LeaseWatchdog};
use super::shared::Shared;
use super::wakeups::Subscription;

/// Whether the caller waits when the lock is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Wait,
    Try,
}

/// Acquires `name`; `None` only in [`Mode::Try`] when the lock is taken.
/// Counted once by its outcome, unless the name or options are refused
/// (nothing contacted).
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    name: &str,
    options: RedLockOptions,
    mode: Mode,
) -> Result<Option<RedLockGuard>> {
    let lock_name = LockName::new(name)?;
    let lease = options.checked_lease(&shared.config)?;
    // With the label off: no allocation (an empty list of labels).
    let telemetry = shared.config.metrics_lock_label.labels(name);
    let mut outcome = Outcome::new(&telemetry);
    let result = acquire_checked(shared, name, &lock_name, options, lease, mode, &telemetry).await;
    outcome.ended(match &result {
        Ok(Some(_)) => "acquired",
        Ok(None) => "busy",
        Err(Error::WaitTimeout { .. }) => "timeout",
        Err(Error::Closed) => "cancelled",
        Err(_) => "error",
    });
    result
}

/// The acquire of a checked name and lease.
async fn acquire_checked(
    shared: &Arc<Shared>,
    name: &str,
    lock_name: &LockName,
    options: RedLockOptions,
    lease: Duration,
    mode: Mode,
    telemetry: &LockTelemetry,
) -> Result<Option<RedLockGuard>> {
    let keys = Arc::new(RedLockKeys::new(&shared.config.prefix, lock_name));
    let owner_id: Arc<str> = Arc::from(uuid::Uuid::new_v4().simple().to_string());
    let token_of = |value: u64| {
        FencingToken::new(value, &owner_id).ok_or_else(|| {
            Error::InvalidOptions(format!(
                "no fencing token for {value} and owner id {owner_id}: the value is above FencingToken::MAX_VALUE (a fence counter set by hand?) or the id is not 32 hex digits"
            ))
        })
    };
    let began = Instant::now();
    let deadline = options.wait_timeout.map(|timeout| began + timeout);
    let mut subscription: Option<Subscription> = None;
    let mut splits: u32 = 0;
    let mut left = LeftVotes::new(shared, &keys, &owner_id, lease);
    loop {
        if shared.is_closed() {
            return Err(Error::Closed);
        }
        let pause = match attempt(shared, &keys, &owner_id, lease, &mut left.missed).await {
            Attempt::Won(won) => {
                // Its guard, or the give-back below, releases everywhere.
                left.disarm();
                // Won as the client closed: no guard of a closed client
                // could renew or release it.
                let token = match shared.check_open().and_then(|()| token_of(won.token)) {
                    Ok(token) => token,
                    Err(error) => {
                        give_back_later(shared, &keys, &owner_id, lease);
                        return Err(error);
                    }
                };
                telemetry.granted(token.value());
                return Ok(Some(hold(
                    shared,
                    name,
                    keys,
                    owner_id,
                    token,
                    won,
                    options,
                    lease,
                    telemetry.clone(),
                )));
            }
            // The connections are closing: not a failure of the primaries.
            Attempt::NoQuorum { .. } if shared.is_closed() => return Err(Error::Closed),
            Attempt::NoQuorum { answered, failures } => {
                return Err(Error::NoQuorum {
                    name: name.to_owned(),
                    answered,
                    primaries: shared.primaries.len(),
                    needed: shared.config.quorum(),
                    failures,
                })
            }
            Attempt::NoValidity { elapsed } => {
                return Err(Error::InvalidOptions(format!(
                    "lease {lease:?} is too short: winning a majority took {elapsed:?}, leaving no validity after the drift allowance of {:?}; ask for a longer lease",
                    shared.config.drift(lease)
                )))
            }
            _ if mode == Mode::Try => return Ok(None),
            Attempt::Held { expires_in } => {
                splits = 0;
                expires_in.unwrap_or(shared.config.max_lease) + jitter(shared.config.wake_jitter)
            }
            Attempt::Split => {
                splits = splits.saturating_add(1);
                let ceiling = shared.config.split_backoff * (1 << splits.min(6).saturating_sub(1));
                jitter(ceiling)
            }
        };
        let Some(waiting) = subscription.as_mut() else {
            // Within the wait timeout too: a slow primary can make the
            // first subscription of a channel take two call timeouts.
            let subscribed = shared.wakeups.subscribe(keys.channel());
            let subscribed = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline.into(), subscribed).await,
                None => Ok(subscribed.await),
            };
            match subscribed {
                Ok(waiting) => subscription = Some(waiting),
                Err(_) => {
                    return Err(Error::WaitTimeout {
                        name: name.to_owned(),
                        waited: began.elapsed(),
                    })
                }
            }
            continue;
        };
        let wait_over = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(wait_over);
        let timed_out = || Error::WaitTimeout {
            name: name.to_owned(),
            waited: began.elapsed(),
        };
        let woken = tokio::select! {
            () = waiting.notified() => true,
            () = tokio::time::sleep(pause) => false,
            () = &mut wait_over => return Err(timed_out()),
        };
        // A release notice: a random pause first, so the woken waiters do
        // not all reach the primaries in the same order. It ends at the
        // wait timeout and at `close()` (the loop's top then ends the call).
        if woken {
            tokio::select! {
                () = tokio::time::sleep(jitter(shared.config.wake_jitter)) => {}
                () = shared.closed() => {}
                () = &mut wait_over => return Err(timed_out()),
            }
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Err(Error::WaitTimeout {
                name: name.to_owned(),
                waited: began.elapsed(),
            });
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn hold(
    shared: &Arc<Shared>,
    name: &str,
    keys: Arc<RedLockKeys>,
    owner_id: Arc<str>,
    token: FencingToken,
    won: Won,
    options: RedLockOptions,
    lease: Duration,
    telemetry: LockTelemetry,
) -> RedLockGuard {
    let status = Arc::new(
        watch::channel(HoldStatus {
            deadline: won.deadline,
            lost: false,
            released: false,
            lost_counted: false,
        })
        .0,
    );
    let watchdog = options.lease.is_none().then(|| {
        LeaseWatchdog::spawn(
            Arc::clone(shared),
            Arc::clone(&keys),
            Arc::clone(&owner_id),
            lease,
            Arc::clone(&status),
            telemetry.clone(),
        )
    });
    RedLockGuard {
        shared: Arc::clone(shared),
        name: name.to_owned(),
        keys,
        owner_id,
        token,
        status,
        watchdog,
        released: false,
        telemetry,
        granted_at: Instant::now(),
        lease,
    }
}

/// Counts an acquire once: by [`Outcome::ended`], or as `cancelled` when
/// the acquire future is dropped first (`tokio::time::timeout`,
/// `select!`, an aborted task).
struct Outcome<'a> {
    telemetry: &'a LockTelemetry,
    started: Instant,
    counted: bool,
}

impl<'a> Outcome<'a> {
    fn new(telemetry: &'a LockTelemetry) -> Self {
        Self {
            telemetry,
            started: Instant::now(),
            counted: false,
        }
    }

    /// The acquire ended as `outcome`.
    fn ended(&mut self, outcome: &'static str) {
        if !std::mem::replace(&mut self.counted, true) {
            self.telemetry.acquire_ended(outcome, self.started);
        }
    }
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        self.ended("cancelled");
    }
}

/// A random duration in `[0, ceiling)`.
fn jitter(ceiling: Duration) -> Duration {
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    let random = uuid::Uuid::new_v4().as_u64_pair().1;
    Duration::from_nanos(random % nanos)
}
