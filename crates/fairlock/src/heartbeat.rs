//! The waiter heartbeat: one background task per client that keeps the
//! client's queued waiters alive.
//!
//! Every interval it runs `heartbeat.lua` once per lock with waiters here,
//! for all of them at once, so the Redis cost is per lock, not per waiter.
//! The reply is also the safety net of pub/sub: a waiter that owns the lock
//! but missed its message is woken here, and a waiter missing from the
//! queue (evicted after a stall, or lost in a failover) re-enqueues.

use std::sync::Arc;

use fairlock_core::{Heartbeat, WaiterStatus};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::client::Core;
use crate::registry::WaiterEvent;
use crate::telemetry::waiters_evicted;

/// Runs until the client shuts down (the task is aborted).
pub(crate) async fn run_waiter_heartbeat(core: Arc<Core>) {
    let mut ticker = tokio::time::interval(core.config.heartbeat_interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = core.heartbeat_now.notified() => {}
        }
        beat(&core).await;
    }
}

/// One round: a script call per lock with waiters, run concurrently.
async fn beat(core: &Arc<Core>) {
    let mut calls = JoinSet::new();
    for (keys, members) in core.registry.waiting_locks() {
        let core = Arc::clone(core);
        calls.spawn(async move {
            let call = Heartbeat {
                members: &members,
                timings: &core.timings,
                channel_prefix: &core.channel_prefix,
            };
            match core.redis.run(&keys, &call).await {
                Ok(reply) => {
                    waiters_evicted(reply.evicted);
                    for (member, status) in members.iter().zip(reply.statuses) {
                        let event = match status {
                            WaiterStatus::Queued => continue,
                            WaiterStatus::Granted { token } => WaiterEvent::Granted { token },
                            WaiterStatus::Missing => WaiterEvent::Recheck,
                        };
                        core.registry.deliver(member, event);
                    }
                }
                // The next round retries; waiters stay alive for a whole
                // waiter timeout, several heartbeat intervals.
                Err(error) => {
                    tracing::warn!(lock = keys.owner(), %error, "fairlock waiter heartbeat failed")
                }
            }
        });
    }
    while calls.join_next().await.is_some() {}
}
