//! The waiter heartbeat: one background task per client that keeps the
//! client's queued waiters alive.
//!
//! Every interval it runs `heartbeat.lua` for every lock with waiters here,
//! for all of a lock's waiters at once and for up to [`BATCH`] locks per
//! call (on a Redis Cluster, per slot), so the Redis cost grows with the
//! number of locks waited on, not with the number of waiters, and the cost
//! of a call (a round trip, a script run, a task here) is shared by a batch
//! of locks. The reply is also the safety net of pub/sub: a grant whose
//! message was lost is routed here, a grant nobody waits for any more is
//! handed back, and a waiter found missing from the queue (a fail-over to
//! a replica that missed its enqueue, a purge after a stall, a lost key)
//! re-runs acquire, which keeps the place of those still queued and
//! queues the others again. Cancels
//! that failed are retried here too, and so are releases that failed (as
//! cancels of the released owner id: `release.rs`). On a cluster each slot is a lane of
//! its own (`lanes.rs`): a node that stops answering delays the heartbeat
//! of its own slots only.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use fairlock_core::{HeartbeatBatch, HeartbeatItem, HeartbeatReply, LockKeys};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::error::Error;
use crate::grants::route_grant;
use crate::lanes::Lanes;
use crate::state::ClientState;
use crate::task::{BackgroundTask, ShutdownSignal};
use crate::waiters::LockWaiters;

/// The most locks one heartbeat call covers. A call runs about 8 commands
/// per lock in one script, which holds Redis up for everyone else while it
/// runs (and a lock whose holder vanished may also purge dead waiters):
/// 32 locks keep a call's work near that of one release, while 1,000
/// waited-on locks take 32 calls per interval instead of 1,000.
const BATCH: usize = 32;

/// Starts the heartbeat task.
pub(crate) fn spawn_heartbeat(state: Arc<ClientState>) -> BackgroundTask {
    BackgroundTask::spawn(
        "waiter heartbeat",
        move |mut shutdown: ShutdownSignal| async move {
            let mut ticker = tokio::time::interval(state.config.heartbeat_interval);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut lanes = Lanes::new();
            let renewing = Renewing::default();
            loop {
                tokio::select! {
                    biased;
                    _ = shutdown.requested() => break,
                    // Every ending is taken here (most give `None`), so a
                    // lane a round passed by runs again as soon as it ends.
                    ended = lanes.ended() => {
                        if let Some(lane) = ended {
                            start_round(&state, &mut lanes, &renewing, Some(lane));
                        }
                        continue;
                    }
                    _ = ticker.tick() => {}
                    _ = state.heartbeat_now.notified() => {}
                }
                start_round(&state, &mut lanes, &renewing, None);
            }
            lanes.finish().await;
        },
    )
}

/// Starts one round (see `lanes.rs`): retried cancels, then, per slot on a
/// cluster (all in one lane on a single server), one script call per
/// batch of locks with waiters here and one per permit set; a lane whose
/// previous round still runs is passed by. With `only`, just that lane.
fn start_round(
    state: &Arc<ClientState>,
    lanes: &mut Lanes<u16>,
    renewing: &Renewing,
    only: Option<u16>,
) {
    if only.is_none() {
        for (keys, owner_ids) in state.waiters.take_cancels() {
            let state = Arc::clone(state);
            lanes.spawn_free(async move {
                for owner_id in owner_ids {
                    state.cancel(&keys, &owner_id, false).await;
                }
            });
        }
    }
    let clustered = state.redis.is_clustered();
    let mut by_lane: BTreeMap<u16, Vec<LockWaiters>> = BTreeMap::new();
    for lock in state.waiters.waiting_locks() {
        // One script call may touch one slot only on a cluster.
        let lane = if clustered { lock.keys.slot() } else { 0 };
        if only.is_none_or(|only| only == lane) {
            by_lane.entry(lane).or_default().push(lock);
        }
    }
    for (lane, locks) in by_lane {
        if clustered {
            if let Some(lock) = locks.first() {
                renew_subscription(state, lanes, renewing, Arc::clone(&lock.keys));
            }
        }
        let state = Arc::clone(state);
        lanes.start(lane, async move { beat_lane(&state, locks).await });
    }
}

/// The slots whose sharded subscription is being renewed.
type Renewing = Arc<Mutex<HashSet<u16>>>;

/// On a cluster, renews this process's sharded subscription in the slot of
/// `keys` (a slot migration or fail-over drops it without a word), once
/// per slot waited in, not per lock, and one renewal per slot at a time.
/// Outside the slot's lane: a renewal that cannot reach the node (its
/// grant connection cannot be opened again) tries until the command
/// timeout, and the slot's heartbeat calls, which travel on the command
/// connections, must not wait for it, or its waiters would be taken for
/// dead and passed over.
fn renew_subscription(
    state: &Arc<ClientState>,
    lanes: &mut Lanes<u16>,
    renewing: &Renewing,
    keys: Arc<LockKeys>,
) {
    let slot = keys.slot();
    if !renewing
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(slot)
    {
        return;
    }
    let (state, renewing) = (Arc::clone(state), Arc::clone(renewing));
    lanes.spawn_free(async move {
        if let Err(error) = state.subscribe_slot(&keys, true).await {
            tracing::warn!(slot, %error, "fairlock could not renew its sharded subscription; retrying");
        }
        renewing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&slot);
    });
}

