//! The waiter registry: which task waits for which grant.
//!
//! Grants arrive on the process's one pub/sub channel (or in a heartbeat
//! reply) naming a member; the registry routes each to the task waiting
//! under that member. It also groups waiters by lock, so the heartbeat can
//! refresh all of a lock's waiters in one script call.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use fairlock_core::LockKeys;
use tokio::sync::Notify;

/// What a waiting task is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaiterEvent {
    /// The task's member now owns the lock, with this fencing token.
    Granted { token: u64 },
    /// The waiter is not in the queue (evicted, or the queue was lost in a
    /// failover): run acquire again to re-register.
    Recheck,
}

/// Where a waiting task finds its next event: one slot, not a queue, since
/// only the latest matters (a grant is never overwritten by a re-check).
/// Small on purpose: a process may have ten thousand waiters.
#[derive(Default)]
pub(crate) struct WaiterSlot {
    event: Mutex<Option<WaiterEvent>>,
    ready: Notify,
}

impl WaiterSlot {
    fn put(&self, event: WaiterEvent) {
        {
            let mut slot = self.event.lock().unwrap_or_else(|p| p.into_inner());
            if !matches!(
                (*slot, event),
                (Some(WaiterEvent::Granted { .. }), WaiterEvent::Recheck)
            ) {
                *slot = Some(event);
            }
        }
        // Stores a permit if the task is not waiting yet: nothing is missed.
        self.ready.notify_one();
    }

    /// Waits for the next event.
    pub(crate) async fn next(&self) -> WaiterEvent {
        loop {
            let taken = self.event.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(event) = taken {
                return event;
            }
            self.ready.notified().await;
        }
    }
}

struct Waiter {
    keys: Arc<LockKeys>,
    slot: Arc<WaiterSlot>,
    /// Set once acquire has queued it; only queued waiters get heartbeats.
    queued: bool,
}

#[derive(Default)]
struct State {
    waiters: HashMap<String, Waiter>,
    /// Lock (owner key) → members waiting on it, for batched heartbeats.
    by_lock: HashMap<String, (Arc<LockKeys>, HashSet<String>)>,
}

/// All waiting tasks of one client.
#[derive(Default)]
pub(crate) struct WaiterRegistry {
    state: Mutex<State>,
}

impl WaiterRegistry {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the maps half
        // updated (every critical section is a few map operations), so a
        // poisoned lock is still consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers `member` before its first acquire call, so a grant that is
    /// published the moment it is queued is not missed.
    pub(crate) fn register(&self, member: &str, keys: &Arc<LockKeys>) -> Arc<WaiterSlot> {
        let slot = Arc::new(WaiterSlot::default());
        let mut state = self.state();
        state.waiters.insert(
            member.to_owned(),
            Waiter {
                keys: Arc::clone(keys),
                slot: Arc::clone(&slot),
                queued: false,
            },
        );
        state
            .by_lock
            .entry(keys.owner().to_owned())
            .or_insert_with(|| (Arc::clone(keys), HashSet::new()))
            .1
            .insert(member.to_owned());
        slot
    }

    /// Forgets `member`; later grants for it are ignored by the router.
    pub(crate) fn deregister(&self, member: &str) {
        let mut state = self.state();
        if let Some(waiter) = state.waiters.remove(member) {
            let lock = waiter.keys.owner();
            if let Some((_, members)) = state.by_lock.get_mut(lock) {
                members.remove(member);
                if members.is_empty() {
                    state.by_lock.remove(lock);
                }
            }
        }
    }

    /// Marks `member` as queued in Redis, so heartbeats include it.
    pub(crate) fn mark_queued(&self, member: &str) {
        if let Some(waiter) = self.state().waiters.get_mut(member) {
            waiter.queued = true;
        }
    }

    /// Routes an event to `member`'s task; `false` if nobody waits for it.
    pub(crate) fn deliver(&self, member: &str, event: WaiterEvent) -> bool {
        match self.state().waiters.get(member) {
            Some(waiter) => {
                waiter.slot.put(event);
                true
            }
            None => false,
        }
    }

    /// Every lock with queued waiters here, with those waiters' members.
    pub(crate) fn waiting_locks(&self) -> Vec<(Arc<LockKeys>, Vec<String>)> {
        let state = self.state();
        state
            .by_lock
            .values()
            .filter_map(|(keys, members)| {
                let queued: Vec<String> = members
                    .iter()
                    .filter(|m| state.waiters.get(*m).is_some_and(|w| w.queued))
                    .cloned()
                    .collect();
                (!queued.is_empty()).then(|| (Arc::clone(keys), queued))
            })
            .collect()
    }

    /// How many tasks wait right now.
    pub(crate) fn len(&self) -> usize {
        self.state().waiters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairlock_core::{KeyPrefix, LockName};

    #[test]
    fn routes_grants_and_groups_by_lock() {
        let registry = WaiterRegistry::default();
        let keys = Arc::new(LockKeys::new(
            &KeyPrefix::default(),
            &LockName::new("a").unwrap(),
        ));
        let slot1 = registry.register("m1.0", &keys);
        let _slot2 = registry.register("m2.0", &keys);
        assert!(registry.deliver("m1.0", WaiterEvent::Granted { token: 3 }));
        // A later re-check does not hide the grant.
        assert!(registry.deliver("m1.0", WaiterEvent::Recheck));
        let event = slot1.event.lock().unwrap().take();
        assert_eq!(event, Some(WaiterEvent::Granted { token: 3 }));
        assert!(registry.waiting_locks().is_empty(), "not queued yet");
        registry.mark_queued("m1.0");
        registry.mark_queued("m2.0");
        assert_eq!(registry.waiting_locks()[0].1.len(), 2);
        registry.deregister("m1.0");
        registry.deregister("m2.0");
        assert!(!registry.deliver("m1.0", WaiterEvent::Recheck));
        assert!(registry.waiting_locks().is_empty());
        assert_eq!(registry.len(), 0);
    }
}
