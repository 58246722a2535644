//! Giving a grant back, as an extension of [`ClientState`]: a guard's
//! release (and its replica acknowledgement), the give-back of a grant the
//! replicas did not acknowledge, a release whose caller stopped waiting
//! (finished in a cleanup task), handing on a grant that arrived for
//! nobody here, and a release that failed left to the heartbeat to retry
//! (`ClientState::retry_as_cancel`). The file for "why did my release not
//! hand the lock on?".
//!
//! Every release runs while the client closes too
//! ([`ClientState::run_while_closing`]), so a guard dropped just before
//! `shutdown()` is still released; the releasing script's reply names the
//! next owner, and a waiter of this process is woken from it at once and
//! runs before the releasing task goes on.

use std::sync::Arc;

use fairlock_core::{LockKeys, Release, ReleaseAgain, ReleaseReply};

use crate::error::{Error, Result};
use crate::heartbeat::beat_lock;
use crate::held::HeldLock;
use crate::redis::{Lane, Order, Via};
use crate::state::{ClientState, Replication};
use crate::waiters::Woke;

impl ClientState {
    /// Releases a guard's grant (with replica acknowledgement on, once the
    /// replicas have the release).
    pub(crate) async fn release(self: &Arc<Self>, held: &Arc<HeldLock>) -> Result<()> {
        let mark = self.replication_mark();
        self.give_back(held).await?;
        match self.confirm_replicated_unless_reconnected(mark).await? {
            Replication::Confirmed => Ok(()),
            Replication::Reconnected => {
                // A command connection was replaced between the release
                // and its WAIT: sent again where the client writes now,
                // as a release already answered released. That server
                // releases the grant if it still has it, or makes a write
                // that changes no value (release.lua; sent as a plain
                // release, a lock's is refused once 8 later releases have
                // pushed it out of the lock's record: NotOwner for a
                // release that ran), or, for
                // a permit, writes its record of this release again
                // (permit_release.lua's entry in `alive`); WAIT then
                // covers either.
                let mark = self.replication_mark();
                self.release_counted(held.name.as_str(), &held.keys, &held.owner_id, true)
                    .await?;
                self.confirm_replicated(mark).await
            }
        }
    }

    /// Releases a grant without waiting for replicas; the hold is sampled.
    pub(crate) async fn give_back(self: &Arc<Self>, held: &Arc<HeldLock>) -> Result<()> {
        self.give_back_sampled(held, true).await
    }

    /// Gives back a grant the replicas did not acknowledge: it never
    /// reached the caller, so no hold is sampled for it, nor a lost lease
    /// counted if it is gone already (after a fail-over, the new primary
    /// may never have had it).
    pub(crate) async fn give_back_unacknowledged(
        self: &Arc<Self>,
        held: &Arc<HeldLock>,
    ) -> Result<()> {
        self.give_back_sampled(held, false).await
    }

    /// Releases `held`; `delivered`: the grant reached its caller, whose
    /// hold is sampled and whose lease, found gone, is counted lost.
    async fn give_back_sampled(
        self: &Arc<Self>,
        held: &Arc<HeldLock>,
        delivered: bool,
    ) -> Result<()> {
        if !held.set_released() {
            // Released already: by `release_all` (nothing left to do), or,
            // its lease lost, by a re-entry of its owner handle that gave
            // it back before taking the lock anew (`owner.rs`): the lease
            // ran out under this guard, which its release says.
            if delivered && held.lost_signalled() {
                return Err(Error::NotOwner {
                    name: held.name.to_string(),
                });
            }
            return Ok(());
        }
        // Dropped before the answer (a caller's timeout), the release is
        // sent again in a task of its own: it may not have run, or not
        // even been sent (a script load on the way).
        let mut unfinished = UnfinishedRelease {
            state: self,
            held: Some(held),
        };
        // Still tracked while the release is on its way: a grant notice for
        // this owner id that arrives meanwhile (a heartbeat reply, a message
        // sent before the release ran) is then known as ours and not
        // handed back by a second release, which could run first.
        let result = self
            .release_counted(held.name.as_str(), &held.keys, &held.owner_id, false)
            .await;
        unfinished.held = None;
        if let Err(error) = &result {
            self.retry_as_cancel(&held.keys, &held.owner_id, error, "release a grant");
        }
        self.held.forget(&held.owner_id);
        if delivered {
            held.telemetry.held_for(held.granted_at);
        }
        if let (true, Err(Error::NotOwner { .. })) = (delivered, &result) {
            // Counted once, whether this or an earlier check found it.
            held.lost_at_release();
        }
        tracing::debug!(lock = %held.name, token = held.token, ok = result.is_ok(), "fairlock lock released");
        if let Ok(Woke::Here) = result {
            // The next holder waits in this process and was just woken:
            // it runs before this task goes on. Its lease is running, and
            // whatever this task does next (often a `lock()` of the same
            // name, whose script Redis would run before the new holder's
            // first command) can wait one turn.
            tokio::task::yield_now().await;
        }
        result.map(drop)
    }