/// One lane's part of a round, its calls run concurrently.
async fn beat_lane(state: &Arc<ClientState>, locks: Vec<LockWaiters>) {
    let mut calls = JoinSet::new();
    // Permit sets have a script of their own and go one by one.
    let mut plain = Vec::with_capacity(locks.len());
    for lock in locks {
        if lock.keys.permit_family().is_some() {
            let state = Arc::clone(state);
            calls.spawn(async move { state.beat_permits(lock).await });
        } else {
            plain.push(lock);
        }
    }
    while !plain.is_empty() {
        let batch: Vec<LockWaiters> = plain.drain(..plain.len().min(BATCH)).collect();
        let state = Arc::clone(state);
        calls.spawn(async move { beat_locks(&state, batch).await });
    }
    while calls.join_next().await.is_some() {}
}

/// One heartbeat call for one lock's waiters here, outside the rounds:
/// after a release that may have handed the lock to one of them without
/// telling it (`release.rs`).
pub(crate) async fn beat_lock(state: &Arc<ClientState>, lock: LockWaiters) {
    beat_locks(state, vec![lock]).await;
}

/// One heartbeat call for `locks` (all in one slot). If the call fails
/// because of one lock's keys (a key of a foreign type), each lock is
/// tried on its own, so one broken lock cannot stop the others' waiters
/// from being kept alive. An owner value another program wrote in place
/// (a string, so the script runs) fails nothing: the reply carries it for
/// its own lock only, as a holder that is nobody here (see
/// [`HeartbeatReply::holder`]). Any other failure (Redis down, a timeout, a
/// reply of the wrong shape) would fail each lock alike: the next round
/// retries the batch.
async fn beat_locks(state: &Arc<ClientState>, locks: Vec<LockWaiters>) {
    match heartbeat_call(state, &locks).await {
        Ok(replies) => {
            for (lock, reply) in locks.iter().zip(replies) {
                after_heartbeat(state, lock, reply);
            }
        }
        // Shutting down: the waiters are ending, nothing failed.
        Err(Error::Closed) => {}
        Err(error) if locks.len() == 1 || !matches!(error, Error::WrongType(_)) => {
            // Waiters stay alive for a whole waiter timeout, several
            // heartbeat intervals.
            tracing::warn!(locks = locks.len(), first = locks.first().map(|l| l.keys.owner()), %error, "fairlock waiter heartbeat failed; the next round retries");
        }
        Err(error) => {
            tracing::debug!(locks = locks.len(), %error, "fairlock batched heartbeat failed; beating each lock on its own");
            for lock in locks {
                match heartbeat_call(state, std::slice::from_ref(&lock)).await {
                    Ok(replies) => {
                        if let Some(reply) = replies.into_iter().next() {
                            after_heartbeat(state, &lock, reply);
                        }
                    }
                    Err(error) => {
                        tracing::warn!(lock = lock.keys.owner(), %error, "fairlock waiter heartbeat failed");
                    }
                }
            }
        }
    }
}

/// Runs `heartbeat.lua` once for `locks` (all in one slot).
async fn heartbeat_call(
    state: &ClientState,
    locks: &[LockWaiters],
) -> crate::error::Result<Vec<HeartbeatReply>> {
    let Some(first) = locks.first() else {
        return Ok(Vec::new());
    };
    let channel_prefix = state.channel_prefix(&first.keys);
    let probes: Vec<Vec<&str>> = locks.iter().map(LockWaiters::probe_refs).collect();
    let batch = HeartbeatBatch {
        tag: &state.tag,
        timings: &state.timings,
        channel_prefix: &channel_prefix,
        items: locks
            .iter()
            .zip(&probes)
            .map(|(lock, probes)| HeartbeatItem {
                keys: &lock.keys,
                probes,
            })
            .collect(),
    };
    state.heartbeat(&batch).await
}

/// Acts on what the heartbeat found for one lock.
fn after_heartbeat(state: &Arc<ClientState>, lock: &LockWaiters, reply: HeartbeatReply) {
    state.after_purge(&lock.keys, reply.purged);
    state.waiters.checked(lock);
    let holder = reply.holder.as_ref().map(|(holder, _)| holder.as_str());
    let lost: Vec<usize> = (0..lock.probes.len())
        .filter(|&i| !reply.queued.get(i) && holder != Some(&*lock.probes[i]))
        .collect();
    if let Some((holder, token)) = reply.holder {
        if state.is_ours(&holder) {
            route_grant(state, &holder, token, true, || Some(Arc::clone(&lock.keys)));
        }
    }
    lock.recheck_lost(&state.waiters, lost);
}
