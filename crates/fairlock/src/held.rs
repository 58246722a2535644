//! What the client holds: one [`HeldLock`] per grant, and the [`HeldLocks`]
//! registry of them all.
//!
//! A grant is shared by its guards (several, when re-entered), the
//! registry, and the lease watchdog. Its lease-lost signal lives here: the
//! watchdog, a forced-release notice, a refused release or extend, and the
//! local clock (for fixed leases) all fire it through [`HeldLock::mark_lost`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fairlock_core::{LockKeys, LockName};
use tokio::sync::watch;

use crate::config::Lease;
use crate::telemetry::LockTelemetry;

/// One grant.
pub(crate) struct HeldLock {
    pub(crate) name: LockName,
    pub(crate) keys: Arc<LockKeys>,
    /// The holder's identity in Redis (see `fairlock_core::OwnerId`).
    pub(crate) owner_id: String,
    pub(crate) token: u64,
    /// The queue ticket, if the grant came after waiting in the queue.
    pub(crate) ticket: Option<u64>,
    pub(crate) lease: Lease,
    pub(crate) granted_at: Instant,
    /// When the lease runs out by the local clock (see [`LeaseClock`]).
    lease_clock: Mutex<LeaseClock>,
    lost: watch::Sender<bool>,
    released: AtomicBool,
    /// Set when the client shut down with this grant held: its lease then
    /// runs out by design (the watchdog has stopped), and its loss is
    /// signalled but not counted.
    client_closed: AtomicBool,
    pub(crate) telemetry: LockTelemetry,
}

/// A grant's lease by the local monotonic clock: the start of the call
/// sent last of those that set it (the granting call, a renewal or an
/// extend) and the length it set, which the watchdog renews from. Counted
/// from before Redis set it, so local expiry is early, never late. A grant
/// handed over from the queue is counted from the call that drew its
/// ticket plus the server time from ticket to token
/// (`acquire::handed_on_at`), early too while the server clock runs
/// steadily.
#[derive(Clone, Debug)]
struct LeaseClock {
    from: Instant,
    len: Duration,
    /// When the answer to the call of `from` came.
    answered: Instant,
    /// Earlier calls that may have run last in Redis though another was
    /// sent after them (see [`LeaseClock::set`]): where each one's lease
    /// ends, and when its answer came (or its call failed).
    caps: Vec<(Instant, Instant)>,
    /// Calls on their way (see [`LeaseClock::sent`]): an id and where the
    /// lease each would set ends.
    in_flight: Vec<(u64, Instant)>,
    next_call: u64,
}

/// How many calls of unknown order a lease clock keeps apart; more are
/// merged into one (the earliest end, the latest answer).
const CAPS_KEPT: usize = 8;

impl LeaseClock {
    fn new(from: Instant, len: Duration, answered: Instant) -> Self {
        Self {
            from,
            len,
            answered,
            caps: Vec::new(),
            in_flight: Vec::new(),
            next_call: 0,
        }
    }

    /// A call to set the lease to `len` was sent at `at`. Redis may run it
    /// before its answer comes (or never comes), so until then its end
    /// caps the deadline too: an `extend` to a shorter lease counts at
    /// once, not once answered (an end beyond the clock's range caps
    /// nothing). Returns the id [`LeaseClock::settled`] takes.
    fn sent(&mut self, at: Instant, len: Duration) -> u64 {
        self.next_call += 1;
        if let Some(end) = at.checked_add(len) {
            self.in_flight.push((self.next_call, end));
        }
        self.next_call
    }

    /// The call `id` was answered or failed (the caller applies what that
    /// means): it no longer caps the deadline as a call on its way.
    fn settled(&mut self, id: u64) {
        self.in_flight.retain(|&(call, _)| call != id);
    }

