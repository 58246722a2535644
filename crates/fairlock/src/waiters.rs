//! The waiter registry: which task waits for which grant.
//!
//! A grant arrives (by pub/sub, in a release reply of this process, or in
//! a heartbeat reply) naming an owner id; the registry hands it to the task
//! waiting under that owner id. It also groups waiters by lock, so the
//! heartbeat keeps all of a lock's waiters alive with one call and checks
//! a bounded few of them per call (see [`LockWaiters`]), and it remembers
//! cancels that failed, so the heartbeat retries them.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Bound;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use fairlock_core::{Handoff, LockKeys};

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

/// Whether a release woke a waiter of this process (the new holder, or for
/// a permit at least one of those granted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woke {
    /// A task here was handed the lock by this release.
    Here,
    /// Nobody here was woken: free, or the next holder is elsewhere.
    NobodyHere,
}

/// Where a waiting task finds its next event: one slot, not a queue, since
/// only the latest matters (a grant is never overwritten by a re-check).
/// Small on purpose: a process may have ten thousand waiters. The task's
/// waker sits beside the event under the same mutex, so waiting needs no
/// state in the task's future (a `Notify` there cost 64 B per waiter).
#[derive(Default)]
pub(crate) struct WaiterSlot {
    inner: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    event: Option<WaiterEvent>,
    /// The waiting task, once it found the slot empty.
    waker: Option<Waker>,
}

impl WaiterSlot {
    fn state(&self) -> MutexGuard<'_, SlotState> {
        // A few assignments under the lock: a poisoned one is consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put(&self, event: WaiterEvent) {
        let waker = {
            let mut state = self.state();
            let slot = &mut state.event;
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
            state.waker.take()
        };
        // Woken outside the lock. An event put before the task waits is
        // kept in the slot: nothing is missed.
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Whether a grant waits here for the task to take it.
    fn has_grant(&self) -> bool {
        matches!(self.state().event, Some(WaiterEvent::Granted { .. }))
    }

    /// The event waiting in the slot, taken (for tests).
    #[cfg(test)]
    fn take(&self) -> Option<WaiterEvent> {
        self.state().event.take()
    }

