//! The waiter registry: which task waits for which grant.
//!
//! A grant arrives (by pub/sub, in a release reply of this process, or in
//! a heartbeat reply) naming an owner id; the registry hands it to the task
//! waiting under that owner id. It also groups waiters by lock, so the
//! heartbeat keeps all of a lock's waiters alive with one call and probes
//! the oldest of them, and it remembers cancels that failed, so the
//! heartbeat retries them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use fairlock_core::{Handoff, LockKeys};
use tokio::sync::Notify;

/// What a waiting task is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaiterEvent {
    /// The task's owner id now owns the lock, with this fencing token.
    /// `confirm`: the grant was found by a heartbeat, or a release here
    /// saw that it went unheard, rather than being announced by
    /// pub/sub; its message may have reached nobody, in which case the
    /// script gave it only the waiter TTL as lease, so the waiter sets its
    /// own lease before going on.
    Granted { token: u64, confirm: bool },
    /// The waiter may be missing from the queue (evicted after a stall, or
    /// the queue was lost): run acquire again, which keeps its place if it
    /// still has one.
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
            match (*slot, event) {
                // A grant is never overwritten by a re-check.
                (Some(WaiterEvent::Granted { .. }), WaiterEvent::Recheck) => {}
                // The same grant told twice: if either telling says its
                // lease must be set, it must.
                (
                    Some(WaiterEvent::Granted {
                        token: told,
                        confirm: first,
                    }),
                    WaiterEvent::Granted { token, confirm },
                ) if told == token => {
                    *slot = Some(WaiterEvent::Granted {
                        token,
                        confirm: first || confirm,
                    });
                }
                // A stale grant (a late heartbeat reply about a grant the
                // waiter lost and was given again since) never replaces
                // a newer one: tokens only grow.
                (
                    Some(WaiterEvent::Granted { token: told, .. }),
                    WaiterEvent::Granted { token, .. },
                ) if told > token => {}
                _ => *slot = Some(event),
            }
        }
        // Stores a permit if the task is not waiting yet: nothing is missed.
        self.ready.notify_one();
    }

    /// Whether a grant waits here for the task to take it.
    fn has_grant(&self) -> bool {
        matches!(
            *self.event.lock().unwrap_or_else(|p| p.into_inner()),
            Some(WaiterEvent::Granted { .. })
        )
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
    /// Its ticket, once acquire has queued it; only queued waiters are
    /// heartbeaten.
    ticket: Option<u64>,
}

/// The waiters of one lock in this process, for one heartbeat call.
pub(crate) struct LockWaiters {
    pub(crate) keys: Arc<LockKeys>,
    /// The oldest queued waiter: the heartbeat checks it is still queued.
    pub(crate) probe: String,
}

#[derive(Default)]
struct State {
    /// Owner id → its waiter. The owner id string is shared with `by_lock`
    /// (one allocation per waiter, not two: a process may have ten
    /// thousand).
    waiters: HashMap<Arc<str>, Waiter>,
    /// Lock (owner key) → owner ids waiting on it.
    by_lock: HashMap<String, (Arc<LockKeys>, HashSet<Arc<str>>)>,
    /// Lock (owner key) → owner ids whose cancel failed, to retry.
    cancels: HashMap<String, (Arc<LockKeys>, HashSet<String>)>,
}

/// All waiting tasks of one client.
#[derive(Default)]
pub(crate) struct WaiterRegistry {
    state: Mutex<State>,
}

impl WaiterRegistry {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section is a few map operations: a poisoned lock
        // is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `owner_id` before its first acquire call, so a grant that is
    /// published the moment it is queued is not missed.
    pub(crate) fn register(&self, owner_id: &str, keys: &Arc<LockKeys>) -> Arc<WaiterSlot> {
        let slot = Arc::new(WaiterSlot::default());
        let owner_id: Arc<str> = Arc::from(owner_id);
        let mut state = self.state();
        state.waiters.insert(
            Arc::clone(&owner_id),
            Waiter {
                keys: Arc::clone(keys),
                slot: Arc::clone(&slot),
                ticket: None,
            },
        );
        // The lock's entry usually exists already (its other waiters):
        // its key is copied only when the entry is made.
        match state.by_lock.get_mut(keys.owner()) {
            Some((_, owner_ids)) => {
                owner_ids.insert(owner_id);
            }
            None => {
                let owner_ids = HashSet::from([owner_id]);
                state
                    .by_lock
                    .insert(keys.owner().to_owned(), (Arc::clone(keys), owner_ids));
            }
        }
        slot
    }

