//! The shared operations of permit sets (the fair semaphore and the fair
//! read-write lock), as an extension of [`ClientState`].
//!
//! A permit set's keys travel in a `LockKeys` value like a lock's (see
//! `fairlock_core::LockKeys::permits`), so the waiter registry, the grant
//! router, the heartbeat and the watchdog carry them unchanged. Where the
//! scripts differ, the shared operations of `state.rs` ask
//! `keys.permit_family()` and come here: releasing (and handing back an
//! orphaned grant), cancelling a wait, going on purging, the heartbeat of
//! one set, and the batched lease renewal. Nothing here touches a lock's
//! keys or scripts.

use std::sync::Arc;

use fairlock_core::{
    LockKeys, PermitCancel, PermitHeartbeat, PermitOwnerId, PermitRelease, PermitReleaseReply,
    PermitRenewBatch, PermitRequest, Purged, RenewStatus,
};

use crate::error::{Error, Result};
use crate::redis::{Lane, Order, Via};
use crate::state::ClientState;
use crate::waiters::{LockWaiters, WaiterEvent, Woke};

impl ClientState {
    /// A new permit owner id: a random 128-bit nonce, this process's tag,
    /// the lease it asks for and its request.
    /// `request` was checked (1 to `MAX_PERMITS` for a share) before.
    pub(crate) fn new_permit_owner_id(
        &self,
        lease_ms: u64,
        request: PermitRequest,
    ) -> Result<String> {
        PermitOwnerId::new(
            &uuid::Uuid::new_v4().simple().to_string(),
            &self.tag,
            lease_ms,
            request,
        )
        .map(|owner_id| owner_id.as_str().to_owned())
        .map_err(|invalid| Error::InvalidOptions(invalid.to_string()))
    }

    /// How long a permit set remembers a release of this process, so that
    /// the same release sent again answers released: four command
    /// timeouts. A resend comes within that: the call layer and fred send
    /// a call again within the command timeout, a release whose caller
    /// stopped waiting is sent again at once in a cleanup task, and with
    /// `replica_acks` a release is sent again after its `WAIT` (at most
    /// half a command timeout, plus one). At least 1 s, and no longer than
    /// an idle set keeps its keys.
    fn release_memory_ms(&self) -> u64 {
        u64::try_from(self.config.command_timeout.as_millis().saturating_mul(4))
            .unwrap_or(u64::MAX)
            .max(1_000)
            .min(self.timings.idle_ms())
    }

    /// Gives back the permit of `owner_id`, waking at once the waiters of
    /// this process that the release granted. A resend of a release that
    /// ran answers released too.
    pub(crate) async fn release_permit(
        self: &Arc<Self>,
        name: &str,
        keys: &Arc<LockKeys>,
        owner_id: &str,
    ) -> Result<Woke> {
        let call = PermitRelease {
            owner_id,
            timings: &self.timings,
            channel_prefix: &self.channel_prefix(keys),
            remember_ms: self.release_memory_ms(),
        };
        // On the holders' script socket if it owes no reply, as a lock's
        // release.
        let via = Via::Socket(Order::IfClear, None);
        match self
            .run_while_closing_via(Lane::Holders, via, keys, &call)
            .await?
        {
            PermitReleaseReply::Released { granted, purged } => {
                self.after_purge(keys, purged);
                let mut woke = Woke::NobodyHere;
                for next in &granted {
                    // Their messages still arrive and are then ignored.
                    if self.waiters.deliver_handoff(next) {
                        woke = Woke::Here;
                    }
                }
                Ok(woke)
            }
            PermitReleaseReply::NotHolder { purged } => {
                // Refused, yet permits freed by leases that ran out went
                // on, maybe past dead waiters.
                self.after_purge(keys, purged);
                Err(Error::NotOwner {
                    name: name.to_owned(),
                })
            }
        }
    }

