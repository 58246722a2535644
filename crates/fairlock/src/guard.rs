//! The lock guard: proof of a grant, its fencing token, and the way to
//! release, extend or watch the lease.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fairlock_core::{LockName, OwnerId, RenewBatch, RenewItem, RenewStatus};

use crate::config::{millis, LockOptions};
use crate::error::{Error, Result};
use crate::held::OwnerShared;
use crate::held::{HeldLock, LeaseCall};
use crate::state::ClientState;

/// A fencing token: strictly increasing per lock name across all grants,
/// together with the identity of the holder it was granted to.
///
/// Hand it to the resource the lock protects and have the resource refuse
/// any write carrying a token older than the newest it has seen, or the
/// same token from another holder (see [`crate::LockClient::fenced_write`]):
/// a holder that was paused past its lease then cannot overwrite a newer
/// holder's work. Tokens compare by [`FencingToken::value`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken {
    value: u64,
    holder: u128,
}

impl FencingToken {
    /// The largest token value: 2^53. The scripts compare tokens as Lua
    /// numbers (doubles), exact up to here. No grant issues a larger one:
    /// tokens follow the server clock in microseconds, which reaches 2^53
    /// in the year 2255.
    pub const MAX_VALUE: u64 = 1 << 53;

    /// A token as received from another process: its value and the
    /// holder's owner id ([`LockGuard::owner_id`]) or just its nonce, the
    /// owner id's first 32 hex digits. `None` if the nonce is not 32 hex
    /// digits, or if the value is above [`FencingToken::MAX_VALUE`].
    ///
    /// ```
    /// use fairlock::FencingToken;
    /// let nonce = "0123456789abcdef0123456789abcdef";
    /// assert!(FencingToken::new(1_795_679_235_391_390, nonce).is_some());
    /// assert!(FencingToken::new(FencingToken::MAX_VALUE + 1, nonce).is_none());
    /// assert!(FencingToken::new(1, "not a nonce").is_none());
    /// ```
    pub fn new(value: u64, owner_id: &str) -> Option<Self> {
        let nonce = OwnerId::nonce_of(owner_id).unwrap_or(owner_id);
        if nonce.len() != 32 || value > Self::MAX_VALUE {
            return None;
        }
        let holder = u128::from_str_radix(nonce, 16).ok()?;
        Some(Self { value, holder })
    }

    /// The token of a grant to `owner_id` (one of this client's), whose
    /// nonce is always 32 hex digits; holder 0 if it were not.
    pub(crate) fn of_owner_id(value: u64, owner_id: &str) -> Self {
        Self::new(value, owner_id).unwrap_or(Self { value, holder: 0 })
    }

    /// The number: strictly greater for every later grant of the lock.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// The holder's nonce (the first part of its owner id), 32 hex digits.
    pub fn holder(&self) -> String {
        format!("{:032x}", self.holder)
    }
}

impl PartialOrd for FencingToken {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FencingToken {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.value, self.holder).cmp(&(other.value, other.holder))
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
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
    state: Arc<ClientState>,
    pub(crate) held: Arc<HeldLock>,
    owner: Option<Arc<OwnerShared>>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(state: Arc<ClientState>, held: Arc<HeldLock>) -> Self {
        Self {
            state,
            held,
            owner: None,
            released: false,
        }
    }

    pub(crate) fn with_owner(mut self, owner: Arc<OwnerShared>) -> Self {
        self.owner = Some(owner);
        self
    }

    /// The lock's name as text (for a name that is not UTF-8, a lossy
    /// rendering; see [`LockGuard::lock_name`]).
    pub fn name(&self) -> &str {
        self.held.name.as_str()
    }

    /// The lock's name, exact bytes included.
    pub fn lock_name(&self) -> &LockName {
        &self.held.name
    }

