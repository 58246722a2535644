//! The lock guard: proof of a grant, its fencing token, and the way to
//! release, extend or watch the lease.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock_core::{LockKeys, Renew, RenewReply};
use tokio::sync::watch;

use crate::client::LockClient;
use crate::config::{millis, Lease, LockOptions};
use crate::error::{Error, Result};
use crate::owner::OwnerShared;
use crate::telemetry::LockTelemetry;

/// A fencing token: strictly increasing per lock name across all grants.
///
/// Hand it to the resource the lock protects and have the resource refuse
/// any write carrying a token older than the newest it has seen (see
/// [`LockClient::fenced_write`]): a holder that was paused past its lease
/// then cannot overwrite a newer holder's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One grant, shared by its guards (several, when re-entered), the client's
/// held-lock list and, for watchdog leases, the watchdog.
pub(crate) struct HeldLock {
    pub(crate) name: String,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) member: String,
    pub(crate) token: u64,
    /// The queue ticket, if the grant came after waiting in the queue.
    pub(crate) ticket: Option<u64>,
    pub(crate) lease: Lease,
    pub(crate) granted_at: Instant,
    /// Watchdog: the start of the last successful renewal. Fixed lease:
    /// the start of the call that set the lease. Either way the lease is
    /// counted from before Redis set it, so local expiry is conservative.
    lease_from: Mutex<Instant>,
    /// The current fixed lease (changed by `extend`).
    fixed_lease: Mutex<Duration>,
    lost: watch::Sender<bool>,
    released: AtomicBool,
    pub(crate) telemetry: LockTelemetry,
}

/// What a script's grant told us.
pub(crate) struct Grant {
    pub(crate) token: u64,
    pub(crate) ticket: Option<u64>,
    pub(crate) lease: Lease,
    /// When the granting call was sent: the lease is counted from then.
    pub(crate) requested_at: Instant,
}

impl HeldLock {
    pub(crate) fn new(
        name: String,
        keys: Arc<LockKeys>,
        member: String,
        grant: Grant,
        telemetry: LockTelemetry,
    ) -> Self {
        let Grant {
            token,
            ticket,
            lease,
            requested_at,
        } = grant;
        let fixed = match lease {
            Lease::Fixed(lease) => lease,
            Lease::Watchdog => Duration::MAX,
        };
        Self {
            name,
            keys,
            member,
            token,
            ticket,
            lease,
            granted_at: Instant::now(),
            lease_from: Mutex::new(requested_at),
            fixed_lease: Mutex::new(fixed),
            lost: watch::Sender::new(false),
            released: AtomicBool::new(false),
            telemetry,
        }
    }

    /// A renewal or extend that started at `at` succeeded.
    pub(crate) fn renewed_at(&self, at: Instant) {
        let mut from = self.lease_from.lock().unwrap_or_else(|p| p.into_inner());
        *from = (*from).max(at);
    }

    pub(crate) fn renewal_overdue(&self, lease: Duration) -> bool {
        let from = *self.lease_from.lock().unwrap_or_else(|p| p.into_inner());
        from.elapsed() >= lease
    }

    /// When a fixed lease runs out, by the local monotonic clock.
    fn fixed_deadline(&self) -> Option<Instant> {
        if self.lease == Lease::Watchdog {
            return None;
        }
        let from = *self.lease_from.lock().unwrap_or_else(|p| p.into_inner());
        let lease = *self.fixed_lease.lock().unwrap_or_else(|p| p.into_inner());
        from.checked_add(lease)
    }

    fn set_fixed_lease(&self, lease: Duration, from: Instant) {
        *self.fixed_lease.lock().unwrap_or_else(|p| p.into_inner()) = lease;
        *self.lease_from.lock().unwrap_or_else(|p| p.into_inner()) = from;
    }

    /// Fires the lease-lost signal (once).
    pub(crate) fn mark_lost(&self, why: &str) {
        if !self.lost.send_replace(true) {
            self.telemetry.lease_lost();
            tracing::warn!(lock = %self.name, token = self.token, why, "fairlock lease lost");
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        if *self.lost.borrow() {
            return true;
        }
        if self
            .fixed_deadline()
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            self.mark_lost("the fixed lease ran out");
            return true;
        }
        false
    }

    pub(crate) fn set_released(&self) -> bool {
        !self.released.swap(true, Ordering::SeqCst)
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }
}