    /// Releases the grant of `owner_id`, waking the next owner at once if it
    /// waits in this process.
    pub(crate) async fn release_owner_id(
        self: &Arc<Self>,
        name: &str,
        keys: &Arc<LockKeys>,
        owner_id: &str,
    ) -> Result<()> {
        self.release_counted(name, keys, owner_id, false)
            .await
            .map(drop)
    }

    /// `again`: a lock release already answered released, sent again
    /// ([`ReleaseAgain`]). Says whether a waiter of this process was woken.
    async fn release_counted(
        self: &Arc<Self>,
        name: &str,
        keys: &Arc<LockKeys>,
        owner_id: &str,
        again: bool,
    ) -> Result<Woke> {
        if keys.permit_family().is_some() {
            return self.release_permit(name, keys, owner_id).await;
        }
        let release = Release {
            owner_id,
            timings: &self.timings,
            channel_prefix: &self.channel_prefix(keys),
            reply_to: &self.tag,
        };
        let reply = if again {
            self.run_while_closing(Lane::Holders, keys, &ReleaseAgain(release))
                .await
        } else {
            // On the holders' script socket if it owes no reply: a release
            // is half of every uncontended cycle.
            let via = Via::Socket(Order::IfClear, None);
            self.run_while_closing_via(Lane::Holders, via, keys, &release)
                .await
        };
        let reply = reply.inspect_err(|_| {
            // The release may have run and handed the lock to a waiter
            // here, whose wake-up was its reply.
            self.look_for_unheard_grant(keys);
        })?;
        match reply {
            ReleaseReply::Released {
                handed_to: None,
                purged,
            } => {
                self.after_purge(keys, purged);
                // This may be the answer to a resend (released, handed to
                // nobody) whose first run, its reply lost with its
                // connection, handed the lock to a waiter here without a
                // message.
                self.look_for_unheard_grant(keys);
                Ok(Woke::NobodyHere)
            }
            ReleaseReply::Released { handed_to, purged } => {
                self.after_purge(keys, purged);
                if let Some(next) = handed_to.filter(|next| self.is_ours(&next.owner_id)) {
                    // The next owner is of this very process: the script
                    // sent it no message, so this reply is the one place it
                    // is woken (one hop, no pub/sub round trip). If nobody
                    // here waits for it any more, the lock goes on at once.
                    if self.waiters.deliver_handoff(&next) {
                        return Ok(Woke::Here);
                    }
                    if !self.held.contains(&next.owner_id) {
                        self.hand_back(Arc::clone(keys), next.owner_id);
                    }
                }
                Ok(Woke::NobodyHere)
            }
            ReleaseReply::NotOwner { purged } => {
                // Refused, yet a lock freed by a lease that ran out went
                // on, maybe past dead waiters.
                self.after_purge(keys, purged);
                Err(Error::NotOwner {
                    name: name.to_owned(),
                })
            }
        }
    }

    /// After a release that may have handed the lock to a waiter here
    /// without telling it (its reply lost, or failed): if a waiter of this
    /// process is queued on the lock, a heartbeat call for that lock alone
    /// at once, whose reply names the holder (one call whatever the number
    /// of waiters; not a re-check of every waiter, which a long queue pays
    /// once per waiter, nor a whole round, which on a cluster is a call per
    /// slot waited in). Nothing on the uncontended path: one registry
    /// lookup. Nothing for a permit set: its grants are always published,
    /// also to waiters of the releasing process (whom the reply only wakes
    /// first), and the permit heartbeat finds one whose message was lost.
    fn look_for_unheard_grant(self: &Arc<Self>, keys: &LockKeys) {
        if keys.permit_family().is_some() {
            return;
        }
        if let Some(lock) = self.waiters.waiting_lock(keys.owner()) {
            let state = Arc::clone(self);
            drop(self.spawn_cleanup(async move { beat_lock(&state, lock).await }));
        }
    }