    /// A call sent at `at` that set the lease to `len` was answered held
    /// at `answered`. Redis ran it after every call whose answer had come
    /// when it was sent, and in either order with those still on their
    /// way: any of those may have run last, leaving its own lease. So:
    /// - the calls answered before `at` ran before this one: they no
    ///   longer cap the deadline;
    /// - a call sent later than the last one replaces the lease; if the
    ///   last one's answer had not come when it was sent, the last one's
    ///   end caps the deadline;
    /// - a call sent earlier (answered after a later one: sent again after
    ///   its connection was lost, or on another connection) caps the
    ///   deadline at its own end;
    /// - a cap only moves the deadline earlier, never later, and the
    ///   length the watchdog renews from stays the last-sent call's (an
    ///   `extend` to a longer lease keeps its length).
    ///
    /// Before, a call's answer only counted if the call was sent last, so
    /// an `extend` to a long lease overtaken in Redis by an older, shorter
    /// renewal left the holder counting on the long one.
    fn set(&mut self, at: Instant, len: Duration, answered: Instant) {
        self.caps.retain(|&(_, cap_answered)| cap_answered > at);
        if at >= self.from {
            if at < self.answered {
                self.cap_at(self.from.checked_add(self.len), self.answered);
            }
            self.from = at;
            self.len = len;
            self.answered = answered;
            return;
        }
        self.cap_at(at.checked_add(len), answered);
    }

    /// A call sent at `at` to set the lease to `len` failed without an
    /// answer (a timeout, a lost connection): it may have run in Redis,
    /// so its end caps the deadline as an earlier call's would, until a
    /// call sent after `failed` is answered; the lease and its length are
    /// left as they were.
    fn may_have_set(&mut self, at: Instant, len: Duration, failed: Instant) {
        self.cap_at(at.checked_add(len), failed);
    }

    /// One more call may have run last, with its lease ending at `end`
    /// (`None`: beyond the clock's range, no cap), answered at `answered`.
    fn cap_at(&mut self, end: Option<Instant>, answered: Instant) {
        let Some(end) = end else {
            return;
        };
        self.caps.push((end, answered));
        if self.caps.len() > CAPS_KEPT {
            let merged = self
                .caps
                .drain(..)
                .reduce(|(end, answered), (e, a)| (end.min(e), answered.max(a)));
            self.caps.extend(merged);
        }
    }

    fn deadline(&self) -> Option<Instant> {
        let capped = self.caps.iter().map(|&(end, _)| end);
        let cap = capped
            .chain(self.in_flight.iter().map(|&(_, end)| end))
            .min();
        match (self.from.checked_add(self.len), cap) {
            (Some(set), Some(cap)) => Some(set.min(cap)),
            (None, cap) => cap,
            (set, None) => set,
        }
    }
}

/// A call setting a grant's lease (an `extend`) on its way. Sent, its end
/// caps the deadline at once (Redis may run it before the answer comes);
/// answered, it sets the lease clock or leaves it as it was; dropped
/// unanswered (the call failed, or its future was dropped) it may have run
/// in Redis, so its end keeps capping the deadline
/// ([`HeldLock::lease_may_have_been_set`]).
pub(crate) struct LeaseCall<'a> {
    held: &'a HeldLock,
    sent: Instant,
    len: Duration,
    /// Its id in the lease clock's calls on their way; `None` once settled.
    id: Option<u64>,
}

impl<'a> LeaseCall<'a> {
    /// A call to set `held`'s lease to `len`, sent now.
    pub(crate) fn start(held: &'a HeldLock, len: Duration) -> Self {
        let sent = Instant::now();
        let mut id = 0;
        held.adjust_lease(|clock| id = clock.sent(sent, len));
        Self {
            held,
            sent,
            len,
            id: Some(id),
        }
    }

    /// Redis answered that the lease was set.
    pub(crate) fn set(mut self) {
        let (at, len) = (self.sent, self.len);
        if let Some(id) = self.id.take() {
            self.held.adjust_lease(|clock| {
                clock.settled(id);
                clock.set(at, len, Instant::now());
            });
        }
    }

    /// Redis answered without setting the lease (not held, wrong type).
    pub(crate) fn refused(mut self) {
        if let Some(id) = self.id.take() {
            self.held.adjust_lease(|clock| clock.settled(id));
        }
    }
}

impl Drop for LeaseCall<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let (at, len) = (self.sent, self.len);
            self.held.adjust_lease(|clock| {
                clock.settled(id);
                clock.may_have_set(at, len, Instant::now());
            });
        }
    }
}

