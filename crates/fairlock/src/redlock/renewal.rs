//! Keeping a RedLock lease: renewal by majority, and the lease-lost signal.
//!
//! A grant's status is one value, [`HoldStatus`]: until when the lock is
//! safely held (by the local monotonic clock) and whether it is known lost.
//! A fixed lease never moves its deadline. A watchdog lease is renewed every
//! third of the lease by [`LeaseWatchdog`]: `redlock_renew.lua` on every
//! primary at once (it also takes the key back on a primary where it is
//! missing and free, so a holder survives the loss of a minority); when a majority confirmed in time, the deadline moves to
//! `round start + lease - elapsed - drift`, as for an acquire. A round
//! confirmed by fewer than a majority (primaries down or slow) is tried
//! again every [`RETRY_PAUSE`] while the validity lasts: until it ends
//! nobody else can hold a majority, so a retry is as safe as the round.
//! Once the deadline has passed without a confirmed round (or passed
//! before a round began: the process was paused), the lock is marked lost
//! and the watchdog stops: a later success could not prove the lock was
//! not held by another meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock_core::{RedLockKeys, RedlockRenew};
use tokio::sync::watch;

use crate::task::BackgroundTask;

use super::primaries::call;
use super::quorum::millis;
use super::shared::Shared;

/// How soon an unconfirmed renewal round is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Whether and until when a grant is held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HoldStatus {
    /// The end of the validity, by the local monotonic clock.
    pub(crate) deadline: Instant,
    /// Known lost (a failed renewal, or released).
    pub(crate) lost: bool,
}

impl HoldStatus {
    pub(crate) fn is_lost(&self) -> bool {
        self.lost || Instant::now() >= self.deadline
    }
}

/// The renewal loop of one watchdog-kept grant.
pub(crate) struct LeaseWatchdog;

impl LeaseWatchdog {
    /// Starts renewing `owner_id`'s hold of `keys` every third of `lease`.
    pub(crate) fn spawn(
        shared: Arc<Shared>,
        keys: Arc<RedLockKeys>,
        owner_id: Arc<str>,
        lease: Duration,
        status: Arc<watch::Sender<HoldStatus>>,
    ) -> BackgroundTask {
        BackgroundTask::spawn("redlock watchdog", move |mut stop| async move {
            let interval = lease / 3;
            let mut wait = interval;
            loop {
                tokio::select! {
                    () = stop.requested() => return,
                    () = tokio::time::sleep(wait) => {}
                }
                if status.borrow().is_lost() {
                    if wait != interval {
                        tracing::warn!(
                            lock = keys.owner(),
                            "RedLock: no renewal was confirmed by a majority before the validity ended; the lease is lost"
                        );
                    }
                    status.send_modify(|s| s.lost = true);
                    return;
                }
                match renew(&shared, &keys, &owner_id, lease).await {
                    Round::Confirmed(deadline) => {
                        status.send_modify(|s| s.deadline = deadline);
                        wait = interval;
                    }
                    Round::Unanswered => {
                        tracing::warn!(
                            lock = keys.owner(),
                            "RedLock: a renewal was not confirmed by a majority; trying again while the lease is valid"
                        );
                        wait = RETRY_PAUSE.min(interval);
                    }
                    Round::Refused => {
                        tracing::warn!(
                            lock = keys.owner(),
                            "RedLock: a majority of primaries no longer has this grant; the lease is lost"
                        );
                        status.send_modify(|s| s.lost = true);
                        return;
                    }
                }
            }
        })
    }
}

/// What one renewal round found.
enum Round {
    /// A majority confirmed in time: the new deadline.
    Confirmed(Instant),
    /// Too few confirmed, but primaries that did not answer (down, slow)
    /// could still make a majority: worth trying again.
    Unanswered,
    /// Too many primaries answered that the key is another's (or the round
    /// took the whole validity): no retry can make a majority.
    Refused,
}

/// One renewal round.
async fn renew(
    shared: &Arc<Shared>,
    keys: &Arc<RedLockKeys>,
    owner_id: &Arc<str>,
    lease: Duration,
) -> Round {
    let started = Instant::now();
    let lease_ms = millis(lease);
    let answers = shared
        .primaries
        .on_all(|primary| {
            let keys = Arc::clone(keys);
            let owner_id = Arc::clone(owner_id);
            async move {
                let renew = RedlockRenew {
                    owner_id: &owner_id,
                    lease_ms,
                };
                call(&primary, &[keys.owner()], &renew).await
            }
        })
        .await;
    let confirmed = answers
        .iter()
        .filter(|(_, answer)| matches!(answer, Ok(true)))
        .count();
    let refused = answers
        .iter()
        .filter(|(_, answer)| matches!(answer, Ok(false)))
        .count();
    let quorum = shared.config.quorum();
    if confirmed < quorum {
        return if shared.primaries.len() - refused < quorum {
            Round::Refused
        } else {
            Round::Unanswered
        };
    }
    let validity = lease
        .checked_sub(started.elapsed())
        .and_then(|left| left.checked_sub(shared.config.drift(lease)))
        .filter(|validity| !validity.is_zero());
    match validity {
        Some(validity) => Round::Confirmed(started + validity),
        None => Round::Refused,
    }
}
