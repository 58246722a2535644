//! Reentrancy for async code.
//!
//! Async tasks have no thread identity, so a lock is re-entered through an
//! explicit owner handle, [`LockOwner`]: a lock taken through a handle can be
//! taken again through the same handle (or a clone of it, in any task)
//! without waiting, keeping its fencing token. The handle counts the holds;
//! releasing a guard gives back one hold, and the last one releases the
//! lock in Redis. Redis sees one owner and one grant, so re-entry costs no
//! round trip.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use fairlock_core::LockName;
use tokio::sync::Mutex as AsyncMutex;

use crate::acquire::{acquire, Mode};
use crate::client::LockClient;
use crate::config::LockOptions;
use crate::error::{Error, Result};
use crate::guard::{HeldLock, LockGuard};

/// The holds of one owner handle.
#[derive(Default)]
pub(crate) struct OwnerShared {
    /// Lock name → the grant and how many guards hold it.
    holds: Mutex<HashMap<String, (Arc<HeldLock>, usize)>>,
    /// Lock name → serializes acquisitions of that lock through this
    /// handle, so two tasks sharing it never both queue for the same lock.
    acquiring: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

impl OwnerShared {
    fn holds(&self) -> MutexGuard<'_, HashMap<String, (Arc<HeldLock>, usize)>> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes another hold on a grant this owner has, if it is still good.
    fn reenter(&self, name: &str) -> Option<Arc<HeldLock>> {
        let mut holds = self.holds();
        let (held, count) = holds.get_mut(name)?;
        if held.is_released() || held.is_lost() {
            holds.remove(name);
            return None;
        }
        *count += 1;
        Some(Arc::clone(held))
    }

    /// Gives back one hold; `true` if it was the last.
    pub(crate) fn give_back(&self, held: &Arc<HeldLock>) -> bool {
        let mut holds = self.holds();
        match holds.get_mut(&held.name) {
            Some((current, count)) if Arc::ptr_eq(current, held) => {
                *count -= 1;
                if *count == 0 {
                    holds.remove(&held.name);
                    true
                } else {
                    false
                }
            }
            // A grant the handle has already forgotten (lost, released):
            // nothing else counts on it.
            _ => true,
        }
    }

    fn gate(&self, name: &str) -> Arc<AsyncMutex<()>> {
        let mut gates = self.acquiring.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(gates.entry(name.to_owned()).or_default())
    }
}

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
#[derive(Clone)]
pub struct LockOwner {
    client: LockClient,
    shared: Arc<OwnerShared>,
}

impl LockOwner {
    pub(crate) fn new(client: LockClient) -> Self {
        Self {
            client,
            shared: Arc::default(),
        }
    }

    /// Like [`LockClient::lock`], but re-enters a lock this owner holds.
    pub async fn lock(&self, name: &str) -> Result<LockGuard> {
        self.lock_with(name, LockOptions::default()).await
    }

    /// Like [`LockClient::lock_with`], but re-enters a lock this owner
    /// holds (the options then do not apply: the first hold's lease rules).
    pub async fn lock_with(&self, name: &str, options: LockOptions) -> Result<LockGuard> {
        match self.take(name, options, Mode::Wait).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::Redis(
                "acquire in wait mode ended without a grant".into(),
            )),
        }
    }

    /// Like [`LockClient::try_lock`], but re-enters a lock this owner holds.
    pub async fn try_lock(&self, name: &str) -> Result<Option<LockGuard>> {
        self.take(name, LockOptions::default(), Mode::Try).await
    }

    /// How many holds this owner has on lock `name` (0 if none).
    pub fn hold_count(&self, name: &str) -> usize {
        self.shared.holds().get(name).map_or(0, |(_, count)| *count)
    }

    async fn take(
        &self,
        name: &str,
        options: LockOptions,
        mode: Mode,
    ) -> Result<Option<LockGuard>> {
        let name = LockName::new(name)?;
        let gate = self.shared.gate(name.as_str());
        let _one_at_a_time = gate.lock().await;
        if let Some(held) = self.shared.reenter(name.as_str()) {
            return Ok(Some(
                LockGuard::new(self.client.clone(), held).with_owner(Arc::clone(&self.shared)),
            ));
        }
        let Some(guard) = acquire(&self.client, name.as_str(), options, mode).await? else {
            return Ok(None);
        };
        self.shared
            .holds()
            .insert(name.as_str().to_owned(), (Arc::clone(&guard.held), 1));
        Ok(Some(guard.with_owner(Arc::clone(&self.shared))))
    }
}