    /// A grant for `owner_id` of ours arrived and nobody here waits for it
    /// or holds it (the waiter gave up): hand the lock on at once.
    pub(crate) fn hand_back(self: &Arc<Self>, keys: Arc<LockKeys>, owner_id: String) {
        let state = Arc::clone(self);
        // A counted cleanup: `shutdown()` waits for it.
        drop(self.spawn_cleanup(async move {
            tracing::debug!(lock = keys.owner(), %owner_id, "fairlock handing back a grant nobody here waits for");
            if let Err(error) = state.release_owner_id(keys.owner(), &keys, &owner_id).await {
                state.retry_as_cancel(&keys, &owner_id, &error, "hand back an orphaned grant");
            }
        }));
    }
}

/// A release on its way whose future may be dropped before the answer:
/// then the release is sent again, and the hold forgotten, in a cleanup
/// task (a resent release changes nothing if the first one ran).
struct UnfinishedRelease<'a> {
    state: &'a Arc<ClientState>,
    held: Option<&'a Arc<HeldLock>>,
}

impl Drop for UnfinishedRelease<'_> {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        let (state, held) = (Arc::clone(self.state), Arc::clone(held));
        drop(self.state.spawn_cleanup(async move {
            let result = state
                .release_owner_id(held.name.as_str(), &held.keys, &held.owner_id)
                .await;
            state.held.forget(&held.owner_id);
            held.telemetry.held_for(held.granted_at);
            // NotOwner: the first release ran (or the lease ended).
            if let Err(error) = result {
                state.retry_as_cancel(
                    &held.keys,
                    &held.owner_id,
                    &error,
                    "finish a release its caller stopped waiting for",
                );
            }
            // If the first release ran and handed the lock to a waiter of
            // this process, its reply (that waiter's wake-up) was dropped:
            // a heartbeat call for the lock finds the grant now.
            state.look_for_unheard_grant(&held.keys);
        }));
    }
}

#[cfg(test)]
mod tests {
    use fairlock_testkit::RedisServer;

    use crate::test_waits::{held_connections, wait_until};
    use crate::LockClient;

    /// A hold stays tracked until its release has run in Redis. A grant
    /// notice naming the holder (a heartbeat reply or a message sent
    /// before the release ran) is then recognised as ours; a hold
    /// forgotten while its release was still on its way was taken for a
    /// grant nobody waits for and handed back by a second release, which
    /// could run first and make the holder's own release fail with
    /// `NotOwner` (seen twice in CI under load). Redis is paused for
    /// writes so the release waits there, in flight, every time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hold_is_tracked_until_its_release_has_run() {
        let server = RedisServer::start().expect("redis-server");
        let client = LockClient::connect(&server.url()).await.expect("client");
        let guard = client.lock("releasing").await.expect("holder");
        let owner_id = guard.owner_id().to_owned();
        let state = client.state().clone();
        server
            .cmd_ok(&["CLIENT", "PAUSE", "5000", "WRITE"])
            .expect("pause writes");
        let release = tokio::spawn(async move { guard.release().await });
        // The release is in Redis, held by the pause (before, a 300 ms
        // sleep stood for this: a release not yet sent by then left the
        // hold tracked whatever the code does).
        wait_until("the release held by the pause", || {
            !held_connections(&server).is_empty()
        })
        .await;
        assert!(!release.is_finished(), "the release waits in Redis");
        let tracked_in_flight = state.held.contains(&owner_id);
        server.cmd_ok(&["CLIENT", "UNPAUSE"]).expect("unpause");
        release
            .await
            .expect("task")
            .expect("the holder's own release");
        assert!(
            tracked_in_flight,
            "forgotten while its release was in flight"
        );
        assert!(!state.held.contains(&owner_id), "forgotten once released");
        client.shutdown().await;
    }
}
