//! The lock guard: proof of a grant, its fencing token, and the way to
//! release, extend or watch the lease.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock_core::LockKeys;
use fairlock_metrics as names;
use tokio::sync::watch;

use crate::client::LockClient;
use crate::config::Lease;
use crate::error::Result;

/// A fencing token: strictly increasing per lock name across all grants.
///
/// Hand it to the resource the lock protects and have the resource refuse
/// any write carrying a token older than the newest it has seen: a holder
/// that was paused past its lease then cannot overwrite a newer holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One grant, shared by its guard and the watchdog.
pub(crate) struct HeldLock {
    pub(crate) name: String,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) member: String,
    pub(crate) token: u64,
    /// The queue ticket, if the grant came after waiting in the queue.
    pub(crate) ticket: Option<u64>,
    pub(crate) lease: Lease,
    pub(crate) granted_at: Instant,
    last_renewed: Mutex<Instant>,
    lost: watch::Sender<bool>,
    released: AtomicBool,
}

impl HeldLock {
    /// `requested_at` is when the granting call was sent: the lease is
    /// counted from then, conservatively.
    pub(crate) fn new(
        name: String,
        keys: Arc<LockKeys>,
        member: String,
        token: u64,
        ticket: Option<u64>,
        lease: Lease,
        requested_at: Instant,
    ) -> Self {
        Self {
            name,
            keys,
            member,
            token,
            ticket,
            lease,
            granted_at: Instant::now(),
            last_renewed: Mutex::new(requested_at),
            lost: watch::Sender::new(false),
            released: AtomicBool::new(false),
        }
    }

    pub(crate) fn set_released(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    pub(crate) fn renewed_at(&self, at: Instant) {
        let mut last = self.last_renewed.lock().unwrap_or_else(|p| p.into_inner());
        *last = (*last).max(at);
    }

    pub(crate) fn renewal_overdue(&self, lease: Duration) -> bool {
        let last = *self.last_renewed.lock().unwrap_or_else(|p| p.into_inner());
        last.elapsed() >= lease
    }

    /// Fires the lease-lost signal (once).
    pub(crate) fn mark_lost(&self, why: &str) {
        if !self.lost.send_replace(true) {
            metrics::counter!(names::LEASE_LOST_TOTAL).increment(1);
            tracing::warn!(lock = %self.name, token = self.token, why, "fairlock lease lost");
        }
    }
}

/// Holds a lock until released or dropped.
///
/// Prefer [`LockGuard::release`], which reports whether the lease was still
/// held. Dropping the guard releases in the background (the lock is handed
/// to the next waiter either way).
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    pub(crate) client: LockClient,
    pub(crate) held: Arc<HeldLock>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(client: LockClient, held: Arc<HeldLock>) -> Self {
        Self {
            client,
            held,
            released: false,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.held.name
    }

    /// The fencing token of this grant.
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

    /// Whether the lease-lost signal has fired.
    pub fn is_lost(&self) -> bool {
        *self.held.lost.borrow()
    }

    /// Resolves when the lease is known to be lost: the watchdog found the
    /// lock gone or taken, or could not renew it for a whole lease. Select
    /// on it to abandon work that is no longer protected.
    pub async fn lost(&self) {
        let mut rx = self.held.lost.subscribe();
        // The sender lives in `held`, which outlives this borrow.
        let _ = rx.wait_for(|lost| *lost).await;
    }

    /// Asks Redis whether this guard still owns the lock.
    pub async fn is_held(&self) -> Result<bool> {
        self.client.core().owns(&self.held).await
    }

    /// Releases the lock, handing it to the next waiter.
    ///
    /// Fails with [`crate::Error::NotOwner`] if the lease had already run
    /// out (or the lock was force-released): the critical section may then
    /// have overlapped another holder.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.client.core().release(&self.held).await
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
        if self.released {
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
