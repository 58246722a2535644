//! [`RedLockGuard`]: a lock held on a majority of the primaries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock_core::RedLockKeys;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::guard::FencingToken;
use crate::task::BackgroundTask;
use crate::telemetry::LockTelemetry;

use super::quorum::release_everywhere;
use super::renewal::{lost_by_now, HoldStatus};
use super::shared::Shared;

/// A RedLock held on a majority of the primaries, until released or
/// dropped (dropping releases in the background).
///
/// Its hold is sampled in `fairlock_hold_seconds` when it is released or
/// dropped (after the release round), and its lease counted once in
/// `fairlock_lease_lost_total` when first known lost: by the watchdog, or
/// by [`is_lost`](Self::is_lost), [`lost`](Self::lost), the release or
/// the drop finding the validity over.
///
/// The lock is safe to rely on only within its [`validity`](Self::validity),
/// and only if the process is not paused past it: pass
/// [`token`](Self::token) to the protected resource and have it refuse
/// older tokens.
///
/// ```no_run
/// # async fn demo(redlock: &fairlock::redlock::RedLock) -> fairlock::Result<()> {
/// let guard = redlock.lock("reports:nightly").await?;
/// let token = guard.token(); // carry it with every write
/// tokio::select! {
///     () = guard.lost() => { /* a majority renewal failed: stop writing */ }
///     () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
/// }
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
pub struct RedLockGuard {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: String,
    pub(crate) keys: Arc<RedLockKeys>,
    pub(crate) owner_id: Arc<str>,
    pub(crate) token: FencingToken,
    pub(crate) status: Arc<watch::Sender<HoldStatus>>,
    pub(crate) watchdog: Option<BackgroundTask>,
    /// Set once the release round has run (by `release`): the drop then
    /// has nothing left to do.
    pub(crate) released: bool,
    pub(crate) telemetry: LockTelemetry,
    pub(crate) granted_at: Instant,
    /// The lease the keys are given (by the grant and each renewal).
    pub(crate) lease: Duration,
}

impl std::fmt::Debug for RedLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedLockGuard")
            .field("name", &self.name)
            .field("owner_id", &self.owner_id)
            .field("token", &self.token.value())
            .field("validity", &self.validity())
            .finish()
    }
}

impl RedLockGuard {
    /// Whether the lease is lost by now, counting the loss if nobody did
    /// (not after the client was closed).
    fn lost_by_now(&self) -> bool {
        lost_by_now(&self.status, &self.telemetry, self.shared.is_closed())
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The holder's random owner id (32 hex digits), as stored on the
    /// primaries.
    pub fn owner_id(&self) -> &str {
        &self.owner_id
    }

    /// The grant's fencing token: greater than every token granted before
    /// on this lock, as long as a majority of primaries kept their counters
    /// or their clocks did not go back (see the README).
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// How much longer the lock is safely held by the local clock: the
    /// lease minus the time the grant (or last renewal) took and the drift
    /// allowance. Zero once lost or released.
    pub fn validity(&self) -> Duration {
        let status = *self.status.borrow();
        if status.lost {
            return Duration::ZERO;
        }
        status.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether the lease is known lost (a renewal not confirmed by a
    /// majority, or the validity ran out).
    pub fn is_lost(&self) -> bool {
        self.lost_by_now()
    }

    /// Resolves when the lease is lost: a watchdog renewal was not confirmed
    /// by a majority, or the validity ran out (a fixed lease always ends so).
    pub async fn lost(&self) {
        let mut status = self.status.subscribe();
        loop {
            let now = *status.borrow_and_update();
            if now.is_lost() {
                break;
            }
            tokio::select! {
                changed = status.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep_until(now.deadline.into()).await;
                        break;
                    }
                }
                () = tokio::time::sleep_until(now.deadline.into()) => {}
            }
        }
        // Counted here if nobody knew yet (a fixed lease ran out).
        self.lost_by_now();
    }

    /// Releases the lock on every primary and wakes waiters. Within the
    /// validity this succeeds even if primaries died meanwhile (their keys
    /// expire with the lease).
    ///
    /// # Errors
    ///
    /// After the validity ran out: [`Error::NotOwner`] if fewer than a
    /// majority still had this holder's key (another holder may have
    /// overlapped), [`Error::NoQuorum`] if fewer than a majority answered.
    pub async fn release(mut self) -> Result<()> {
        // Dropped before the round below has run (a caller's timeout), the
        // guard's drop sends the release again and samples the hold.
        if let Some(mut watchdog) = self.watchdog.take() {
            watchdog.shutdown().await;
        }
        // Within its validity the lock was this holder's alone (RedLock's
        // premise), whatever the primaries that died since say. A validity
        // that ran out unnoticed is a lost lease, counted now.
        let was_valid = !self.lost_by_now();
        self.status.send_modify(|s| {
            s.lost = true;
            s.released = true;
        });
        let (answered, deleted, failures) = release_everywhere(
            &self.shared,
            &self.keys,
            &self.owner_id,
            true,
            Some(self.lease),
        )
        .await;
        self.released = true;
        self.telemetry.held_for(self.granted_at);
        let quorum = self.shared.config.quorum();
        if was_valid || deleted >= quorum {
            Ok(())
        } else if answered >= quorum {
            Err(Error::NotOwner {
                name: self.name.clone(),
            })
        } else {
            Err(Error::NoQuorum {
                name: self.name.clone(),
                answered,
                primaries: self.shared.primaries.len(),
                needed: quorum,
                failures,
            })
        }
    }
}

impl Drop for RedLockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Dropping the watchdog asks it to stop.
        let watchdog = self.watchdog.take();
        self.lost_by_now();
        self.status.send_modify(|s| {
            s.lost = true;
            s.released = true;
        });
        let telemetry = std::mem::take(&mut self.telemetry);
        let granted_at = self.granted_at;
        let lease = self.lease;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No release without a runtime (the keys expire with the
            // lease); the hold ends here all the same.
            telemetry.held_for(granted_at);
            return;
        };
        let shared = Arc::clone(&self.shared);
        let keys = Arc::clone(&self.keys);
        let owner_id = Arc::clone(&self.owner_id);
        runtime.spawn(async move {
            // As release() does: the watchdog first, so a renewal round in
            // flight cannot reach a primary after the release there and
            // take the freed key back for a whole lease.
            if let Some(mut watchdog) = watchdog {
                watchdog.shutdown().await;
            }
            release_everywhere(&shared, &keys, &owner_id, true, Some(lease)).await;
            telemetry.held_for(granted_at);
        });
    }
}
