//! The lease watchdog: one background task per client that keeps watch
//! over every grant the client holds.
//!
//! Every heartbeat interval it runs `renew.lua` once for all held locks
//! together (on a Redis Cluster, once per slot: one call per client per
//! interval per slot, not one per lock): watchdog-kept leases that are a third used up are renewed, all
//! others are checked. A lock found gone or taken fires its guard's
//! lease-lost signal, whether its lease is watchdog-kept or fixed, so a
//! holder learns of an expiry, a forced release or a vanished key within
//! one interval. A failing call (Redis down) does not stop the watchdog:
//! it keeps trying, and once a lease has run out by the local clock
//! without a successful renewal, the lost signal fires too. A guard leaves
//! the watchdog exactly when it is released or dropped. On a cluster each
//! slot is a lane of its own (`lanes.rs`): a node that stops answering
//! delays the renewals of its own slots only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock_core::{PermitRenewBatch, PermitRenewItem, RenewBatch, RenewItem, RenewStatus};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::config::{millis, Lease};
use crate::error::Error;
use crate::held::HeldLock;
use crate::lanes::Lanes;
use crate::state::ClientState;
use crate::task::{BackgroundTask, ShutdownSignal};
use crate::telemetry::lease_renewals;

/// The most locks one renew call covers; more make several calls.
const BATCH: usize = 1_000;

/// A watchdog lane: the slot (0 on a single server) and whether its locks
/// are permits (they renew through a script of their own).
type Lane = (u16, bool);

/// Starts the watchdog task.
pub(crate) fn spawn_watchdog(state: Arc<ClientState>) -> BackgroundTask {
    BackgroundTask::spawn(
        "lease watchdog",
        move |mut shutdown: ShutdownSignal| async move {
            let mut ticker = tokio::time::interval(watch_interval(&state));
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            ticker.tick().await;
            let mut lanes = Lanes::new();
            loop {
                tokio::select! {
                    biased;
                    _ = shutdown.requested() => break,
                    // Every ending is taken here (most give `None`), so a
                    // lane a round passed by runs again as soon as it ends.
                    ended = lanes.ended() => {
                        if let Some(lane) = ended {
                            watch_round(&state, &mut lanes, Some(lane));
                        }
                        continue;
                    }
                    _ = ticker.tick() => {}
                }
                watch_round(&state, &mut lanes, None);
            }
            lanes.finish().await;
        },
    )
}

/// Starts a round (with `only`, for that lane only): one renew call per
/// slot and kind of lock, per [`BATCH`] locks, on each lane that is not
/// still busy with an earlier round (`lanes.rs`), so a node that stops
/// answering holds up the leases of its own slots only.
fn watch_round(state: &Arc<ClientState>, lanes: &mut Lanes<Lane>, only: Option<Lane>) {
    // One script call may touch keys of one slot only on a cluster; a
    // single server takes them all in one call.
    let clustered = state.redis.is_clustered();
    let mut by_lane: BTreeMap<Lane, Vec<Arc<HeldLock>>> = BTreeMap::new();
    for lock in state.held.all() {
        if lock.is_released() {
            // Its release is on its way and forgets it when done.
            continue;
        }
        let slot = if clustered { lock.keys.slot() } else { 0 };
        let lane = (slot, lock.keys.permit_family().is_some());
        if only.is_none_or(|only| only == lane) {
            by_lane.entry(lane).or_default().push(lock);
        }
    }
    for (lane, locks) in by_lane {
        let state = Arc::clone(state);
        lanes.start(lane, async move {
            let mut calls = JoinSet::new();
            for chunk in locks.chunks(BATCH) {
                let state = Arc::clone(&state);
                let chunk = chunk.to_vec();
                calls.spawn(async move { renew_batch(&state, chunk).await });
            }
            while calls.join_next().await.is_some() {}
        });
    }
}

/// How often the watchdog looks at the held locks: every heartbeat
/// interval, and at least three times per watchdog lease.
fn watch_interval(state: &ClientState) -> Duration {
    state
        .config
        .heartbeat_interval
        .min(state.config.watchdog_lease / 3)
}