    /// The next event, or `Pending` with the task's waker kept to be woken
    /// when one is put.
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<WaiterEvent> {
        let mut state = self.state();
        if let Some(event) = state.event.take() {
            return Poll::Ready(event);
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

struct Waiter {
    keys: Arc<LockKeys>,
    slot: Arc<WaiterSlot>,
    /// Its ticket, once acquire has queued it; only queued waiters are
    /// heartbeaten.
    ticket: Option<u64>,
}

/// How many waiters between the oldest and the newest one heartbeat
/// checks per lock, in turn by ticket. With the oldest and the newest that
/// is at most 8 probes per lock and call: the Redis cost of a heartbeat
/// stays bounded per lock whatever the number of waiters, and a process
/// with up to 8 waiters on a lock has every one checked every interval.
const ROTATING_PROBES: usize = 6;

/// The waiters of one lock in this process, for one heartbeat call.
pub(crate) struct LockWaiters {
    pub(crate) keys: Arc<LockKeys>,
    /// The queued waiters the heartbeat checks, each still queued or
    /// not: the oldest first, then the newest (if another), then up to
    /// [`ROTATING_PROBES`] of those in between, taken in turn by ticket
    /// from one call to the next. The oldest and the newest cover the
    /// ways a queue loses entries of a live process: a fail-over to a
    /// replica that missed the latest enqueues loses the newest, a purge
    /// (the process was taken for dead) or a lost key the oldest. The
    /// turn covers any other loss within a few intervals.
    pub(crate) probes: Vec<Arc<str>>,
    /// How many of `probes` are the oldest and the newest (1 or 2).
    pub(crate) edges: usize,
    /// Where the turn goes on once this call has answered.
    next_turn: u64,
}

impl LockWaiters {
    /// The probes as a heartbeat call takes them.
    pub(crate) fn probe_refs(&self) -> Vec<&str> {
        self.probes.iter().map(|probe| &**probe).collect()
    }

    /// Acts on the probes (indices into `probes`) that a heartbeat found
    /// neither queued nor holding. Usually such a probe was granted while
    /// the call was on its way and has taken its grant and left the
    /// registry since: nothing is wrong. One whose task still waits here,
    /// with no grant told to it, has lost its place. If it is the oldest
    /// or the newest, the queue may have lost a run of entries beside it
    /// (a purge from the head, the enqueues a fail-over missed at the
    /// tail), and every waiter of the lock checks its place; one in
    /// between checks its own. (Rechecking every waiter on every grant
    /// instead cost one script per waiter per heartbeat while a long queue
    /// drained.)
    pub(crate) fn recheck_lost(
        &self,
        registry: &WaiterRegistry,
        lost: impl IntoIterator<Item = usize>,
    ) {
        for i in lost {
            let probe = &self.probes[i];
            if !registry.waits_untold(probe) {
                continue;
            }
            if i < self.edges {
                registry.recheck_lock(self.keys.owner());
                return;
            }
            registry.deliver(probe, WaiterEvent::Recheck);
        }
    }
}

/// The waiters of one lock here, each in one of two sets.
struct ByLock {
    keys: Arc<LockKeys>,
    /// Those not queued yet (their acquire is on its way).
    unqueued: HashSet<Arc<str>>,
    /// The queued ones by ticket: a heartbeat round finds each lock's
    /// oldest, newest and next in turn here in a few steps, where a walk
    /// over every waiter held the registry's lock, which every grant is
    /// routed through, for a hash lookup per waiter (about 4% of the
    /// client's CPU in the benchmark's 1,000-lock cell, and a pause in
    /// routing grants that grew with the waiters). Keyed by ticket and
    /// owner id: a lock's tickets are unique while the server's clock
    /// does not go back, which a fail-over to a server whose clock is
    /// behind can break, so two waiters with one ticket are both kept.
    queued: BTreeSet<(u64, Arc<str>)>,
    /// The heartbeat checks waiters between the oldest and the newest in
    /// turn: those with tickets above this one come next.
    turn: u64,
}

impl ByLock {
    /// The lock's waiters a heartbeat call checks (see
    /// [`LockWaiters::probes`]); `None` if none is queued.
    fn probes(&self) -> Option<LockWaiters> {
        let oldest = self.queued.first()?;
        let newest = self.queued.last()?;
        // The owner ids shared, not copied: a round takes every lock's.
        let mut probes = Vec::with_capacity(2 + ROTATING_PROBES);
        probes.push(Arc::clone(&oldest.1));
        if newest != oldest {
            probes.push(Arc::clone(&newest.1));
        }
        let edges = probes.len();
        // The lowest tickets above the turn but the oldest and the newest
        // (the empty owner id sorts first).
        static NO_ID: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(""));
        let from = (self.turn.saturating_add(1), Arc::clone(&NO_ID));
        let turn: Vec<&(u64, Arc<str>)> = self
            .queued
            .range((Bound::Included(from), Bound::Unbounded))
            .filter(|&entry| entry.0 > self.turn && entry != oldest && entry != newest)
            .take(ROTATING_PROBES)
            .collect();
        // A full turn may have more after it; a short one reached
        // the newest, and the next call starts over.
        let next_turn = match turn.last() {
            Some(&&(t, _)) if turn.len() == ROTATING_PROBES => t,
            _ => 0,
        };
        probes.extend(turn.iter().map(|(_, owner_id)| Arc::clone(owner_id)));
        Some(LockWaiters {
            keys: Arc::clone(&self.keys),
            probes,
            edges,
            next_turn,
        })
    }
}

#[derive(Default)]
struct State {
    /// Owner id → its waiter. The owner id string is shared with `by_lock`
    /// (one allocation per waiter, not two: a process may have ten
    /// thousand).
    waiters: HashMap<Arc<str>, Waiter>,
    /// Lock (owner key) → owner ids waiting on it.
    by_lock: HashMap<String, ByLock>,
    /// Lock (owner key) → owner ids whose cancel failed, to retry.
    cancels: HashMap<String, (Arc<LockKeys>, HashSet<String>)>,
    /// How many of `waiters` have a ticket: kept as they change, so that
    /// reading it (`LockClient::stats`) does not walk every waiter under
    /// the lock grants are routed through.
    queued: usize,
}

impl State {
    /// Takes `owner_id`'s `waiter` (just removed from `waiters`, or
    /// replaced there) out of its lock's waiters and the queued count; a
    /// lock left without waiters is forgotten.
    fn leave(&mut self, owner_id: &Arc<str>, waiter: &Waiter) {
        if waiter.ticket.is_some() {
            self.queued -= 1;
        }
        let lock = waiter.keys.owner();
        let Some(entry) = self.by_lock.get_mut(lock) else {
            return;
        };
        let was_queued = waiter
            .ticket
            .is_some_and(|ticket| entry.queued.remove(&(ticket, Arc::clone(owner_id))));
        if !was_queued {
            entry.unqueued.remove(&**owner_id);
        }
        if entry.unqueued.is_empty() && entry.queued.is_empty() {
            self.by_lock.remove(lock);
        }
    }
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
    /// The owner id is kept as given (the waiting task holds the same
    /// one: one allocation per waiter).
    pub(crate) fn register(
        &self,
        owner_id: impl Into<Arc<str>>,
        keys: &Arc<LockKeys>,
    ) -> Arc<WaiterSlot> {
        let slot = Arc::new(WaiterSlot::default());
        let owner_id: Arc<str> = owner_id.into();
        let mut state = self.state();
        let replaced = state.waiters.insert(
            Arc::clone(&owner_id),
            Waiter {
                keys: Arc::clone(keys),
                slot: Arc::clone(&slot),
                ticket: None,
            },
        );
        // Owner ids are unique per acquire; kept right all the same.
        if let Some(replaced) = replaced {
            state.leave(&owner_id, &replaced);
        }
        // The lock's entry usually exists already (its other waiters):
        // its key is copied only when the entry is made.
        match state.by_lock.get_mut(keys.owner()) {
            Some(lock) => {
                lock.unqueued.insert(owner_id);
            }
            None => {
                let lock = ByLock {
                    keys: Arc::clone(keys),
                    unqueued: HashSet::from([owner_id]),
                    queued: BTreeSet::new(),
                    turn: 0,
                };
                state.by_lock.insert(keys.owner().to_owned(), lock);
            }
        }
        slot
    }

    /// Forgets `owner_id`; later grants for it are handed back.
    pub(crate) fn deregister(&self, owner_id: &str) {
        let mut state = self.state();
        if let Some((owner_id, waiter)) = state.waiters.remove_entry(owner_id) {
            state.leave(&owner_id, &waiter);
        }
    }

    /// Records that `owner_id` is queued with `ticket`, so heartbeats cover it.
    pub(crate) fn mark_queued(&self, owner_id: &str, ticket: u64) {
        let state = &mut *self.state();
        let Some(waiter) = state.waiters.get_mut(owner_id) else {
            return;
        };
        let before = waiter.ticket.replace(ticket);
        if before.is_none() {
            state.queued += 1;
        }
        let Some(lock) = state.by_lock.get_mut(waiter.keys.owner()) else {
            return;
        };
        // The owner id as the lock keeps it (one allocation per waiter).
        let kept = match before {
            Some(before) => lock
                .queued
                .take(&(before, Arc::from(owner_id)))
                .map(|(_, id)| id),
            None => lock.unqueued.take(owner_id),
        };
        let kept = kept.or_else(|| {
            let (id, _) = state.waiters.get_key_value(owner_id)?;
            Some(Arc::clone(id))
        });
        if let Some(owner_id) = kept {
            lock.queued.insert((ticket, owner_id));
        }
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
                .map(|lock| {
                    lock.unqueued
                        .iter()
                        .chain(lock.queued.iter().map(|(_, id)| id))
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

    /// Every lock with queued waiters here, with the waiters a heartbeat
    /// checks (see [`LockWaiters::probes`]): a few steps per lock in its
    /// waiters ordered by ticket.
    pub(crate) fn waiting_locks(&self) -> Vec<LockWaiters> {
        let state = self.state();
        state.by_lock.values().filter_map(ByLock::probes).collect()
    }

    /// [`Self::waiting_locks`] for lock `owner_key` alone: `None` if no
    /// waiter here is queued on it.
    pub(crate) fn waiting_lock(&self, owner_key: &str) -> Option<LockWaiters> {
        let state = self.state();
        state.by_lock.get(owner_key)?.probes()
    }

    /// A heartbeat call checked `lock`'s probes: the next call checks the
    /// waiters after them. The turn moves on only when a call answered, so
    /// a failed call does not skip anyone.
    pub(crate) fn checked(&self, lock: &LockWaiters) {
        if let Some(entry) = self.state().by_lock.get_mut(lock.keys.owner()) {
            entry.turn = lock.next_turn;
        }
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

    /// How many waiting tasks have a place in a queue ([`Self::mark_queued`]).
    pub(crate) fn queued(&self) -> usize {
        self.state().queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairlock_core::{KeyPrefix, LockName};

    /// The keys of lock `name` under the default prefix.
    fn keys_of(name: &str) -> Arc<LockKeys> {
        Arc::new(LockKeys::new(
            &KeyPrefix::default(),
            &LockName::new(name).expect("a valid test name"),
        ))
    }

    /// The queued count follows registration, tickets (a second ticket,
    /// as a re-check gives, counts once) and leaving.
    #[test]
    fn counts_the_waiters_with_a_ticket() {
        let registry = WaiterRegistry::default();
        let keys = keys_of("q");
        let _a = registry.register("a", &keys);
        let _b = registry.register("b", &keys);
        assert_eq!((registry.len(), registry.queued()), (2, 0));
        registry.mark_queued("a", 5);
        registry.mark_queued("a", 9);
        registry.mark_queued("nobody", 1);
        assert_eq!((registry.len(), registry.queued()), (2, 1));
        registry.mark_queued("b", 6);
        registry.deregister("a");
        registry.deregister("a");
        assert_eq!((registry.len(), registry.queued()), (1, 1));
        registry.deregister("b");
        assert_eq!((registry.len(), registry.queued()), (0, 0));
    }

    #[test]
    fn routes_grants_groups_by_lock_and_probes_the_oldest() {
        let registry = WaiterRegistry::default();
        let keys = keys_of("a");
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
        let event = slot1.take();
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
        assert_eq!(&*locks[0].probes[0], "m2");
        assert_eq!(locks[0].probe_refs(), ["m2", "m1"]);
        assert_eq!(locks[0].edges, 2);
        registry.deregister("m1");
        registry.deregister("m2");
        assert!(!registry.deliver("m1", WaiterEvent::Recheck));
        assert!(registry.waiting_locks().is_empty());
        assert_eq!(registry.len(), 0);
    }

    /// The heartbeat checks the oldest and the newest waiter of a lock
    /// every call and those in between in turn, a bounded few per call,
    /// so every waiter is checked within a few calls; the turn moves on
    /// only when a call was answered.
    #[test]
    fn probes_take_the_waiters_in_between_in_turn() {
        let registry = WaiterRegistry::default();
        let keys = keys_of("a");
        for ticket in 1..=20u64 {
            let owner_id = format!("m{ticket}");
            let _slot = registry.register(owner_id.as_str(), &keys);
            registry.mark_queued(&owner_id, ticket);
        }
        let names = |tickets: &[u64]| -> Vec<Arc<str>> {
            tickets.iter().map(|t| format!("m{t}").into()).collect()
        };
        let mut seen = Vec::new();
        for _ in 0..4 {
            let locks = registry.waiting_locks();
            let lock = &locks[0];
            assert_eq!(lock.edges, 2);
            assert_eq!(lock.probes[..2], names(&[1, 20]));
            assert!(lock.probes.len() <= 2 + ROTATING_PROBES);
            seen.push(lock.probes[2..].to_vec());
            // Not answered: the same turn again.
            assert_eq!(registry.waiting_locks()[0].probes, lock.probes);
            registry.checked(lock);
        }
        assert_eq!(
            seen,
            [
                names(&[2, 3, 4, 5, 6, 7]),
                names(&[8, 9, 10, 11, 12, 13]),
                names(&[14, 15, 16, 17, 18, 19]),
                names(&[]),
            ]
        );
        assert_eq!(
            registry.waiting_locks()[0].probes[2..],
            names(&[2, 3, 4, 5, 6, 7])
        );
        // One waiter alone is the oldest and the newest.
        for ticket in 2..=20u64 {
            registry.deregister(&format!("m{ticket}"));
        }
        assert_eq!(registry.waiting_locks()[0].probes, names(&[1]));
        assert_eq!(registry.waiting_locks()[0].edges, 1);
    }

    /// The probes follow the waiters' tickets as they change: a waiter
    /// queued again with a new ticket (a rejoin) is probed by that one, a
    /// waiter that left or was registered again (not yet queued) is probed
    /// no more, a lock whose queued waiters all left has no probes while
    /// an unqueued waiter stays registered on it, and a re-check of a lock
    /// reaches its queued and unqueued waiters.
    #[test]
    fn probes_follow_tickets_as_they_change() {
        let registry = WaiterRegistry::default();
        let (a, b) = (keys_of("a"), keys_of("b"));
        for (owner_id, ticket) in [("m1", 10), ("m2", 20), ("m3", 30)] {
            let _slot = registry.register(owner_id, &a);
            registry.mark_queued(owner_id, ticket);
        }
        let probes = |registry: &WaiterRegistry| -> Vec<String> {
            registry
                .waiting_lock(a.owner())
                .map(|lock| lock.probe_refs().iter().map(|p| p.to_string()).collect())
                .unwrap_or_default()
        };
        assert_eq!(probes(&registry), ["m1", "m3", "m2"]);
        // m1 rejoins behind m3: m2 is now the oldest, m1 the newest.
        registry.mark_queued("m1", 40);
        assert_eq!(probes(&registry), ["m2", "m1", "m3"]);
        // m3 leaves; m2 is registered again (a new acquire, no ticket yet)
        // on another lock.
        registry.deregister("m3");
        let m2 = registry.register("m2", &b);
        assert_eq!(probes(&registry), ["m1"]);
        assert!(registry.waiting_lock(b.owner()).is_none(), "m2 not queued");
        assert_eq!(registry.queued(), 1);
        // The last queued waiter leaves; one registered, unqueued, stays.
        let m4 = registry.register("m4", &a);
        registry.deregister("m1");
        assert!(probes(&registry).is_empty());
        assert!(registry.waiting_locks().is_empty());
        registry.mark_queued("m4", 50);
        assert_eq!(probes(&registry), ["m4"]);
        assert_eq!(registry.queued(), 1);
        // A re-check of the lock reaches its queued and unqueued waiters
        // alike, and no waiter of another lock.
        let m5 = registry.register("m5", &a);
        registry.recheck_lock(a.owner());
        assert_eq!(m4.take(), Some(WaiterEvent::Recheck));
        assert_eq!(m5.take(), Some(WaiterEvent::Recheck));
        assert_eq!(m2.take(), None);
    }

    /// Two waiters with one ticket (a fail-over to a server whose clock is
    /// behind can draw a ticket again) are both probed, and one of them
    /// queued again with a new ticket leaves the other probed by the old
    /// one. Keyed by ticket alone, the second pushed the first out of the
    /// probes for good.
    #[test]
    fn waiters_sharing_a_ticket_are_both_probed() {
        let registry = WaiterRegistry::default();
        let keys = keys_of("same");
        for (owner_id, ticket) in [("x", 10), ("y", 10), ("z", 20)] {
            let _slot = registry.register(owner_id, &keys);
            registry.mark_queued(owner_id, ticket);
        }
        let probes = || {
            let lock = registry.waiting_lock(keys.owner()).expect("queued");
            lock.probe_refs()
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(probes(), ["x", "z", "y"]);
        registry.mark_queued("y", 30);
        assert_eq!(probes(), ["x", "y", "z"]);
        registry.deregister("x");
        assert_eq!(probes(), ["z", "y"]);
        assert_eq!(registry.queued(), 2);
    }

    /// One grant can reach its waiter twice (a heartbeat that found it, and
    /// the release reply of this process): if either telling says the
    /// grant went unheard, the waiter must set its own lease.
    #[test]
    fn a_grant_told_twice_keeps_its_lease_to_set() {
        let registry = WaiterRegistry::default();
        let keys = keys_of("a");
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
            slot.take(),
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
        let keys = keys_of("a");
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
        assert_eq!(slot.take(), Some(newer));
        assert!(registry.deliver("m1", stale));
        assert!(registry.deliver("m1", newer));
        assert_eq!(slot.take(), Some(newer));
    }
}