/// What a script's grant told us.
pub(crate) struct Grant {
    pub(crate) token: u64,
    pub(crate) ticket: Option<u64>,
    pub(crate) lease: Lease,
    pub(crate) lease_len: Duration,
    /// When the granting call was sent; for a handoff, when the
    /// releasing script set the lease, as the ticket and token tell it
    /// (see `HeldLock::lease_from`).
    pub(crate) lease_from: Instant,
}

impl HeldLock {
    pub(crate) fn new(
        name: LockName,
        keys: Arc<LockKeys>,
        owner_id: String,
        grant: Grant,
        telemetry: LockTelemetry,
    ) -> Self {
        let granted_at = Instant::now();
        Self {
            name,
            keys,
            owner_id,
            token: grant.token,
            ticket: grant.ticket,
            lease: grant.lease,
            granted_at,
            lease_clock: Mutex::new(LeaseClock::new(
                grant.lease_from,
                grant.lease_len,
                granted_at,
            )),
            lost: watch::Sender::new(false),
            released: AtomicBool::new(false),
            client_closed: AtomicBool::new(false),
            telemetry,
        }
    }

    /// A grant of lock `name` with `lease` (`len` long) set at `from`, for
    /// unit tests.
    #[cfg(test)]
    pub(crate) fn for_test(name: &str, lease: Lease, len: Duration, from: Instant) -> Self {
        let name = LockName::new(name).expect("a valid name");
        let prefix = fairlock_core::KeyPrefix::new("fairlock").expect("a valid prefix");
        let keys = LockKeys::new(&prefix, &name);
        Self::new(
            name,
            Arc::new(keys),
            format!("0123.ab.{}", len.as_millis()),
            Grant {
                token: 1,
                ticket: None,
                lease,
                lease_len: len,
                lease_from: from,
            },
            LockTelemetry::default(),
        )
    }

    /// A renewal or extend that started at `at` set the lease to `len`
    /// (see [`LeaseClock::set`]).
    pub(crate) fn lease_set(&self, at: Instant, len: Duration) {
        self.adjust_lease(|clock| clock.set(at, len, Instant::now()));
    }

    /// An extend that started at `at` to set the lease to `len` failed
    /// without an answer, and may have run (see
    /// [`LeaseClock::may_have_set`]).
    pub(crate) fn lease_may_have_been_set(&self, at: Instant, len: Duration) {
        self.adjust_lease(|clock| clock.may_have_set(at, len, Instant::now()));
    }

    /// Changes the lease clock. A deadline moved earlier wakes whoever
    /// waits on [`Self::lost`], which sleeps until the deadline it last
    /// read.
    fn adjust_lease(&self, change: impl FnOnce(&mut LeaseClock)) {
        let earlier = {
            let mut clock = self.lease_clock();
            let before = clock.deadline();
            change(&mut clock);
            match (clock.deadline(), before) {
                (Some(now), Some(before)) => now < before,
                (Some(_), None) => true,
                (None, _) => false,
            }
        };
        if earlier {
            self.lost.send_modify(|_| {});
        }
    }

    /// When the lease runs out by the local monotonic clock.
    pub(crate) fn lease_deadline(&self) -> Option<Instant> {
        self.lease_clock().deadline()
    }

    /// The lease last set (by the grant, a renewal or `extend`).
    pub(crate) fn current_lease(&self) -> Duration {
        self.lease_clock().len
    }

    /// Since the lease was last set.
    pub(crate) fn since_lease_set(&self) -> Duration {
        self.lease_clock().from.elapsed()
    }

    fn lease_clock(&self) -> MutexGuard<'_, LeaseClock> {
        self.lease_clock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fires the lease-lost signal (once).
    pub(crate) fn mark_lost(&self, why: &str) {
        if self.is_released() {
            return;
        }
        if !self.lost.send_replace(true) {
            if self.client_closed.load(Ordering::SeqCst) {
                tracing::debug!(lock = %self.name, token = self.token, why, "fairlock lease of a shut-down client ran out");
                return;
            }
            self.telemetry.lease_lost();
            tracing::warn!(lock = %self.name, token = self.token, why, "fairlock lease lost");
        }
    }

    /// The client shut down with this grant held (see `client_closed`).
    pub(crate) fn client_closed(&self) {
        self.client_closed.store(true, Ordering::SeqCst);
    }

