//! The lease watchdog: one background task per client renewing the leases
//! of all watchdog-kept locks the client holds.
//!
//! Every third of the watchdog lease it runs `renew.lua` once per held
//! lock. A renewal that finds the lock gone or taken fires that guard's
//! lease-lost signal and stops watching it. A failing renewal (Redis down)
//! does not stop the watchdog: it keeps trying, and once a whole lease has
//! passed without a successful renewal the lock may have expired, so the
//! lost signal fires too. A guard leaves the watchdog exactly when it is
//! released or dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use fairlock_core::{Renew, RenewReply};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::client::Core;
use crate::config::{millis, Lease};
use crate::guard::HeldLock;
use crate::telemetry::lease_renewal;

/// Every grant this client holds; the watchdog renews those with a
/// watchdog lease, and `release_all` releases them all.
#[derive(Default)]
pub(crate) struct LeaseWatchdog {
    held: Mutex<HashMap<String, Arc<HeldLock>>>,
}

impl LeaseWatchdog {
    fn held(&self) -> MutexGuard<'_, HashMap<String, Arc<HeldLock>>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tracks a new grant (and renews it, if its lease is watchdog-kept).
    pub(crate) fn track(&self, lock: &Arc<HeldLock>) {
        self.held().insert(lock.member.clone(), Arc::clone(lock));
    }

    /// Forgets the grant of `member`: renewal stops here.
    pub(crate) fn forget(&self, member: &str) {
        self.held().remove(member);
    }

    /// How many leases the watchdog renews.
    pub(crate) fn watched(&self) -> usize {
        self.held()
            .values()
            .filter(|l| l.lease == Lease::Watchdog)
            .count()
    }

    /// Every grant held.
    pub(crate) fn all(&self) -> Vec<Arc<HeldLock>> {
        self.held().values().cloned().collect()
    }

    fn snapshot(&self) -> Vec<Arc<HeldLock>> {
        self.held()
            .values()
            .filter(|l| l.lease == Lease::Watchdog)
            .cloned()
            .collect()
    }
}

/// Runs until the client shuts down (the task is aborted).
pub(crate) async fn run_lease_watchdog(core: Arc<Core>) {
    let mut ticker = tokio::time::interval(core.config.watchdog_lease / 3);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let mut renewals = JoinSet::new();
        for lock in core.watchdog.snapshot() {
            let core = Arc::clone(&core);
            renewals.spawn(async move { renew_once(&core, &lock).await });
        }
        while renewals.join_next().await.is_some() {}
    }
}

async fn renew_once(core: &Core, lock: &Arc<HeldLock>) {
    let started = Instant::now();
    let call = Renew {
        member: &lock.member,
        lease_ms: millis(core.config.watchdog_lease),
    };
    let result = core.redis.run(&lock.keys, &call).await;
    if lock.is_released() {
        // A renewal that raced the guard's release: not a lost lease.
        core.watchdog.forget(&lock.member);
        return;
    }
    match result {
        Ok(RenewReply::Renewed { .. }) => {
            lease_renewal("renewed");
            tracing::trace!(lock = %lock.name, "fairlock lease renewed");
            lock.renewed_at(started);
        }
        Ok(RenewReply::NotOwner) => {
            lease_renewal("lost");
            core.watchdog.forget(&lock.member);
            lock.mark_lost("the watchdog found the lock gone or owned by another");
        }
        Err(error) => {
            lease_renewal("error");
            tracing::warn!(lock = %lock.name, %error, "fairlock lease renewal failed; retrying");
            if lock.renewal_overdue(core.config.watchdog_lease) {
                core.watchdog.forget(&lock.member);
                lock.mark_lost("no renewal succeeded for a whole lease");
            }
        }
    }
}
