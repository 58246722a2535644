//! The permit guard: proof of one permit of a [`crate::Semaphore`] or of a
//! read or write hold on a [`crate::RwLock`], with its fencing token and its
//! lease-lost signal. Its lease is its own: the watchdog renews it (or it
//! is fixed), and a holder that dies gives its permit back when its lease
//! runs out.

use std::fmt;
use std::sync::Arc;

use fairlock_core::{PermitRenewBatch, PermitRenewItem, RenewStatus};

use crate::error::{Error, Result};
use crate::guard::FencingToken;
use crate::held::HeldLock;
use crate::state::ClientState;

/// Holds one permit until released or dropped.
///
/// Prefer [`Permit::release`], which reports whether the lease was still
/// held. Dropping the permit releases it in the background (the next
/// waiters that fit are granted either way).
///
/// ```no_run
/// # async fn demo(client: fairlock::LockClient) -> fairlock::Result<()> {
/// let api_calls = client.semaphore("partner-api", 4)?;
/// let permit = api_calls.acquire().await?;
/// tokio::select! {
///     _ = async { /* call the rate-limited API, passing permit.token() */ } => {}
///     _ = permit.lost() => { /* the lease ran out: stop */ }
/// }
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "the permit is released as soon as it is dropped"]
pub struct Permit {
    state: Arc<ClientState>,
    held: Arc<HeldLock>,
    released: bool,
}

impl Permit {
    pub(crate) fn new(state: Arc<ClientState>, held: Arc<HeldLock>) -> Self {
        Self {
            state,
            held,
            released: false,
        }
    }

    /// The name of the semaphore or read-write lock.
    pub fn name(&self) -> &str {
        self.held.name.as_str()
    }

    /// The fencing token of this grant: strictly greater for every later
    /// grant of the same semaphore or read-write lock (so a write hold's
    /// token is greater than every read hold's granted before it).
    pub fn token(&self) -> FencingToken {
        FencingToken::of_owner_id(self.held.token, &self.held.owner_id)
    }

    /// The queue ticket this permit waited with, or `None` if it was
    /// granted at once. Grants follow ticket order; a waiter whose entry
    /// was lost queues again with the same ticket, in its old place.
    pub fn ticket(&self) -> Option<u64> {
        self.held.ticket
    }

    /// This holder's owner id, its identity as stored in Redis:
    /// `<nonce>.<client tag>.<lease ms>.<permits>`.
    pub fn owner_id(&self) -> &str {
        &self.held.owner_id
    }

    /// Whether the lease is known to be lost: the watchdog found the permit
    /// gone (checked every heartbeat interval), a release was refused, or
    /// the lease ran out by the local clock without a renewal. Also true
    /// once `release_all` gave the permit back.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Resolves when the lease is known to be lost (see [`Permit::is_lost`]).
    pub async fn lost(&self) {
        self.held.lost().await
    }

    /// Asks Redis whether this permit's lease is still running.
    pub async fn is_held(&self) -> Result<bool> {
        let batch = PermitRenewBatch {
            items: vec![PermitRenewItem {
                keys: &self.held.keys,
                owner_id: &self.held.owner_id,
                lease_ms: 0,
                token: None,
            }],
        };
        match self.state.renew_permits(&batch).await?.first() {
            Some(RenewStatus::Held) => Ok(true),
            Some(RenewStatus::WrongType) => Err(Error::WrongType(format!(
                "WRONGTYPE fairlock key {} holds a value of another type",
                self.held.keys.owner()
            ))),
            _ => Ok(false),
        }
    }

    /// Gives the permit back; the waiters at the head of the queue that now
    /// fit are granted in the same script.
    ///
    /// Fails with [`Error::NotOwner`] if the lease had already run out: the
    /// work may then have overlapped a holder beyond the limit. A release
    /// sent again after its reply was lost with its connection answers
    /// `Ok`: the set remembers it for four command timeouts.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        // Boxed: a task's future is as large as its largest await, and
        // most tasks that wait in lock() await this after it.
        Box::pin(self.state.release(&self.held)).await
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("name", &self.held.name)
            .field("token", &self.held.token)
            .field("owner_id", &self.held.owner_id)
            .finish()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.released || self.held.is_released() {
            return;
        }
        let state = Arc::clone(&self.state);
        let held = Arc::clone(&self.held);
        // A counted cleanup: `shutdown()` waits for it.
        drop(self.state.spawn_cleanup(async move {
            if let Err(error) = state.release(&held).await {
                tracing::warn!(set = %held.name, %error, "fairlock permit release on drop failed");
            }
        }));
    }
}