    /// The release found the lease gone already (it ran out, or the lock
    /// was taken): the lost signal fires and the loss is counted, unless a
    /// check before the release did both.
    pub(crate) fn lost_at_release(&self) {
        if !self.lost.send_replace(true) {
            self.telemetry.lease_lost();
            tracing::warn!(lock = %self.name, token = self.token, "fairlock lease lost: the release found the lock no longer held");
        }
    }

    /// Whether the lease is known lost, by a signal or by the local clock,
    /// or the grant was released from elsewhere (`release_all`): either
    /// way it protects nothing any more.
    pub(crate) fn is_lost(&self) -> bool {
        if *self.lost.borrow() || self.is_released() {
            return true;
        }
        if self
            .lease_deadline()
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            self.mark_lost("the lease ran out by the local clock");
            return *self.lost.borrow();
        }
        false
    }

    /// Resolves when the lease is lost (or the grant released from
    /// elsewhere: see [`Self::is_lost`]).
    pub(crate) async fn lost(&self) {
        let mut rx = self.lost.subscribe();
        // Checked on every wake-up: the signal, a release, or the deadline
        // (which a renewal or extend may have moved). A released grant's
        // deadline is no longer kept, so it must end the wait here rather
        // than wake it again at once, for ever.
        while !self.is_lost() {
            let deadline = self.lease_deadline();
            let expiry = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // The sender lives in `self`: this never ends with an error
                // while `self` is borrowed.
                _ = rx.changed() => {}
                _ = expiry => {}
            }
        }
    }

    /// Marks the grant released; `true` the first time. Wakes whoever
    /// waits on [`Self::lost`]: a released grant protects nothing.
    pub(crate) fn set_released(&self) -> bool {
        let first = !self.released.swap(true, Ordering::SeqCst);
        if first {
            self.lost.send_modify(|_| {});
        }
        first
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// Whether the lost signal fired (not counting a release, which ends
    /// the grant without losing its lease).
    pub(crate) fn lost_signalled(&self) -> bool {
        *self.lost.borrow()
    }
}

/// How long a revocation that came before its grant was taken is kept
/// for that grant, and how many such are kept at most.
const REVOKED_EARLY_FOR: Duration = Duration::from_secs(60);
const REVOKED_EARLY_MAX: usize = 10_000;

/// Every grant this client holds, by owner id.
#[derive(Default)]
pub(crate) struct HeldLocks {
    by_owner_id: Mutex<HashMap<String, Arc<HeldLock>>>,
    /// Grants an administrator force-released before their waiting task
    /// took them (still in the waiter's slot, or on their way to
    /// [`HeldLocks::track`]): owner id → the token revoked (`None`: any)
    /// and when the revocation came. Taken under the held grants' lock,
    /// so a revocation and the grant's tracking cannot miss each other.
    revoked_early: Mutex<HashMap<String, (Option<u64>, Instant)>>,
}

impl HeldLocks {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<HeldLock>>> {
        // Every critical section is one map operation: a poisoned lock is
        // still consistent.
        self.by_owner_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tracks a grant just taken; if an administrator revoked it before
    /// (see [`HeldLocks::revoke`]), it is not tracked and is marked lost.
    /// A revocation of an earlier grant of the same owner id (one that
    /// queued again since) does not count.
    pub(crate) fn track(&self, lock: &Arc<HeldLock>) {
        let mut map = self.map();
        let revoked = self
            .revoked_early
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&lock.owner_id)
            .is_some_and(|(token, _)| token.is_none_or(|token| token == lock.token));
        if revoked {
            drop(map);
            lock.mark_lost("an administrator force-released the lock");
            return;
        }
        map.insert(lock.owner_id.clone(), Arc::clone(lock));
    }

    /// An administrator force-released the grant of `owner_id` with
    /// `token` (`None`: whichever it holds): the held grant, forgotten, to
    /// be marked lost; or, if none is held (its task has not taken it
    /// yet), the revocation is kept for [`HeldLocks::track`] (a minute).
    pub(crate) fn revoke(&self, owner_id: &str, token: Option<u64>) -> Option<Arc<HeldLock>> {
        let mut map = self.map();
        if let Some(held) = map.get(owner_id) {
            if token.is_some_and(|token| token != held.token) {
                // An earlier grant of this owner id, not the one held.
                return None;
            }
            return map.remove(owner_id);
        }
        let mut early = self.revoked_early.lock().unwrap_or_else(|p| p.into_inner());
        early.retain(|_, (_, at)| at.elapsed() < REVOKED_EARLY_FOR);
        if early.len() < REVOKED_EARLY_MAX {
            early.insert(owner_id.to_owned(), (token, Instant::now()));
        }
        drop(map);
        None
    }

