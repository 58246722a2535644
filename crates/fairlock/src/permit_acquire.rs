//! Acquiring a permit of a semaphore or read-write lock: one script call,
//! then (if queued) a wait for the grant, which arrives already made, as a
//! lock's does: the releasing script made this waiter a holder, with its
//! own lease, before waking it through the process's one grant channel.
//!
//! The wait reuses the lock's machinery: the waiter registry (a grant or a
//! re-check reaches the task through its slot), the process heartbeat (one
//! call per set keeps all of this process's waiters there alive), and the
//! held registry with its watchdog. Cancellation safety is the lock's too:
//! until a grant is taken, dropping the future deregisters the waiter and
//! runs `permit_cancel.lua`, which gives back a grant that raced it.

use std::sync::Arc;
use std::time::Instant;

use fairlock_core::{
    AcquireMode, AcquireReply, LockKeys, LockName, PermitAcquire, PermitRenewBatch,
    PermitRenewItem, PermitRequest, RenewStatus,
};

use crate::acquire::Mode;
use crate::config::{millis, Lease, LockOptions};
use crate::error::{Error, Result};
use crate::held::{Grant, HeldLock};
use crate::state::ClientState;
use crate::telemetry::LockTelemetry;
use crate::waiters::{WaiterEvent, WaiterSlot};

/// Takes a permit of the set `keys` (named `name`) for `request`: the
/// grant, or `None` if `mode` is try and the request does not fit now or
/// someone waits.
pub(crate) async fn acquire_permit(
    state: &Arc<ClientState>,
    name: &str,
    keys: &Arc<LockKeys>,
    request: PermitRequest,
    options: LockOptions,
    mode: Mode,
) -> Result<Option<Arc<HeldLock>>> {
    options.validate()?;
    // Checked when the set's keys were made; the grant keeps it as bytes.
    let lock_name = LockName::new(name)?;
    let telemetry = state.config.metrics_lock_label.labels(name);
    let started = Instant::now();
    let lease_len = match options.lease {
        Lease::Fixed(lease) => lease,
        Lease::Watchdog => state.config.watchdog_lease,
    };
    let member = state.new_permit_member(millis(lease_len), request);
    let mut pending = PendingPermit::new(state, keys, &member, mode, telemetry.clone());
    let deadline = options
        .wait_timeout
        .filter(|_| mode == Mode::Wait)
        .map(|timeout| tokio::time::Instant::from_std(started + timeout));
    let mut ticket = None;
    // Subscribed before the first call that could make a grant for us.
    Box::pin(state.subscribe_slot(keys, false)).await?;
    let channel_prefix = state.channel_prefix(keys);
    let grant = |token, ticket, lease_from| Grant {
        token,
        ticket,
        lease: options.lease,
        lease_len,
        lease_from,
    };

    loop {
        let sent_at = Instant::now();
        let call = PermitAcquire {
            member: &member,
            mode: match mode {
                Mode::Wait => AcquireMode::Wait,
                Mode::Try => AcquireMode::Try,
            },
            timings: &state.timings,
            channel_prefix: &channel_prefix,
        };
        let reply = match state.run(keys, &call).await {
            Ok(reply) => reply,
            Err(error) => {
                telemetry.acquire_ended("error", started);
                return Err(error);
            }
        };
        match reply {
            AcquireReply::Granted { token } => {
                let held = pending.granted(&lock_name, grant(token, ticket, sent_at));
                return Box::pin(replicated_or_given_back(state, held)).await;
            }
            AcquireReply::Busy { purged } => {
                state.after_purge(keys, purged);
                pending.finished();
                telemetry.acquire_ended("busy", started);
                return Ok(None);
            }
            AcquireReply::Queued {
                ticket: queued_with,
                position,
                purged,
            } => {
                state.after_purge(keys, purged);
                if ticket.replace(queued_with).is_none() {
                    telemetry.contended(position, queued_with);
                    tracing::debug!(
                        ticket = queued_with,
                        position,
                        "fairlock waiting for a permit"
                    );
                }
                state.waiters.mark_queued(&member, queued_with);
            }
        }

        let event = tokio::select! {
            event = pending.next_event() => event,
            _ = sleep_until_deadline(deadline) => {
                Box::pin(pending.cancel_now()).await;
                telemetry.acquire_ended("timeout", started);
                return Err(Error::WaitTimeout {
                    name: name.to_owned(),
                    waited: started.elapsed(),
                });
            }
        };
        if let WaiterEvent::Granted { token, confirm } = event {
            let lease_from = Instant::now();
            // With replica acknowledgement on, the waiter writes once (its
            // own lease) so that WAIT on its connection covers the handoff.
            let confirm = confirm || state.config.replica_acks.is_some();
            if confirm && !Box::pin(confirm_lease(state, keys, &member, lease_len)).await? {
                // The short lease of an unheard grant ran out first: ask again.
                telemetry.recheck();
                continue;
            }
            telemetry.handoff();
            return Ok(Some(
                pending.granted(&lock_name, grant(token, ticket, lease_from)),
            ));
        }
        // Recheck: acquire answers a grant whose message was lost, keeps
        // our place, or queues us again.
        telemetry.recheck();
    }
}