    /// The fencing token of this grant; re-entry keeps it.
    pub fn token(&self) -> FencingToken {
        FencingToken::new(self.held.token, &self.held.owner_id).unwrap_or(FencingToken {
            value: self.held.token,
            holder: 0,
        })
    }

    /// The queue ticket this grant waited with, or `None` if the lock was
    /// free and granted at once. Among the waiters of one lock, grants
    /// follow ticket order. A waiter whose entry was lost (taken for dead
    /// after no heartbeat for the waiter timeout, or a fail-over) queues
    /// again with the same ticket, in its old place; if it then finds the
    /// lock free, it is granted at once and still shows that ticket.
    pub fn ticket(&self) -> Option<u64> {
        self.held.ticket
    }

    /// This holder's owner id, its identity as stored in Redis:
    /// `<nonce>.<client tag>.<lease ms>`, a random 128-bit nonce, the
    /// client's routing tag and the lease it asked for.
    pub fn owner_id(&self) -> &str {
        &self.held.owner_id
    }

    /// Whether the lease is known to be lost: the watchdog found the lock
    /// gone or taken (checked every heartbeat interval, for fixed and
    /// watchdog leases alike), an administrator force-released it, a
    /// release or extend was refused, or the lease ran out by the local
    /// clock without a renewal. Also true once
    /// [`LockClient::release_all`](crate::LockClient::release_all) gave the
    /// lock back: the guard protects nothing any more.
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
        self.held.lost().await
    }

    /// Asks Redis whether this guard still owns the lock.
    pub async fn is_held(&self) -> Result<bool> {
        self.state.owns(&self.held).await
    }

    /// Sets the lease to `lease` from now. For a watchdog-kept lock the
    /// watchdog keeps renewing afterwards: a lease longer than the
    /// watchdog's is renewed at its own length, a shorter one is renewed
    /// (to the watchdog lease) once a third of it has passed, at the
    /// watchdog's next round (one per heartbeat interval), so a lease
    /// shorter than about two intervals can run out first. For a fixed
    /// lease this is the new lease. Fails with [`Error::NotOwner`] (and
    /// fires the lost signal) if the lock is no longer held.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        LockOptions::new().lease(lease).validate()?;
        let batch = RenewBatch {
            items: vec![RenewItem {
                owner_key: self.held.keys.owner(),
                owner_id: &self.held.owner_id,
                lease_ms: millis(lease),
                token: None,
            }],
        };
        // Failed or dropped before its answer, it may have set the lease.
        let call = LeaseCall::start(&self.held, lease);
        let status = self.state.renew(&batch).await?.first().copied();
        if let Some(RenewStatus::Held) = status {
            call.set();
            return Ok(());
        }
        call.refused();
        match status {
            Some(RenewStatus::WrongType) => Err(Error::WrongType(format!(
                "WRONGTYPE fairlock key {} holds a value of another type",
                self.held.keys.owner()
            ))),
            _ => {
                self.held.mark_lost("extend found the lock no longer held");
                Err(Error::NotOwner {
                    name: self.held.name.to_string(),
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
            // An inner hold: the lock stays with the outer ones, but the
            // caller learns, as the last release would tell it, that the
            // lease ran out under it.
            if self.held.is_lost() && !self.held.is_released() {
                return Err(Error::NotOwner {
                    name: self.held.name.to_string(),
                });
            }
            return Ok(());
        }
        // Boxed: a task's future is as large as its largest await, and
        // most tasks that wait in lock() await this after it.
        Box::pin(self.state.release(&self.held)).await
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
            .field("owner_id", &self.held.owner_id)
            .finish()
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released || !self.last_hold() || self.held.is_released() {
            return;
        }
        let state = Arc::clone(&self.state);
        let held = Arc::clone(&self.held);
        // A counted cleanup: `shutdown()` waits for it.
        drop(self.state.spawn_cleanup(async move {
            if let Err(error) = state.release(&held).await {
                tracing::warn!(lock = %held.name, %error, "fairlock release on drop failed");
            }
        }));
    }
}