/// The lease to set now for `lock`, or 0 to only check it. A watchdog
/// lease is renewed once about a third of it has passed; one that `extend`
/// set counts too: a shorter one is renewed before it runs out (and then
/// gets the watchdog lease back), a longer one keeps its length. A
/// deadline moved earlier than the last call's lease (calls whose order in
/// Redis is not known, `held.rs`) is renewed as if that much of the lease
/// had passed.
fn renewal_due(lock: &HeldLock, watchdog_lease: Duration, interval: Duration) -> u64 {
    let current = lock.current_lease();
    let lease = current.min(watchdog_lease);
    let used_by_deadline = || {
        lock.lease_deadline().is_some_and(|deadline| {
            let left = deadline.saturating_duration_since(Instant::now());
            third_passed(lease.saturating_sub(left), lease, interval)
        })
    };
    match lock.lease {
        // A lost one's holder was told to stop: never extended again.
        Lease::Watchdog
            if !lock.is_lost()
                && (third_passed(lock.since_lease_set(), lease, interval)
                    || used_by_deadline()) =>
        {
            millis(current.max(watchdog_lease))
        }
        _ => 0,
    }
}

/// Whether the watchdog round now, `since` after a lease of `lease` was
/// set, is the one nearest to a third of it, rounds `interval` apart: a
/// round less than half an interval before the third renews. With the
/// third itself as the bound, a round falling just before it (as they do
/// when the interval is the third of the lease) left the renewal to the
/// next, at two thirds of the lease.
fn third_passed(since: Duration, lease: Duration, interval: Duration) -> bool {
    since + interval / 2 >= lease / 3
}

async fn renew_batch(state: &Arc<ClientState>, locks: Vec<Arc<HeldLock>>) {
    let started = Instant::now();
    let (watchdog_lease, interval) = (state.config.watchdog_lease, watch_interval(state));
    let leases: Vec<u64> = locks
        .iter()
        .map(|lock| renewal_due(lock, watchdog_lease, interval))
        .collect();
    let mark = state.replication_mark();
    let renewed = if locks
        .first()
        .is_some_and(|lock| lock.keys.permit_family().is_some())
    {
        let batch = PermitRenewBatch {
            items: locks
                .iter()
                .zip(&leases)
                .map(|(lock, &lease_ms)| PermitRenewItem {
                    keys: &lock.keys,
                    owner_id: &lock.owner_id,
                    lease_ms,
                    token: None,
                })
                .collect(),
        };
        state.renew_permits(&batch).await
    } else {
        let batch = RenewBatch {
            items: locks
                .iter()
                .zip(&leases)
                .map(|(lock, &lease_ms)| RenewItem {
                    owner_key: lock.keys.owner(),
                    owner_id: &lock.owner_id,
                    lease_ms,
                    token: None,
                })
                .collect(),
        };
        state.renew(&batch).await
    };
    let result = match renewed {
        // A renewal enough replicas do not have may be lost in a fail-over.
        Ok(statuses) if leases.iter().any(|&l| l > 0) => {
            state.confirm_replicated(mark).await.map(|()| statuses)
        }
        other => other,
    };
    match result {
        Ok(statuses) => {
            for ((lock, lease_ms), status) in locks.iter().zip(leases).zip(statuses) {
                if lock.is_released() {
                    // A check that raced the guard's release: not a loss.
                    continue;
                }
                match status {
                    RenewStatus::Held
                        if matches!(lock.lease, Lease::Watchdog) && lock.is_lost() =>
                    {
                        // Lost by the local clock (a renewal answered after
                        // the lease it was to extend had run out here): the
                        // holder was told to stop, so the lock is renewed no
                        // more and Redis lets it go when its lease ends.
                        state.held.forget(&lock.owner_id);
                    }
                    RenewStatus::Held if lease_ms > 0 => {
                        lease_renewals("renewed", 1);
                        lock.lease_set(started, Duration::from_millis(lease_ms));
                    }
                    RenewStatus::Held => {}
                    RenewStatus::Lost | RenewStatus::WrongType => {
                        // Only the watchdog's own locks count as renewals
                        // (a fixed lease's loss is in lease_lost_total).
                        if matches!(lock.lease, Lease::Watchdog) {
                            lease_renewals("lost", 1);
                        }
                        state.held.forget(&lock.owner_id);
                        lock.mark_lost("the lock is gone or owned by another");
                    }
                }
            }
        }
        Err(error @ Error::NotReplicated { .. }) => {
            let renewing = leases.iter().filter(|&&l| l > 0).count();
            lease_renewals("unreplicated", renewing);
            for (lock, lease_ms) in locks.iter().zip(leases) {
                if lease_ms > 0 && !lock.is_released() {
                    state.held.forget(&lock.owner_id);
                    lock.mark_lost(&format!("a renewal was not replicated: {error}"));
                }
            }
        }
        // The client is shutting down (`shutdown()` waits for work in
        // flight while this task still runs): nothing failed, and the
        // leases end with the client.
        Err(Error::Closed) => {}
        Err(error) => {
            // One failed renewal per watchdog lock the call was for.
            let watched = locks
                .iter()
                .filter(|lock| matches!(lock.lease, Lease::Watchdog))
                .count();
            lease_renewals("error", watched);
            tracing::warn!(%error, locks = locks.len(), "fairlock lease check failed; retrying");
            may_have_renewed(&locks, &leases, started);
            for lock in &locks {
                // Fires once the lease has run out by the local clock. A
                // released grant stays tracked until its release has run.
                if !lock.is_released() && lock.is_lost() {
                    state.held.forget(&lock.owner_id);
                }
            }
        }
    }
}