    /// Forgets `owner_id`; later grants for it are handed back.
    pub(crate) fn deregister(&self, owner_id: &str) {
        let mut state = self.state();
        if let Some(waiter) = state.waiters.remove(owner_id) {
            let lock = waiter.keys.owner();
            if let Some((_, owner_ids)) = state.by_lock.get_mut(lock) {
                owner_ids.remove(owner_id);
                if owner_ids.is_empty() {
                    state.by_lock.remove(lock);
                }
            }
        }
    }

    /// Records that `owner_id` is queued with `ticket`, so heartbeats cover it.
    pub(crate) fn mark_queued(&self, owner_id: &str, ticket: u64) {
        if let Some(waiter) = self.state().waiters.get_mut(owner_id) {
            waiter.ticket = Some(ticket);
        }
    }

    /// Whether `owner_id`'s task still waits here (registered, not yet
    /// granted, cancelled or given up).
    pub(crate) fn is_waiting(&self, owner_id: &str) -> bool {
        self.state().waiters.contains_key(owner_id)
    }

    /// Routes an event to `owner_id`'s task; `false` if nobody waits for it.
    /// The registry's lock is not held while the task is woken.
    pub(crate) fn deliver(&self, owner_id: &str, event: WaiterEvent) -> bool {
        let slot = self
            .state()
            .waiters
            .get(owner_id)
            .map(|waiter| Arc::clone(&waiter.slot));
        match slot {
            Some(slot) => {
                slot.put(event);
                true
            }
            None => false,
        }
    }

    /// Wakes the new holder of a grant that a release made in this process
    /// (it may wait here), without waiting for its pub/sub message. An
    /// unheard grant's lease was cut to the waiter TTL, so the woken task
    /// sets its own lease first.
    pub(crate) fn deliver_handoff(&self, handoff: &Handoff) -> bool {
        self.deliver(
            &handoff.owner_id,
            WaiterEvent::Granted {
                token: handoff.token,
                confirm: handoff.unheard,
            },
        )
    }

    /// Whether `owner_id` waits here with no grant told to it yet.
    pub(crate) fn waits_untold(&self, owner_id: &str) -> bool {
        self.state()
            .waiters
            .get(owner_id)
            .is_some_and(|waiter| !waiter.slot.has_grant())
    }

    /// Tells every waiter of lock `owner_key` to check its place.
    pub(crate) fn recheck_lock(&self, owner_key: &str) {
        let slots: Vec<Arc<WaiterSlot>> = {
            let state = self.state();
            state
                .by_lock
                .get(owner_key)
                .map(|(_, owner_ids)| {
                    owner_ids
                        .iter()
                        .filter_map(|m| state.waiters.get(m).map(|w| Arc::clone(&w.slot)))
                        .collect()
                })
                .unwrap_or_default()
        };
        for slot in slots {
            slot.put(WaiterEvent::Recheck);
        }
    }

    /// Tells every waiter here to check its place: when the client closes,
    /// each then finds the client closed and ends with `Error::Closed`
    /// (nothing else could wake it once the heartbeat and the grant
    /// connections have stopped).
    pub(crate) fn recheck_all(&self) {
        let slots: Vec<Arc<WaiterSlot>> = self
            .state()
            .waiters
            .values()
            .map(|w| Arc::clone(&w.slot))
            .collect();
        for slot in slots {
            slot.put(WaiterEvent::Recheck);
        }
    }

    /// Every lock with queued waiters here.
    pub(crate) fn waiting_locks(&self) -> Vec<LockWaiters> {
        let state = self.state();
        state
            .by_lock
            .values()
            .filter_map(|(keys, owner_ids)| {
                let mut probe: Option<(u64, &Arc<str>)> = None;
                for owner_id in owner_ids {
                    if let Some(ticket) = state.waiters.get(owner_id).and_then(|w| w.ticket) {
                        if probe.is_none_or(|(oldest, _)| ticket < oldest) {
                            probe = Some((ticket, owner_id));
                        }
                    }
                }
                probe.map(|(_, probe)| LockWaiters {
                    keys: Arc::clone(keys),
                    probe: probe.to_string(),
                })
            })
            .collect()
    }

