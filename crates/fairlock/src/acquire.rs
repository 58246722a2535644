//! Acquiring a lock: one script call, then (if queued) a bounded wait for a
//! grant that arrives by pub/sub, by heartbeat, or by re-running the script.
//!
//! Cancellation safety lives in [`PendingAcquire`]: until a guard exists,
//! dropping the acquire future at any await point deregisters the waiter
//! and runs `cancel.lua`, which removes the queue entry and, if a grant
//! raced the cancellation, hands the lock on at once. Commands of one client
//! travel one pipelined connection in order, so the cancel always runs after
//! any acquire call it races.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use fairlock_core::{Acquire, AcquireMode, AcquireReply, Cancel, LockKeys, Renew, RenewReply};

use crate::client::{Core, LockClient};
use crate::config::{millis, Lease, LockOptions};
use crate::error::{Error, Result};
use crate::guard::{Grant, HeldLock, LockGuard};
use crate::registry::{WaiterEvent, WaiterSlot};
use crate::telemetry::{waiters_evicted, LockTelemetry};

/// Whether the caller waits in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Wait,
    Try,
}

/// The shortest bounded wait: a holder whose lease is about to run out is
/// re-checked no sooner than this, so no loop spins on Redis.
const MIN_RECHECK: Duration = Duration::from_millis(10);
/// The bounded wait of a waiter that is not first in line. Such a waiter
/// cannot be granted by its own re-check; the batched heartbeat grants a
/// lock whose holder vanished and re-delivers lost grants long before this
/// backstop fires, so waiters behind the head cost Redis nothing.
const BACKSTOP_RECHECK: Duration = Duration::from_secs(30);
/// Margin after the holder's lease ends before re-checking.
const RECHECK_MARGIN: Duration = Duration::from_millis(5);

pub(crate) async fn acquire(
    client: &LockClient,
    name: &str,
    options: LockOptions,
    mode: Mode,
) -> Result<Option<LockGuard>> {
    options.validate()?;
    let keys = client.keys(name)?;
    let span = tracing::debug_span!("fairlock.acquire", lock = name, mode = ?mode);
    acquire_validated(client, name, keys, options, mode)
        .instrument(span)
        .await
}

async fn acquire_validated(
    client: &LockClient,
    name: &str,
    keys: Arc<LockKeys>,
    options: LockOptions,
    mode: Mode,
) -> Result<Option<LockGuard>> {
    let core = client.core();
    let telemetry = core.config.metrics_lock_label.labels(name);
    let started = Instant::now();
    let lease_ms = match options.lease {
        Lease::Fixed(lease) => millis(lease),
        Lease::Watchdog => millis(core.config.watchdog_lease),
    };
    let member = core.new_member();
    let mut pending = PendingAcquire::new(client, &keys, &member, mode, telemetry.clone());
    let deadline = options
        .wait_timeout
        .filter(|_| mode == Mode::Wait)
        .map(|timeout| tokio::time::Instant::from_std(started + timeout));
    let mut ticket = None;

    loop {
        let sent_at = Instant::now();
        let call = Acquire {
            member: &member,
            lease_ms,
            mode: match mode {
                Mode::Wait => AcquireMode::Wait,
                Mode::Try => AcquireMode::Try,
            },
            timings: &core.timings,
            channel_prefix: &core.channel_prefix,
        };
        let reply = match core.run(&keys, &call).await {
            Ok(reply) => reply,
            Err(error) => {
                telemetry.acquire_ended("error", started);
                return Err(error);
            }
        };
        let (position, owner_pttl_ms) = match reply {
            AcquireReply::Granted { token, evicted } => {
                waiters_evicted(evicted);
                let held = pending.granted(name, token, ticket, options.lease, sent_at);
                return Ok(Some(LockGuard::new(client.clone(), held)));
            }
            AcquireReply::Busy { evicted, .. } => {
                waiters_evicted(evicted);
                pending.finished();
                telemetry.acquire_ended("busy", started);
                return Ok(None);
            }
            AcquireReply::Queued {
                ticket: queued_with,
                position,
                owner_pttl_ms,
                evicted,
            } => {
                waiters_evicted(evicted);
                if ticket.replace(queued_with).is_none() {
                    telemetry.contended(position);
                    tracing::debug!(
                        ticket = queued_with,
                        position,
                        "fairlock waiting in the queue"
                    );
                }
                core.registry.mark_queued(&member);
                (position, owner_pttl_ms)
            }
        };

        // Bounded wait. First in line: the holder's remaining lease, after
        // which its expiry lets the script grant us at once. Behind it: the
        // backstop (see BACKSTOP_RECHECK).
        let until_expiry = u64::try_from(owner_pttl_ms)
            .map(|ms| Duration::from_millis(ms) + RECHECK_MARGIN)
            .unwrap_or(core.config.heartbeat_interval);
        let recheck = if position == 0 {
            until_expiry.clamp(MIN_RECHECK, BACKSTOP_RECHECK)
        } else {
            BACKSTOP_RECHECK.max(until_expiry)
        };
        let event = tokio::select! {
            event = pending.next_event() => event,
            _ = tokio::time::sleep(recheck) => {
                telemetry.recheck();
                continue;
            }
            _ = sleep_until_deadline(deadline) => {
                pending.cancel_now().await;
                telemetry.acquire_ended("timeout", started);
                return Err(Error::WaitTimeout {
                    name: name.to_owned(),
                    waited: started.elapsed(),
                });
            }
        };
        if let Some(WaiterEvent::Granted { token }) = event {
            telemetry.handoff();
            tracing::debug!(token, "fairlock lock handed on to this waiter");
            // The grant was made moments ago, by someone else's release; its
            // lease (the short grant lease until confirmed) runs from about now.
            let held = pending.granted(name, token, ticket, options.lease, Instant::now());
            confirm_lease(client, &held, lease_ms);
            return Ok(Some(LockGuard::new(client.clone(), held)));
        }
        // Recheck: we are no longer queued (evicted after a stall, or the
        // queue was lost in a failover); the script re-enqueues us.
    }
}