/// A renewal call sent at `started` failed: it may still have run (a
/// timeout, a lost reply), maybe after an `extend` to a longer lease
/// answered meanwhile, so each lock's lease may end at the renewal's end.
fn may_have_renewed(locks: &[Arc<HeldLock>], leases: &[u64], started: Instant) {
    for (lock, &lease_ms) in locks.iter().zip(leases) {
        if lease_ms > 0 {
            lock.lease_may_have_been_set(started, Duration::from_millis(lease_ms));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use std::sync::Arc;

    use super::{may_have_renewed, renewal_due, third_passed};
    use crate::config::Lease;
    use crate::held::HeldLock;

    /// A renewal that failed may still run in Redis after an `extend` to
    /// a longer lease answered meanwhile: the lock's deadline is capped at
    /// the renewal's end, while a lock the call only checked (lease 0) keeps its deadline. Before the
    /// cap, a failed renewal left the extend's 60 s deadline standing.
    #[test]
    fn a_failed_renewal_caps_the_deadline_at_its_end() {
        let watchdog_lease = Duration::from_secs(3);
        let granted = Instant::now();
        let renewed = Arc::new(HeldLock::for_test(
            "renewed",
            Lease::Watchdog,
            watchdog_lease,
            granted,
        ));
        let checked = Arc::new(HeldLock::for_test(
            "checked",
            Lease::Watchdog,
            watchdog_lease,
            granted,
        ));
        let started = Instant::now();
        // An extend to 60 s, sent and answered while the renewal waited.
        for lock in [&renewed, &checked] {
            lock.lease_set(Instant::now(), Duration::from_secs(60));
        }
        may_have_renewed(
            &[Arc::clone(&renewed), Arc::clone(&checked)],
            &[3_000, 0],
            started,
        );
        let deadline = renewed.lease_deadline().expect("a deadline");
        assert!(
            deadline <= started + watchdog_lease,
            "the failed 3 s renewal may run last, yet the deadline stayed {:?} after it was sent",
            deadline - started
        );
        let kept = checked.lease_deadline().expect("a deadline");
        assert!(
            kept > started + Duration::from_secs(50),
            "a check capped the deadline"
        );
    }

    /// A watchdog lease whose deadline was moved earlier (an older, short
    /// `extend` may have run last in Redis) is renewed when that earlier
    /// end nears, not only a third of a lease after the last call sent.
    #[test]
    fn a_deadline_moved_earlier_is_renewed_before_it() {
        let lease = Duration::from_secs(30);
        let granted = Instant::now();
        let lock = HeldLock::for_test("capped", Lease::Watchdog, lease, granted);
        let second = Duration::from_secs(1);
        assert_eq!(renewal_due(&lock, lease, second), 0, "renewed at once");
        // An extend to 2 s, sent before the grant's lease was set and
        // answered now: its lease ends in under 2 s.
        let sent = granted
            .checked_sub(Duration::from_millis(100))
            .expect("an instant in the past");
        lock.lease_set(sent, Duration::from_secs(2));
        assert!(!lock.is_lost());
        assert_eq!(
            renewal_due(&lock, lease, second),
            30_000,
            "the watchdog waited for a third of the 30 s lease though it may end in 2 s"
        );
    }

    /// A lease renewed every third: with rounds a third of the lease
    /// apart (a 3 s lease, 1 s rounds), the round that falls just before
    /// the third renews, not the one after it at two thirds; with rounds
    /// far apart from the third (a 30 s lease, 1 s rounds) the renewal
    /// comes within half a round of it.
    #[test]
    fn the_round_nearest_a_third_of_the_lease_renews() {
        let ms = Duration::from_millis;
        let second = Duration::from_secs(1);
        assert!(third_passed(ms(990), ms(3_000), second));
        assert!(!third_passed(ms(400), ms(3_000), second));
        assert!(!third_passed(ms(9_400), ms(30_000), second));
        assert!(third_passed(ms(9_600), ms(30_000), second));
    }
}