/// With replica acknowledgement on, keeps the permit only once enough
/// replicas have it; otherwise gives it back and fails.
async fn replicated_or_given_back(
    state: &Arc<ClientState>,
    held: Arc<HeldLock>,
) -> Result<Option<Arc<HeldLock>>> {
    match state.confirm_replicated().await {
        Ok(()) => Ok(Some(held)),
        Err(error) => {
            if let Err(release_error) = state.release(&held).await {
                tracing::warn!(%release_error, "fairlock could not give back an unreplicated permit; its lease runs out");
            }
            Err(error)
        }
    }
}

/// Sets the waiter's own lease on its permit; `false` if the permit is gone.
async fn confirm_lease(
    state: &ClientState,
    keys: &LockKeys,
    member: &str,
    lease: std::time::Duration,
) -> Result<bool> {
    let batch = PermitRenewBatch {
        items: vec![PermitRenewItem {
            keys,
            member,
            lease_ms: millis(lease),
        }],
    };
    Ok(state.renew_permits(&batch).await?.first() == Some(&RenewStatus::Held))
}

async fn sleep_until_deadline(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A permit request that has not produced a grant yet. Dropping it cancels.
struct PendingPermit<'a> {
    state: &'a Arc<ClientState>,
    keys: &'a Arc<LockKeys>,
    member: &'a str,
    events: Option<Arc<WaiterSlot>>,
    started: Instant,
    telemetry: LockTelemetry,
    done: bool,
}

impl<'a> PendingPermit<'a> {
    fn new(
        state: &'a Arc<ClientState>,
        keys: &'a Arc<LockKeys>,
        member: &'a str,
        mode: Mode,
        telemetry: LockTelemetry,
    ) -> Self {
        // Registered before the first script call: the grant may be
        // published the instant the script queues us.
        let events = (mode == Mode::Wait).then(|| state.waiters.register(member, keys));
        Self {
            state,
            keys,
            member,
            events,
            started: Instant::now(),
            telemetry,
            done: false,
        }
    }

    async fn next_event(&mut self) -> WaiterEvent {
        match self.events.as_ref() {
            Some(slot) => slot.next().await,
            None => std::future::pending().await,
        }
    }

    fn finished(&mut self) {
        self.done = true;
        if self.events.take().is_some() {
            self.state.waiters.deregister(self.member);
        }
    }

    /// The caller holds a permit: tracked before leaving the waiter
    /// registry, so a duplicate grant message is never taken for an orphan.
    fn granted(&mut self, name: &LockName, grant: Grant) -> Arc<HeldLock> {
        let held = Arc::new(HeldLock::new(
            name.clone(),
            Arc::clone(self.keys),
            self.member.to_owned(),
            grant,
            self.telemetry.clone(),
        ));
        self.state.held.track(&held);
        self.finished();
        self.telemetry.acquire_ended("acquired", self.started);
        held
    }

    async fn cancel_now(&mut self) {
        self.finished();
        self.state.cancel(self.keys, self.member).await;
    }
}

impl Drop for PendingPermit<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.finished();
        self.telemetry.acquire_ended("cancelled", self.started);
        let state = Arc::clone(self.state);
        let keys = Arc::clone(self.keys);
        let member = self.member.to_owned();
        self.state
            .spawn(async move { state.cancel(&keys, &member).await });
    }
}