async fn sleep_until_deadline(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A handed-on grant carries the short grant lease; set the holder's own
/// lease right away, in the background so the woken task starts at once.
fn confirm_lease(client: &LockClient, held: &Arc<HeldLock>, lease_ms: u64) {
    let task_client = client.clone();
    let held = Arc::clone(held);
    client.spawn(async move {
        let call = Renew {
            member: &held.member,
            lease_ms,
        };
        let sent_at = Instant::now();
        match task_client.core().run(&held.keys, &call).await {
            Ok(RenewReply::Renewed { .. }) => held.renewed_at(sent_at),
            Ok(RenewReply::NotOwner) if !held.is_released() => {
                held.mark_lost("the handed-on grant expired before it was confirmed");
            }
            Ok(RenewReply::NotOwner) => {}
            Err(error) => tracing::warn!(lock = %held.name, %error, "fairlock could not confirm a handed-on lease; the watchdog retries"),
        }
    });
}

/// An acquire that has not produced a guard yet. Dropping it cancels.
struct PendingAcquire<'a> {
    client: &'a LockClient,
    keys: &'a Arc<LockKeys>,
    member: &'a str,
    events: Option<Arc<WaiterSlot>>,
    started: Instant,
    telemetry: LockTelemetry,
    done: bool,
}

impl<'a> PendingAcquire<'a> {
    fn new(
        client: &'a LockClient,
        keys: &'a Arc<LockKeys>,
        member: &'a str,
        mode: Mode,
        telemetry: LockTelemetry,
    ) -> Self {
        // Register before the first script call: the grant may be published
        // the instant the script queues us.
        let events = (mode == Mode::Wait).then(|| client.core().registry.register(member, keys));
        Self {
            client,
            keys,
            member,
            events,
            started: Instant::now(),
            telemetry,
            done: false,
        }
    }

    async fn next_event(&mut self) -> Option<WaiterEvent> {
        match self.events.as_ref() {
            Some(slot) => Some(slot.next().await),
            None => std::future::pending().await,
        }
    }

    /// Ends the pending state without cancelling.
    fn finished(&mut self) {
        self.done = true;
        if self.events.take().is_some() {
            self.client.core().registry.deregister(self.member);
        }
    }

    /// The caller owns the lock: build the grant and hand it to the
    /// watchdog if the lease is watchdog-kept.
    fn granted(
        &mut self,
        name: &str,
        token: u64,
        ticket: Option<u64>,
        lease: Lease,
        sent_at: Instant,
    ) -> Arc<HeldLock> {
        self.finished();
        self.telemetry.acquire_ended("acquired", self.started);
        let held = Arc::new(HeldLock::new(
            name.to_owned(),
            Arc::clone(self.keys),
            self.member.to_owned(),
            Grant {
                token,
                ticket,
                lease,
                requested_at: sent_at,
            },
            self.telemetry.clone(),
        ));
        tracing::debug!(token, ?ticket, waited = ?self.started.elapsed(), "fairlock lock granted");
        self.client.core().watchdog.track(&held);
        held
    }

    /// Leaves the queue now (wait timeout), passing on a raced grant.
    async fn cancel_now(&mut self) {
        self.finished();
        if let Err(error) = run_cancel(self.client.core(), self.keys, self.member).await {
            tracing::warn!(%error, "fairlock could not leave the queue; the waiter entry expires with its heartbeat deadline");
        }
    }
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.finished();
        self.telemetry.acquire_ended("cancelled", self.started);
        let client = self.client.clone();
        let keys = Arc::clone(self.keys);
        let member = self.member.to_owned();
        self.client.spawn(async move {
            if let Err(error) = run_cancel(client.core(), &keys, &member).await {
                tracing::warn!(%error, "fairlock could not clean up a cancelled acquire; its entry expires with its heartbeat deadline");
            }
        });
    }
}

async fn run_cancel(core: &Core, keys: &LockKeys, member: &str) -> Result<()> {
    let reply = core
        .run(
            keys,
            &Cancel {
                member,
                timings: &core.timings,
                channel_prefix: &core.channel_prefix,
            },
        )
        .await?;
    waiters_evicted(reply.evicted);
    Ok(())
}