/// Holds a lock until released or dropped.
///
/// Prefer [`LockGuard::release`], which reports whether the lease was still
/// held. Dropping the guard releases in the background (the lock is handed
/// to the next waiter either way). A guard from a [`crate::LockOwner`] that
/// re-entered the lock only gives back its own hold; the last hold frees
/// the lock.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    pub(crate) client: LockClient,
    pub(crate) held: Arc<HeldLock>,
    owner: Option<Arc<OwnerShared>>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(client: LockClient, held: Arc<HeldLock>) -> Self {
        Self {
            client,
            held,
            owner: None,
            released: false,
        }
    }

    pub(crate) fn with_owner(mut self, owner: Arc<OwnerShared>) -> Self {
        self.owner = Some(owner);
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.held.name
    }

    /// The fencing token of this grant; re-entry keeps it.
    pub fn token(&self) -> FencingToken {
        FencingToken(self.held.token)
    }

    /// The queue ticket this grant waited with, or `None` if the lock was
    /// free and granted at once. Among the waiters of one lock, grants
    /// follow ticket order.
    pub fn ticket(&self) -> Option<u64> {
        self.held.ticket
    }

    /// This holder's owner id as stored in Redis (random, 128-bit, plus the
    /// client's routing tag).
    pub fn owner_id(&self) -> &str {
        &self.held.member
    }

    /// Whether the lease is known to be lost: the watchdog found the lock
    /// gone or taken, no renewal succeeded for a whole lease, a release or
    /// extend was refused, or a fixed lease ran out by the local clock.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Resolves when the lease is known to be lost (see
    /// [`LockGuard::is_lost`]). Select on it to abandon work that the lock
    /// no longer protects:
    ///
    /// ```no_run
    /// # async fn work() {}
    /// # async fn demo(guard: fairlock::LockGuard) {
    /// tokio::select! {
    ///     _ = work() => { /* done under the lock */ }
    ///     _ = guard.lost() => { /* stop: another holder may be running */ }
    /// }
    /// # }
    /// ```
    pub async fn lost(&self) {
        let mut rx = self.held.lost.subscribe();
        loop {
            let deadline = self.held.fixed_deadline();
            let expiry = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // The sender lives in `held`, which outlives this borrow.
                _ = rx.wait_for(|lost| *lost) => return,
                _ = expiry => {
                    // An extend may have moved the deadline meanwhile.
                    if self.held.is_lost() {
                        return;
                    }
                }
            }
        }
    }

    /// Asks Redis whether this guard still owns the lock.
    pub async fn is_held(&self) -> Result<bool> {
        self.client.core().owns(&self.held).await
    }

    /// Sets the lease to `lease` from now. For a watchdog-kept lock the
    /// watchdog keeps renewing afterwards; for a fixed lease this is the
    /// new lease. Fails with [`Error::NotOwner`] (and fires the lost
    /// signal) if the lock is no longer held.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        LockOptions::new().lease(lease).validate()?;
        let sent_at = Instant::now();
        let call = Renew {
            member: &self.held.member,
            lease_ms: millis(lease),
        };
        match self.client.core().run(&self.held.keys, &call).await? {
            RenewReply::Renewed { .. } => {
                match self.held.lease {
                    Lease::Fixed(_) => self.held.set_fixed_lease(lease, sent_at),
                    Lease::Watchdog => self.held.renewed_at(sent_at),
                }
                Ok(())
            }
            RenewReply::NotOwner => {
                self.held.mark_lost("extend found the lock no longer held");
                Err(Error::NotOwner {
                    name: self.held.name.clone(),
                })
            }
        }
    }

    /// Releases the lock, handing it to the next waiter. For a re-entered
    /// lock, gives back this guard's hold only; the last one releases.
    ///
    /// Fails with [`Error::NotOwner`] if the lease had already run out (or
    /// the lock was force-released): the critical section may then have
    /// overlapped another holder.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        if !self.last_hold() {
            return Ok(());
        }
        self.client.core().release(&self.held).await
    }

    /// Gives back this guard's hold on a re-entered lock; `true` if it was
    /// the last one (or the guard was not re-entrant).
    fn last_hold(&self) -> bool {
        match &self.owner {
            Some(owner) => owner.give_back(&self.held),
            None => true,
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.held.name)
            .field("token", &self.held.token)
            .field("owner_id", &self.held.member)
            .finish()
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released || !self.last_hold() || self.held.is_released() {
            return;
        }
        let client = self.client.clone();
        let held = Arc::clone(&self.held);
        client.clone().spawn(async move {
            if let Err(error) = client.core().release(&held).await {
                tracing::warn!(lock = %held.name, %error, "fairlock release on drop failed");
            }
        });
    }
}