    /// Runs `permit_cancel.lua` for `owner_id` on the waiters' lane `via`
    /// fred or behind its acquire on the script socket; see
    /// [`ClientState::cancel`].
    pub(crate) async fn cancel_permit_call(
        self: &Arc<Self>,
        keys: &Arc<LockKeys>,
        owner_id: &str,
        via: Via<'_>,
    ) -> Result<Purged> {
        let call = PermitCancel {
            owner_id,
            timings: &self.timings,
            channel_prefix: &self.channel_prefix(keys),
        };
        // Also while the client closes (see `ClientState::cancel`).
        Ok(self
            .run_while_closing_via(Lane::Waiters, via, keys, &call)
            .await?
            .purged)
    }

    /// One heartbeat of this process's waiters on one permit set. A probe
    /// found neither queued nor holding whose task still waits here has
    /// lost its place and re-runs acquire, which answers a grant (with the
    /// waiter's own lease) or keeps or retakes its place; if it is the
    /// oldest or the newest, every waiter here does (see
    /// [`LockWaiters::recheck_lost`]).
    ///
    /// Every probe that holds while its task still waits here untold
    /// checks its grant. If Redis cut one such grant's lease to the waiter
    /// TTL (its message reached nobody), the grants of the same release
    /// (all the readers at the head) may have gone unheard too: every
    /// waiter here checks at once (found one per interval, the later ones'
    /// short unheard leases ran out first and their grants were wasted).
    /// Otherwise only the probes check, at most 8 calls: a grant whose
    /// message is on its way is the usual case of a queue draining here,
    /// and one whose message was lost on its way (a subscriber connection
    /// gone silent, which Redis still counts as listening) is found among
    /// the probes, up to 8 per interval (it was one per interval when only
    /// the oldest checked). (This once asked whether any release of this
    /// process was on its way instead, which a busy process always has.)
    pub(crate) async fn beat_permits(self: &Arc<Self>, lock: LockWaiters) {
        let channel_prefix = self.channel_prefix(&lock.keys);
        let probes = lock.probe_refs();
        let call = PermitHeartbeat {
            tag: &self.tag,
            probes: &probes,
            timings: &self.timings,
            channel_prefix: &channel_prefix,
        };
        // On the waiters' script socket where it is clear, as a lock's.
        match self.run_on_waiters_socket(&lock.keys, &call).await {
            Ok(reply) => {
                self.after_purge(&lock.keys, reply.purged);
                self.waiters.checked(&lock);
                // Nothing to do if its task took the grant while the call
                // was on its way, or was told it already.
                let untold: Vec<usize> = (0..lock.probes.len())
                    .filter(|&i| reply.holds.get(i) && self.waiters.waits_untold(&lock.probes[i]))
                    .collect();
                if untold.iter().any(|&i| reply.unheard.get(i)) {
                    self.waiters.recheck_lock(lock.keys.owner());
                } else {
                    for i in untold {
                        self.waiters.deliver(&lock.probes[i], WaiterEvent::Recheck);
                    }
                }
                let lost =
                    (0..lock.probes.len()).filter(|&i| !reply.queued.get(i) && !reply.holds.get(i));
                lock.recheck_lost(&self.waiters, lost);
            }
            Err(error) => {
                tracing::warn!(set = lock.keys.owner(), %error, "fairlock permit heartbeat failed")
            }
        }
    }

    /// Renews or checks several permits of one slot in one call.
    pub(crate) async fn renew_permits(
        &self,
        batch: &PermitRenewBatch<'_>,
    ) -> Result<Vec<RenewStatus>> {
        self.check_open()?;
        let args = batch.args().into_iter().map(String::into_bytes).collect();
        let reply = Box::pin(self.redis.eval(
            Lane::Holders,
            PermitRenewBatch::script().as_source(),
            &batch.keys(),
            args,
        ))
        .await?;
        Ok(PermitRenewBatch::decode(reply)?)
    }
}
