//! Keeping a RedLock lease: renewal by majority, and the lease-lost signal.
//!
//! A grant's status is one value, [`HoldStatus`]: until when the lock is
//! safely held (by the local monotonic clock) and whether it is known lost.
//! A fixed lease never moves its deadline. A watchdog lease is renewed every
//! third of the lease by [`LeaseWatchdog`]: `redlock_renew.lua` on every
//! primary at once (it also takes the key back on a primary where it is
//! missing and free, so a holder survives the loss of a minority); when a majority confirmed in time, the deadline moves to
//! `round start + lease - elapsed - drift`, as for an acquire. When a round
//! is confirmed by fewer than a majority (primaries down, slow, or the keys
//! taken), or the deadline passed before the round began (the
//! process was paused), the lock is marked lost and the watchdog stops:
//! a later success could not prove the lock was not held by another
//! meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock_core::{RedLockKeys, RedlockRenew};
use tokio::sync::watch;

use crate::task::BackgroundTask;

use super::primaries::call;
use super::quorum::millis;
use super::shared::Shared;

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
            loop {
                tokio::select! {
                    () = stop.requested() => return,
                    () = tokio::time::sleep(interval) => {}
                }
                if status.borrow().is_lost() {
                    status.send_modify(|s| s.lost = true);
                    return;
                }
                match renew(&shared, &keys, &owner_id, lease).await {
                    Some(deadline) => status.send_modify(|s| s.deadline = deadline),
                    None => {
                        tracing::warn!(
                            lock = keys.owner(),
                            "RedLock: a renewal was not confirmed by a majority; the lease is lost"
                        );
                        status.send_modify(|s| s.lost = true);
                        return;
                    }
                }
            }
        })
    }
}

/// One renewal round; the new deadline if a majority confirmed in time.
async fn renew(
    shared: &Arc<Shared>,
    keys: &Arc<RedLockKeys>,
    owner_id: &Arc<str>,
    lease: Duration,
) -> Option<Instant> {
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
    if confirmed < shared.config.quorum() {
        return None;
    }
    let validity = lease
        .checked_sub(started.elapsed())?
        .checked_sub(shared.config.drift(lease))?;
    (!validity.is_zero()).then(|| started + validity)
}