    pub(crate) fn forget(&self, owner_id: &str) {
        self.map().remove(owner_id);
    }

    pub(crate) fn get(&self, owner_id: &str) -> Option<Arc<HeldLock>> {
        self.map().get(owner_id).cloned()
    }

    pub(crate) fn contains(&self, owner_id: &str) -> bool {
        self.map().contains_key(owner_id)
    }

    pub(crate) fn all(&self) -> Vec<Arc<HeldLock>> {
        self.map().values().cloned().collect()
    }

    pub(crate) fn watched(&self) -> usize {
        self.map()
            .values()
            .filter(|l| l.lease == Lease::Watchdog)
            .count()
    }

    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }
}

/// What an owner handle has of a lock it asks for again.
pub(crate) enum Reentry {
    /// A good grant, with one more hold taken on it.
    Held(Arc<HeldLock>),
    /// A grant whose lease is lost, now forgotten by the handle: Redis may
    /// still hold it (a lease lost by the local clock), so the caller gives
    /// it back before queueing anew, not behind it.
    Lost(Arc<HeldLock>),
    /// Nothing held.
    NotHeld,
}

/// The holds of one re-entrant owner handle ([`crate::LockOwner`]).
#[derive(Default)]
pub(crate) struct OwnerShared {
    /// Lock name → the grant and how many guards hold it.
    holds: Mutex<HashMap<LockName, (Arc<HeldLock>, usize)>>,
    /// Lock name → serializes acquisitions of that lock through this
    /// handle, so two tasks sharing it never both queue for the same lock.
    /// Pruned when the last acquisition of a name ends.
    acquiring: Mutex<HashMap<LockName, Arc<tokio::sync::Mutex<()>>>>,
}

impl OwnerShared {
    pub(crate) fn holds(&self) -> MutexGuard<'_, HashMap<LockName, (Arc<HeldLock>, usize)>> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes another hold on a grant this owner has, if it is still good;
    /// a grant whose lease is lost is forgotten and handed to the caller
    /// to give back.
    pub(crate) fn reenter(&self, name: &LockName) -> Reentry {
        let mut holds = self.holds();
        let Some((held, count)) = holds.get_mut(name) else {
            return Reentry::NotHeld;
        };
        if held.is_released() {
            holds.remove(name);
            return Reentry::NotHeld;
        }
        if held.is_lost() {
            let lost = Arc::clone(held);
            holds.remove(name);
            return Reentry::Lost(lost);
        }
        *count += 1;
        Reentry::Held(Arc::clone(held))
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

    /// The gate serializing acquisitions of `name` through this handle.
    pub(crate) fn gate(&self, name: &LockName) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.acquiring.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(gates.entry(name.clone()).or_default())
    }

    /// Forgets the gate of `name` once nobody uses it.
    pub(crate) fn prune_gate(&self, name: &LockName, gate: &Arc<tokio::sync::Mutex<()>>) {
        let mut gates = self.acquiring.lock().unwrap_or_else(|p| p.into_inner());
        // Ours and the map's: nobody else is acquiring this name.
        if Arc::strong_count(gate) == 2 {
            gates.remove(name);
        }
    }

