//! Reentrancy for async code.
//!
//! Async tasks have no thread identity, so a lock is re-entered through an
//! explicit owner handle, [`LockOwner`]: a lock taken through a handle can be
//! taken again through the same handle (or a clone of it, in any task)
//! without waiting, keeping its fencing token. The handle counts the holds;
//! releasing a guard gives back one hold, and the last one releases the
//! lock in Redis. Redis sees one owner and one grant, so re-entry costs no
//! round trip.

use std::sync::Arc;
use std::time::Instant;

use fairlock_core::LockName;

use crate::acquire::{acquire, waited_grant, Mode};
use crate::client::LockClient;
use crate::config::LockOptions;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::held::{HeldLock, OwnerShared, Reentry};
use crate::state::ClientState;

/// An explicit lock owner for re-entrant locking; see the module docs.
///
/// ```no_run
/// # async fn demo(client: fairlock::LockClient) -> fairlock::Result<()> {
/// let owner = client.owner();
/// let outer = owner.lock("account:7").await?;
/// let inner = owner.lock("account:7").await?; // no wait: same owner
/// assert_eq!(outer.token(), inner.token());
/// inner.release().await?; // still held
/// outer.release().await?; // now released
/// # Ok(())
/// # }
/// ```
///
/// The owner keeps its client working, as a [`crate::Lock`] handle does:
/// its waiters are still granted after every [`LockClient`] clone is
/// dropped.
#[derive(Clone)]
pub struct LockOwner {
    client: LockClient,
    shared: Arc<OwnerShared>,
}

impl LockClient {
    /// An owner handle for re-entrant locking (see [`LockOwner`]).
    pub fn owner(&self) -> LockOwner {
        LockOwner {
            client: self.clone(),
            shared: Arc::default(),
        }
    }
}

impl LockOwner {
    fn state(&self) -> &Arc<ClientState> {
        self.client.state()
    }

    /// Like [`crate::LockClient::lock`], but re-enters a lock this owner holds.
    pub async fn lock(&self, name: impl AsRef<[u8]>) -> Result<LockGuard> {
        self.lock_with(name, LockOptions::default()).await
    }

    /// Like [`crate::LockClient::lock_with`], but re-enters a lock this
    /// owner holds (the options then do not apply: the first hold's lease
    /// rules).
    pub async fn lock_with(
        &self,
        name: impl AsRef<[u8]>,
        options: LockOptions,
    ) -> Result<LockGuard> {
        waited_grant(self.take(name, options, Mode::Wait).await?)
    }

    /// Like [`crate::LockClient::try_lock`], but re-enters a lock this
    /// owner holds.
    pub async fn try_lock(&self, name: impl AsRef<[u8]>) -> Result<Option<LockGuard>> {
        self.take(name, LockOptions::default(), Mode::Try).await
    }

    /// How many holds this owner has on lock `name` (0 if none, or if
    /// `name` is not a valid lock name).
    pub fn hold_count(&self, name: impl AsRef<[u8]>) -> usize {
        let Ok(name) = LockName::new(name) else {
            return 0;
        };
        self.shared
            .holds()
            .get(&name)
            .map_or(0, |(_, count)| *count)
    }

    /// How many lock names this owner is acquiring right now (its
    /// bookkeeping shrinks back to zero when nothing is being acquired).
    pub fn acquiring(&self) -> usize {
        self.shared.gates()
    }

    async fn take(
        &self,
        name: impl AsRef<[u8]>,
        options: LockOptions,
        mode: Mode,
    ) -> Result<Option<LockGuard>> {
        let name = LockName::new(name)?;
        options.validate()?;
        // Re-entering a held lock needs no gate (a sibling holding it for
        // a moment would make a try answer `None`); acquiring anew does.
        if let Some(guard) = self.reentered(&name).await {
            return Ok(Some(guard));
        }
        let started = Instant::now();
        let gate = GateUse::new(&self.shared, &name);
        // A try does not wait for the gate, and a bounded wait waits for it
        // within its wait timeout only: a sibling task of this owner may
        // be waiting for the same name for a long time.
        let _one_at_a_time = match (mode, options.wait_timeout) {
            (Mode::Try, _) => match gate.try_lock() {
                Some(gate) => gate,
                None => return Ok(None),
            },
            (Mode::Wait, Some(limit)) => match tokio::time::timeout(limit, gate.lock()).await {
                Ok(gate) => gate,
                Err(_) => {
                    return Err(Error::WaitTimeout {
                        name: name.to_string(),
                        waited: started.elapsed(),
                    })
                }
            },
            (Mode::Wait, None) => gate.lock().await,
        };
        let options = match options.wait_timeout {
            Some(limit) => options.wait_timeout(limit.saturating_sub(started.elapsed())),
            None => options,
        };
        self.take_gated(&name, options, mode).await
    }

    /// Another hold on lock `name` if this owner holds it. A hold whose
    /// lease is lost is given back first (its guards' releases then answer
    /// `NotOwner`): Redis may still hold its grant for the rest of its
    /// lease, and the acquire that follows would queue behind it.
    async fn reentered(&self, name: &LockName) -> Option<LockGuard> {
        match self.shared.reenter(name) {
            Reentry::Held(held) => Some(
                LockGuard::new(Arc::clone(self.state()), held).with_owner(Arc::clone(&self.shared)),
            ),
            Reentry::Lost(lost) => {
                self.give_back_lost(&lost).await;
                None
            }
            Reentry::NotHeld => None,
        }
    }

    /// Gives back a grant whose lease is lost: freed in Redis if it still
    /// holds it (its next waiter gets it), nothing otherwise. A failure is
    /// retried by the heartbeat (`ClientState::give_back`).
    async fn give_back_lost(&self, lost: &Arc<HeldLock>) {
        match self.state().give_back(lost).await {
            Ok(()) | Err(Error::NotOwner { .. }) => {}
            Err(error) => {
                tracing::debug!(lock = %lost.name, %error, "fairlock could not give back a lost hold before taking the lock anew");
            }
        }
    }

    async fn take_gated(
        &self,
        name: &LockName,
        options: LockOptions,
        mode: Mode,
    ) -> Result<Option<LockGuard>> {
        // A sibling may have taken the lock while this call waited for the
        // gate.
        if let Some(guard) = self.reentered(name).await {
            return Ok(Some(guard));
        }
        let Some(held) = acquire(self.state(), name, options, mode).await? else {
            return Ok(None);
        };
        self.shared
            .holds()
            .insert(name.clone(), (Arc::clone(&held), 1));
        Ok(Some(
            LockGuard::new(Arc::clone(self.state()), held).with_owner(Arc::clone(&self.shared)),
        ))
    }
}

/// This handle's gate for one name, in use by one acquire: forgotten when
/// the acquire ends, also when its future is dropped midway (a caller's
/// timeout), so the handle's bookkeeping shrinks back to zero.
struct GateUse<'a> {
    shared: &'a OwnerShared,
    name: &'a LockName,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl<'a> GateUse<'a> {
    fn new(shared: &'a OwnerShared, name: &'a LockName) -> Self {
        Self {
            shared,
            name,
            gate: shared.gate(name),
        }
    }

    /// Waits for the acquisitions of this name through the handle that
    /// came first.
    async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.gate.lock().await
    }

    /// The gate if no other acquisition of this name through the handle
    /// is under way.
    fn try_lock(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.gate.try_lock().ok()
    }
}

impl Drop for GateUse<'_> {
    fn drop(&mut self) {
        self.shared.prune_gate(self.name, &self.gate);
    }
}
