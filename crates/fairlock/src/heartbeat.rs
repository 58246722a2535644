//! The waiter heartbeat: one background task per client that keeps the
//! client's queued waiters alive.
//!
//! Every interval it runs `heartbeat.lua` once per lock with waiters here,
//! for all of them at once, so the Redis cost grows with the number of
//! locks waited on, not with the number of waiters. The reply is also the
//! safety net of pub/sub: a grant whose message was lost is routed here, a
//! grant nobody waits for any more is handed back, and when the oldest
//! waiter is missing from the queue (evicted after a stall, or the queue
//! was lost) every waiter of that lock re-runs acquire, which keeps the
//! place of those still queued. Cancels that failed are retried here too.

use std::collections::BTreeMap;
use std::sync::Arc;

use fairlock_core::Heartbeat;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::grants::route_grant;
use crate::state::ClientState;
use crate::task::{BackgroundTask, ShutdownSignal};
use crate::waiters::LockWaiters;

/// Starts the heartbeat task.
pub(crate) fn spawn_heartbeat(state: Arc<ClientState>) -> BackgroundTask {
    BackgroundTask::spawn(
        "waiter heartbeat",
        move |mut shutdown: ShutdownSignal| async move {
            let mut ticker = tokio::time::interval(state.config.heartbeat_interval);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.requested() => return,
                    _ = ticker.tick() => {}
                    _ = state.heartbeat_now.notified() => {}
                }
                beat(&state).await;
            }
        },
    )
}

/// One round: retried cancels, then a script call per lock with waiters
/// here, run concurrently.
async fn beat(state: &Arc<ClientState>) {
    let mut calls = JoinSet::new();
    for (keys, owner_ids) in state.waiters.take_cancels() {
        let state = Arc::clone(state);
        calls.spawn(async move {
            for owner_id in owner_ids {
                state.cancel(&keys, &owner_id).await;
            }
        });
    }
    let locks = state.waiters.waiting_locks();
    if state.redis.is_clustered() {
        // A slot migration or fail-over drops sharded subscriptions without
        // a word: renew ours, once per slot we wait in (not per lock).
        let mut slots = BTreeMap::new();
        for lock in &locks {
            slots
                .entry(lock.keys.slot())
                .or_insert_with(|| Arc::clone(&lock.keys));
        }
        for keys in slots.into_values() {
            let state = Arc::clone(state);
            calls.spawn(async move {
                if let Err(error) = state.subscribe_slot(&keys, true).await {
                    tracing::warn!(slot = keys.slot(), %error, "fairlock could not renew its sharded subscription; retrying");
                }
            });
        }
    }
    for lock in locks {
        let state = Arc::clone(state);
        calls.spawn(async move { beat_lock(&state, lock).await });
    }
    while calls.join_next().await.is_some() {}
}

async fn beat_lock(state: &Arc<ClientState>, lock: LockWaiters) {
    if lock.keys.permit_family().is_some() {
        // A semaphore or read-write lock: its own script, same cadence.
        return state.beat_permits(lock).await;
    }
    let channel_prefix = state.channel_prefix(&lock.keys);
    let call = Heartbeat {
        tag: &state.tag,
        probe: &lock.probe,
        timings: &state.timings,
        channel_prefix: &channel_prefix,
    };
    match state.run(&lock.keys, &call).await {
        Ok(reply) => {
            state.after_purge(&lock.keys, reply.purged);
            let probe_holds = reply
                .holder
                .as_ref()
                .is_some_and(|(holder, _)| *holder == lock.probe);
            if let Some((holder, token)) = reply.holder {
                if state.is_ours(&holder) {
                    route_grant(state, &holder, token, true, || Some(Arc::clone(&lock.keys)));
                }
            }
            // The probe left the queue. Usually it was granted while this
            // call was on its way (it holds the lock, or held it and has
            // left the registry): nothing is wrong. Only a probe that still
            // waits here without a place means the queue lost entries, and
            // then every waiter of the lock checks its place. Rechecking on
            // every grant instead cost one script per waiter per heartbeat
            // while a long queue drained.
            if !reply.probe_queued && !probe_holds && state.waiters.is_waiting(&lock.probe) {
                state.waiters.recheck_lock(lock.keys.owner());
            }
        }
        // The next round retries; waiters stay alive for a whole waiter
        // timeout, several heartbeat intervals.
        Err(error) => {
            tracing::warn!(lock = lock.keys.owner(), %error, "fairlock waiter heartbeat failed")
        }
    }
}