    /// How many names have a gate (for tests of the pruning).
    pub(crate) fn gates(&self) -> usize {
        self.acquiring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{HeldLock, LeaseCall, LeaseClock};
    use crate::config::Lease;

    /// Answers out of order: a later call's answer replaces the lease; an
    /// earlier call's answered after it (Redis may have run it last) caps
    /// the deadline where its own lease would end, never later, and leaves
    /// the length the watchdog renews from as the later call set it; a
    /// call sent after that answer lifts the cap.
    #[test]
    fn an_earlier_call_answered_last_moves_the_deadline_only_earlier() {
        let ms = Duration::from_millis;
        // Every call below but the last two was sent before the answers
        // came, which is now.
        let t0 = Instant::now()
            .checked_sub(ms(10_000))
            .expect("an instant in the past");
        let mut clock = LeaseClock::new(t0, ms(30_000), t0);
        // An extend to two minutes, sent at 1 s.
        clock.set(t0 + ms(1_000), ms(120_000), Instant::now());
        assert_eq!(clock.deadline(), Some(t0 + ms(121_000)));
        // A watchdog renewal of 30 s sent at 0.5 s, answered after it.
        clock.set(t0 + ms(500), ms(30_000), Instant::now());
        assert_eq!(
            clock.deadline(),
            Some(t0 + ms(30_500)),
            "an older, shorter renewal answered last left the longer lease"
        );
        assert_eq!(clock.len, ms(120_000), "the extend's length was lost");
        // An older call whose lease would end later changes nothing.
        clock.set(t0 + ms(200), ms(90_000), Instant::now());
        assert_eq!(clock.deadline(), Some(t0 + ms(30_500)));
        // A call sent before that answer came does not lift the cap.
        clock.set(t0 + ms(2_000), ms(120_000), Instant::now());
        assert_eq!(clock.deadline(), Some(t0 + ms(30_500)));
        // One sent after it ran after it in Redis: its lease stands.
        let later = Instant::now() + ms(1);
        clock.set(later, ms(10_000), Instant::now());
        assert_eq!(clock.deadline(), Some(later + ms(10_000)));
        clock.set(later + ms(1_000), ms(60_000), Instant::now());
        assert_eq!(clock.deadline(), Some(later + ms(61_000)));
    }

    /// Answers in the order the calls were sent, but the later call was
    /// sent before the earlier one's answer came: Redis may have run
    /// either last (two connections, whose answers cross on the way
    /// back), so the deadline is the earlier of the two ends until a call
    /// sent after both answers sets the lease again.
    #[test]
    fn calls_in_flight_together_keep_the_earlier_end() {
        let ms = Duration::from_millis;
        let t0 = Instant::now()
            .checked_sub(ms(10_000))
            .expect("an instant in the past");
        let mut clock = LeaseClock::new(t0, ms(30_000), t0);
        // A watchdog renewal of 30 s sent at 0.5 s, answered at 1.5 s.
        clock.set(t0 + ms(500), ms(30_000), t0 + ms(1_500));
        // An extend to two minutes sent at 1 s, before that answer came,
        // answered at 2 s.
        clock.set(t0 + ms(1_000), ms(120_000), t0 + ms(2_000));
        assert_eq!(
            clock.deadline(),
            Some(t0 + ms(30_500)),
            "the renewal may have run last in Redis, yet its shorter lease was dropped"
        );
        assert_eq!(clock.len, ms(120_000), "the extend's length was lost");
        // A call sent at 1.2 s (before the renewal's answer) does not
        // settle it.
        clock.set(t0 + ms(1_200), ms(120_000), t0 + ms(2_200));
        assert_eq!(clock.deadline(), Some(t0 + ms(30_500)));
        // One sent at 1.8 s, after the renewal's answer, ran after it; the
        // extend and the call at 1.2 s may still have run after it.
        clock.set(t0 + ms(1_800), ms(120_000), t0 + ms(2_500));
        assert_eq!(clock.deadline(), Some(t0 + ms(121_000)));
        // One sent after every answer ran after them all.
        clock.set(t0 + ms(3_000), ms(120_000), t0 + ms(3_500));
        assert_eq!(clock.deadline(), Some(t0 + ms(123_000)));
        // Calls one after the other change nothing of the above.
        clock.set(t0 + ms(4_000), ms(60_000), t0 + ms(4_500));
        assert_eq!(clock.deadline(), Some(t0 + ms(64_000)));
    }

    /// Calls that each overlap the one before (two tasks extending one
    /// guard, a renewal beside them) keep only the calls still unordered
    /// as caps: a call sent after another's answer ran after it, so that
    /// one no longer caps the deadline, which moves on with the calls.
    #[test]
    fn a_cap_ends_once_a_call_sent_after_its_answer_is_answered() {
        let ms = Duration::from_millis;
        let t0 = Instant::now()
            .checked_sub(ms(10_000))
            .expect("an instant in the past");
        let lease = ms(30_000);
        let mut clock = LeaseClock::new(t0, lease, t0);
        // (sent, answered): each sent before the previous one's answer.
        for (sent, answered) in [(100, 1_000), (500, 1_500), (1_200, 2_000), (1_800, 2_500)] {
            clock.set(t0 + ms(sent), lease, t0 + ms(answered));
        }
        // Only the call sent at 1.2 s (answered after the last one was
        // sent) and the last one may have run last.
        assert_eq!(
            clock.deadline(),
            Some(t0 + ms(31_200)),
            "the first call's end stayed the deadline though later calls ran after it"
        );
        assert_eq!(clock.caps.len(), 1);
    }

    /// An extend that failed without an answer (a timeout) may have run in
    /// Redis: its shorter lease caps the deadline, the length stays, and a
    /// call sent after the failure, once answered, ends the cap.
    #[test]
    fn an_unanswered_call_caps_the_deadline_at_its_end() {
        let ms = Duration::from_millis;
        let t0 = Instant::now()
            .checked_sub(ms(10_000))
            .expect("an instant in the past");
        let mut clock = LeaseClock::new(t0, ms(60_000), t0);
        clock.may_have_set(t0 + ms(1_000), ms(2_000), t0 + ms(6_000));
        assert_eq!(clock.deadline(), Some(t0 + ms(3_000)));
        assert_eq!(clock.len, ms(60_000));
        // Sent before the failure: it does not end the cap.
        clock.set(t0 + ms(5_000), ms(60_000), t0 + ms(7_000));
        assert_eq!(clock.deadline(), Some(t0 + ms(3_000)));
        clock.set(t0 + ms(7_200), ms(60_000), t0 + ms(7_500));
        assert_eq!(clock.deadline(), Some(t0 + ms(67_200)));
    }

    /// An `extend` to a shorter lease counts from when it is sent: Redis
    /// may run it (and its reply be lost) long before an answer or a
    /// timeout comes. Refused, it no longer counts; answered, its lease
    /// stands.
    #[test]
    fn a_call_on_its_way_caps_the_deadline_until_it_is_answered() {
        let granted = Instant::now();
        let sixty = Duration::from_secs(60);
        let held = HeldLock::for_test("in-flight", Lease::Fixed(sixty), sixty, granted);
        let long = granted + Duration::from_secs(60);
        assert_eq!(held.lease_deadline(), Some(long));
        let call = LeaseCall::start(&held, Duration::from_secs(2));
        let deadline = held.lease_deadline().expect("a deadline");
        assert!(
            deadline <= Instant::now() + Duration::from_secs(2),
            "an extend to 2 s on its way left the 60 s deadline"
        );
        call.refused();
        assert_eq!(
            held.lease_deadline(),
            Some(long),
            "a refused call still counts"
        );
        let call = LeaseCall::start(&held, Duration::from_secs(2));
        call.set();
        assert!(
            held.lease_deadline().expect("a deadline") <= Instant::now() + Duration::from_secs(2)
        );
        assert_eq!(held.current_lease(), Duration::from_secs(2));
    }

    /// A task waiting for the lost signal sleeps until the deadline it
    /// read; a deadline moved earlier (here into the past) wakes it, so the
    /// signal fires when the earlier lease runs out, not at the old
    /// deadline, after Redis let the key go. Checked without a clock: the
    /// woken task has ended by the time this one is scheduled again.
    #[tokio::test]
    async fn a_deadline_moved_earlier_wakes_the_lost_signal() {
        let granted = Instant::now()
            .checked_sub(Duration::from_secs(10))
            .expect("an instant in the past");
        let sixty = Duration::from_secs(60);
        let held = Arc::new(HeldLock::for_test(
            "moved-deadline",
            Lease::Fixed(sixty),
            sixty,
            granted,
        ));
        let waiting = tokio::spawn({
            let held = Arc::clone(&held);
            async move { held.lost().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "lost before the lease ran out");
        // An extend to 2 minutes, then an older call of 200 ms answered:
        // its lease ended 9.8 s ago.
        held.lease_set(
            granted + Duration::from_millis(10),
            Duration::from_secs(120),
        );
        held.lease_set(granted, Duration::from_millis(200));
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        assert!(
            waiting.is_finished(),
            "the lost signal waited for the old deadline"
        );
        assert!(held.is_lost());
    }
}