    /// Remembers a cancel that failed, for the heartbeat to retry.
    pub(crate) fn cancel_later(&self, keys: &Arc<LockKeys>, owner_id: &str) {
        self.state()
            .cancels
            .entry(keys.owner().to_owned())
            .or_insert_with(|| (Arc::clone(keys), HashSet::new()))
            .1
            .insert(owner_id.to_owned());
    }

    /// Takes the cancels to retry.
    pub(crate) fn take_cancels(&self) -> Vec<(Arc<LockKeys>, Vec<String>)> {
        self.state()
            .cancels
            .drain()
            .map(|(_, (keys, owner_ids))| (keys, owner_ids.into_iter().collect()))
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
    fn routes_grants_groups_by_lock_and_probes_the_oldest() {
        let registry = WaiterRegistry::default();
        let keys = Arc::new(LockKeys::new(
            &KeyPrefix::default(),
            &LockName::new("a").unwrap(),
        ));
        let slot1 = registry.register("m1", &keys);
        let _slot2 = registry.register("m2", &keys);
        assert!(registry.deliver(
            "m1",
            WaiterEvent::Granted {
                token: 3,
                confirm: false
            }
        ));
        // A later re-check does not hide the grant.
        assert!(registry.deliver("m1", WaiterEvent::Recheck));
        let event = slot1.event.lock().unwrap().take();
        assert_eq!(
            event,
            Some(WaiterEvent::Granted {
                token: 3,
                confirm: false
            })
        );
        assert!(registry.waiting_locks().is_empty(), "not queued yet");
        registry.mark_queued("m1", 20);
        registry.mark_queued("m2", 10);
        let locks = registry.waiting_locks();
        assert_eq!(locks.len(), 1);
        assert_eq!(locks[0].probe, "m2");
        registry.deregister("m1");
        registry.deregister("m2");
        assert!(!registry.deliver("m1", WaiterEvent::Recheck));
        assert!(registry.waiting_locks().is_empty());
        assert_eq!(registry.len(), 0);
    }

    /// One grant can reach its waiter twice (a heartbeat that found it, and
    /// the release reply of this process): if either telling says the
    /// grant went unheard, the waiter must set its own lease.
    #[test]
    fn a_grant_told_twice_keeps_its_lease_to_set() {
        let registry = WaiterRegistry::default();
        let keys = Arc::new(LockKeys::new(
            &KeyPrefix::default(),
            &LockName::new("a").unwrap(),
        ));
        let slot = registry.register("m1", &keys);
        let unheard = Handoff {
            owner_id: "m1".to_owned(),
            token: 7,
            unheard: true,
        };
        assert!(registry.deliver_handoff(&unheard));
        assert!(registry.deliver(
            "m1",
            WaiterEvent::Granted {
                token: 7,
                confirm: false
            }
        ));
        assert_eq!(
            slot.event.lock().unwrap().take(),
            Some(WaiterEvent::Granted {
                token: 7,
                confirm: true
            })
        );
        registry.deregister("m1");
    }

    /// Two different grants of one waiter (a stale one found by a late
    /// heartbeat reply after the waiter was granted again): the newer one,
    /// with the higher token, stays, whichever came last.
    #[test]
    fn a_stale_grant_never_replaces_a_newer_one() {
        let registry = WaiterRegistry::default();
        let keys = Arc::new(LockKeys::new(
            &KeyPrefix::default(),
            &LockName::new("a").unwrap(),
        ));
        let slot = registry.register("m1", &keys);
        let newer = WaiterEvent::Granted {
            token: 9,
            confirm: false,
        };
        let stale = WaiterEvent::Granted {
            token: 7,
            confirm: true,
        };
        assert!(registry.deliver("m1", newer));
        assert!(registry.deliver("m1", stale));
        assert_eq!(slot.event.lock().unwrap().take(), Some(newer));
        assert!(registry.deliver("m1", stale));
        assert!(registry.deliver("m1", newer));
        assert_eq!(slot.event.lock().unwrap().take(), Some(newer));
    }
}
