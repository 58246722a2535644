//! The client's shared state, the one module every other part depends on.
//!
//! [`ClientState`] holds the Redis connection, the configuration, this
//! process's identity (its client tag and grant channel) and the two
//! registries: the tasks waiting for a grant ([`WaiterRegistry`]) and the
//! grants held ([`HeldLocks`]). It also owns the operations several parts
//! share: running a script, cancelling a wait, going on purging dead
//! waiters, and subscribing a cluster slot's grant channel. Giving a grant
//! back lives in `release.rs`, and the permit sets' variants in
//! `permit_state.rs`, both as extensions of [`ClientState`]. Nothing in
//! here imports the parts that use it (acquire, guards, the background
//! tasks), so the dependencies run one way.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fairlock_core::{
    Cancel, Heartbeat, HeartbeatBatch, HeartbeatReply, Inspect, LockKeys, LockName, OwnerId,
    PermitHeartbeat, Purged, RenewBatch, RenewStatus, ScriptCall, Timings,
};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::admission::GrantRates;
use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::held::{HeldLock, HeldLocks};
use crate::key_cache::KeyCache;
use crate::redis::{Lane, Order, ReconnectMark, RedisConnection, Via};
use crate::telemetry::waiters_evicted;
use crate::waiters::WaiterRegistry;

/// How many purge calls one release may chain (each bounded in Redis) while
/// dead waiters are left at the head of a queue: enough for 500,000 dead
/// entries.
const MAX_PURGE_CALLS: usize = 2_000;

/// Pause between two tries of a sharded subscription that met a slot on
/// the move (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`).
const RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(50);

/// What a replica acknowledgement found (see
/// [`ClientState::confirm_replicated_unless_reconnected`]).
pub(crate) enum Replication {
    /// Enough replicas have the write (or no acknowledgement is asked).
    Confirmed,
    /// A command connection was replaced between the write and its
    /// `WAIT`: the answer says nothing about the write.
    Reconnected,
}

/// Why a sharded subscription was not confirmed.
pub(crate) enum ShardRefusal {
    /// Redis answered with this error (`MOVED <slot> <host:port>`,
    /// `NOPERM ...`, ...).
    Redis(String),
    /// No connection to the slot's node carried it (no node known yet, or
    /// its connection failed or closed): worth another try.
    NoConnection(String),
}

/// A request to the cluster grant task (`sharded_grants.rs`).
pub(crate) enum ShardRequest {
    /// Subscribe `channel` (of `slot`) on the node serving the slot, or at
    /// `at` (a node named by a `MOVED` answer); `done` gets `Ok` once Redis
    /// confirmed it.
    Subscribe {
        slot: u16,
        channel: String,
        at: Option<String>,
        /// Names the request in a later [`ShardRequest::Silent`].
        id: u64,
        done: oneshot::Sender<std::result::Result<(), ShardRefusal>>,
    },
    /// Subscription `id` was not answered in time: close the connection
    /// it was written on, if still open (the next request opens a new
    /// one).
    Silent { id: u64 },
}

/// Numbers subscription requests, for [`ShardRequest::Silent`].
static SHARD_REQUESTS: AtomicU64 = AtomicU64::new(0);

/// State shared by the client handles, guards and background tasks.
pub(crate) struct ClientState {
    pub(crate) redis: RedisConnection,
    pub(crate) config: ClientConfig,
    pub(crate) timings: Timings,
    /// Random routing tag of this process, inside every owner id it makes.
    pub(crate) tag: String,
    /// On a single server, waiters are woken on this prefix + their
    /// process's tag (on a cluster, see [`ClientState::channel_prefix`]).
    plain_channel_prefix: String,
    /// This process's grant channel on a single server.
    pub(crate) channel: String,
    /// Cluster slots whose sharded grant channel this process subscribed.
    sharded_slots: Mutex<HashSet<u16>>,
    /// On a cluster: the node each subscribed slot's grants are heard on
    /// (kept by the grant task, `sharded_grants.rs`).
    slot_nodes: Mutex<HashMap<u16, String>>,
    pub(crate) waiters: WaiterRegistry,
    pub(crate) held: HeldLocks,
    /// Time per grant per lock, for deadline-aware admission.
    pub(crate) grant_rates: GrantRates,
    /// The keys of the locks in use, one set per name.
    key_cache: KeyCache,
    /// Asks the heartbeat for a round now (after a reconnect or lost messages).
    pub(crate) heartbeat_now: Notify,
    /// On a cluster: a refresh of fred's slot map is on its way (after a
    /// node ended a sharded subscription, `sharded_grants.rs`).
    pub(crate) refreshing_slot_map: AtomicBool,
    /// The servers fairlock's own grant connections are open to now
    /// (`grant_connection.rs` and `sharded_grants.rs` keep it); empty while
    /// they are being opened and when fred's subscriber carries the grants
    /// (RedLock's primaries).
    pub(crate) grants_at: Mutex<Vec<String>>,
    /// On a cluster: the task that keeps one grant connection per node
    /// (`sharded_grants.rs`) takes its subscription requests here.
    pub(crate) shard_requests: OnceLock<mpsc::UnboundedSender<ShardRequest>>,
    runtime: Handle,
    closed: AtomicBool,
    /// Set once the connections are being quit (the end of `shutdown()`,
    /// or the last handle dropped): from then on even the calls a closing
    /// client still makes ([`Self::run_while_closing`]) are refused.
    quitting: AtomicBool,
    /// Cancels that dropped or failed acquires left running in tasks of
    /// their own ([`ClientState::spawn_cleanup`]): `shutdown` lets them
    /// finish before it closes the connections.
    cleanups: AtomicUsize,
}

impl ClientState {
    pub(crate) fn new(
        config: ClientConfig,
        timings: Timings,
        redis: RedisConnection,
        tag: String,
    ) -> Self {
        let channel_prefix = config.prefix.channel_prefix();
        Self {
            channel: format!("{channel_prefix}{tag}"),
            plain_channel_prefix: channel_prefix,
            sharded_slots: Mutex::default(),
            slot_nodes: Mutex::default(),
            tag,
            timings,
            config,
            redis,
            waiters: WaiterRegistry::default(),
            held: HeldLocks::default(),
            grant_rates: GrantRates::default(),
            key_cache: KeyCache::default(),
            heartbeat_now: Notify::new(),
            refreshing_slot_map: AtomicBool::new(false),
            grants_at: Mutex::default(),
            shard_requests: OnceLock::new(),
            runtime: Handle::current(),
            closed: AtomicBool::new(false),
            quitting: AtomicBool::new(false),
            cleanups: AtomicUsize::new(0),
        }
    }

    /// Runs a cleanup future on the client's runtime, from any context
    /// (including `Drop`).
    pub(crate) fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(future);
    }

    /// The runtime the client was created on.
    pub(crate) fn runtime(&self) -> &Handle {
        &self.runtime
    }

    /// Marks the client closed: every later call fails with
    /// [`Error::Closed`], and every waiting task is woken to find out.
    /// The grants still held run out their leases (the watchdog stops):
    /// not counted as lost leases.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        for held in self.held.all() {
            held.client_closed();
        }
        // After the flag: a waiter that registers later meets it at its
        // first call; every one registered before is woken to meet it.
        self.waiters.recheck_all();
    }

    /// Runs `cleanup` (the cancel a dropped or failed acquire leaves) in a
    /// task of its own, counted until it ends.
    pub(crate) fn spawn_cleanup(
        self: &Arc<Self>,
        cleanup: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        self.cleanups.fetch_add(1, Ordering::SeqCst);
        let state = Arc::clone(self);
        self.runtime.spawn(async move {
            cleanup.await;
            state.cleanups.fetch_sub(1, Ordering::SeqCst);
        })
    }

    /// After [`ClientState::close`]: waits until every waiter has ended
    /// (each woken by the close) and their cancels have run, so a closing
    /// client leaves no queue entry behind; at most the command timeout.
    pub(crate) async fn settle_waiters(&self) {
        let deadline = tokio::time::Instant::now() + self.config.command_timeout;
        while self.waiters.len() > 0 || self.cleanups.load(Ordering::SeqCst) > 0 {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!("fairlock closed with waiters or cancels still running; their queue entries are dropped once this process stops refreshing them");
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Keeps `shutdown()` from closing the connections while the returned
    /// guard lives (at most the command timeout): for work a closing
    /// client must still finish, such as a grant awaiting its replicas'
    /// acknowledgement, which is given back if it is not taken.
    pub(crate) fn delaying_shutdown(&self) -> InFlight<'_> {
        InFlight::new(&self.cleanups)
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Where scripts on lock `keys` wake waiters: on a single server the
    /// one plain prefix; on a cluster a sharded channel in the lock's own
    /// slot, so grants never cross the cluster bus.
    pub(crate) fn channel_prefix(&self, keys: &LockKeys) -> Cow<'_, str> {
        if self.redis.is_clustered() {
            Cow::Owned(self.config.prefix.sharded_channel_prefix(keys.slot()))
        } else {
            Cow::Borrowed(&self.plain_channel_prefix)
        }
    }

    /// Where the command connections' reconnects stand: taken before a
    /// write that [`ClientState::confirm_replicated`] is to confirm.
    pub(crate) fn replication_mark(&self) -> ReconnectMark {
        self.redis.reconnect_mark()
    }

    /// With replica acknowledgement on, waits until enough replicas have
    /// every write this client sent so far (replication is one ordered
    /// stream, so that includes writes of others that came before).
    /// `since` is the [`ClientState::replication_mark`] taken before the
    /// write: a reconnect after it leaves the write unconfirmed
    /// ([`Error::NotReplicated`] with 0 acknowledged), since the `WAIT`
    /// may have run on a connection, or a server, without it.
    pub(crate) async fn confirm_replicated(&self, since: ReconnectMark) -> Result<()> {
        match self.confirm_replicated_unless_reconnected(since).await? {
            Replication::Confirmed => Ok(()),
            Replication::Reconnected => Err(self.not_replicated(0)),
        }
    }

    /// As [`ClientState::confirm_replicated`], but a reconnect since
    /// `since` is told apart, for a caller that can write again on the
    /// connection now in use and confirm that.
    pub(crate) async fn confirm_replicated_unless_reconnected(
        &self,
        since: ReconnectMark,
    ) -> Result<Replication> {
        let Some(acks) = self.config.replica_acks else {
            return Ok(Replication::Confirmed);
        };
        // Boxed like every Redis call here: WAIT on both lanes is a large
        // future, and `release()` would otherwise carry it inline (a
        // user's task that awaits `lock()` then `release()` would be
        // ~10 KiB for its whole wait).
        let waited = Box::pin(self.redis.wait_replicas(since, acks.replicas, acks.timeout));
        match waited.await? {
            None => {
                tracing::debug!(
                    "fairlock: a command connection was replaced between a write and its WAIT"
                );
                Ok(Replication::Reconnected)
            }
            Some(acked) if acked < acks.replicas => Err(self.not_replicated(acked)),
            Some(_) => Ok(Replication::Confirmed),
        }
    }

    /// [`Error::NotReplicated`] with `acked` acknowledgements.
    pub(crate) fn not_replicated(&self, acked: u32) -> Error {
        Error::NotReplicated {
            acked,
            wanted: self.config.replica_acks.map_or(0, |acks| acks.replicas),
        }
    }

    /// Whether a message arrived on one of this process's grant channels.
    pub(crate) fn is_our_channel(&self, channel: &str) -> bool {
        channel == self.channel
            || (channel.starts_with(self.config.prefix.as_str()) && channel.ends_with(&self.tag))
    }

    /// On a cluster, subscribes this process's sharded grant channel in the
    /// slot of `keys` before anything there can name it: once per slot, not
    /// per lock. `again` re-subscribes a slot already subscribed (a slot
    /// migration or fail-over drops sharded subscriptions silently).
    pub(crate) async fn subscribe_slot(&self, keys: &LockKeys, again: bool) -> Result<()> {
        if !self.redis.is_clustered() {
            return Ok(());
        }
        let slot = keys.slot();
        let known = self
            .sharded_slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&slot);
        if known && !again {
            return Ok(());
        }
        let channel = format!("{}{}", self.channel_prefix(keys), self.tag);
        match self.shard_requests.get() {
            Some(requests) => self.subscribe_on_node(requests, slot, channel).await?,
            None => self.redis.ssubscribe(&channel).await?,
        }
        self.sharded_slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(slot);
        Ok(())
    }

    /// Forgets that `slots` are subscribed, so the next enqueue in one of
    /// them subscribes it again: the server ended the subscription (the
    /// slot left its node) or the node's connection was lost. The
    /// heartbeat round asked for at the same time covers only the slots
    /// waited in at that moment.
    pub(crate) fn forget_slots(&self, slots: impl IntoIterator<Item = u16>) {
        let mut known = self.sharded_slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut nodes = self.slot_nodes.lock().unwrap_or_else(|p| p.into_inner());
        for slot in slots {
            known.remove(&slot);
            nodes.remove(&slot);
        }
    }

    /// The grant task subscribes `slot` on the node at `address`.
    pub(crate) fn note_slot_node(&self, slot: u16, address: &str) {
        self.slot_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(slot, address.to_owned());
    }

    /// The node `slot`'s grants are subscribed on, if any.
    pub(crate) fn slot_node(&self, slot: u16) -> Option<String> {
        self.slot_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&slot)
            .cloned()
    }

    /// The slots whose grants are subscribed on the node at `address`.
    pub(crate) fn slots_on_node(&self, address: &str) -> Vec<u16> {
        self.slot_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, node)| *node == address)
            .map(|(slot, _)| *slot)
            .collect()
    }

    /// Whether the grants for `keys` are heard on a connection to another
    /// server than the one they are published on now: a slot subscribed
    /// with a stale slot map after a `CLUSTER FAILOVER` (on the demoted
    /// primary, which as a replica still hears the slot's messages), or,
    /// behind Sentinel, a grant connection that has not followed a
    /// fail-over yet. The publishing script then counts no listener and
    /// cuts the grant's lease to the waiter TTL although the waiter hears
    /// it, so such a waiter sets its own lease when granted. Asked after
    /// the acquire call, whose `MOVED` has refreshed fred's slot map.
    pub(crate) fn grants_heard_elsewhere(&self, keys: &LockKeys) -> bool {
        let Some(endpoint) = self.redis.grant_endpoint() else {
            return false;
        };
        if self.redis.is_clustered() {
            let slot = keys.slot();
            return match (self.slot_node(slot), self.redis.node_of_slot(slot)) {
                (Some(heard_on), Some(published_on)) => heard_on != published_on,
                _ => false,
            };
        }
        match endpoint.address() {
            Some(primary) => !self
                .grants_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&primary),
            None => false,
        }
    }

    /// Has the cluster grant task subscribe `channel` on the node serving
    /// `slot`, within the command timeout. A slot on the move is tried
    /// again every 50 ms (at the node a `MOVED` names, else where fred's
    /// slot map says), as script calls are.
    async fn subscribe_on_node(
        &self,
        requests: &mpsc::UnboundedSender<ShardRequest>,
        slot: u16,
        channel: String,
    ) -> Result<()> {
        let timeout = self.config.command_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut at = None;
        loop {
            let (done, answer) = oneshot::channel();
            let id = SHARD_REQUESTS.fetch_add(1, Ordering::Relaxed);
            let request = ShardRequest::Subscribe {
                slot,
                channel: channel.clone(),
                at: at.take(),
                id,
                done,
            };
            requests.send(request).map_err(|_| Error::Closed)?;
            let refusal = match tokio::time::timeout_at(deadline, answer).await {
                Ok(Ok(Ok(()))) => return Ok(()),
                Ok(Ok(Err(refusal))) => refusal,
                // The connection closed before answering.
                Ok(Err(_)) => ShardRefusal::NoConnection("the node's connection closed".to_owned()),
                Err(_) => {
                    let _ = requests.send(ShardRequest::Silent { id });
                    return Err(Error::Timeout {
                        operation: format!("SSUBSCRIBE {channel}"),
                        timeout,
                    });
                }
            };
            let last = match refusal {
                ShardRefusal::Redis(error) if error.starts_with("NOPERM") => {
                    return Err(Error::NoPermission(format!(
                        "SSUBSCRIBE {channel} was refused by Redis: {error}"
                    )));
                }
                ShardRefusal::Redis(error) if error.starts_with("MOVED") => {
                    // "MOVED <slot> <host:port>"
                    at = error.split(' ').nth(2).map(str::to_owned);
                    error
                }
                ShardRefusal::Redis(error)
                    if ["ASK", "TRYAGAIN", "CLUSTERDOWN"]
                        .iter()
                        .any(|kind| error.starts_with(kind)) =>
                {
                    error
                }
                ShardRefusal::Redis(error) => {
                    return Err(Error::Unreachable {
                        url: crate::redis::redact(&self.config.url),
                        reason: format!("SSUBSCRIBE {channel} was refused: {error}"),
                        source: None,
                    });
                }
                ShardRefusal::NoConnection(why) => why,
            };
            if tokio::time::Instant::now() + RESUBSCRIBE_PAUSE >= deadline {
                return Err(Error::Timeout {
                    operation: format!("SSUBSCRIBE {channel} (last answer: {last})"),
                    timeout,
                });
            }
            tokio::time::sleep(RESUBSCRIBE_PAUSE).await;
        }
    }

    /// The keys of lock `name`, validating the name.
    pub(crate) fn keys(&self, name: impl AsRef<[u8]>) -> Result<Arc<LockKeys>> {
        Ok(self.keys_of(&LockName::new(name)?))
    }

    /// The keys of lock `name`, checked already.
    pub(crate) fn keys_of(&self, name: &LockName) -> Arc<LockKeys> {
        self.key_cache.keys(&self.config.prefix, name)
    }

    /// Runs a lock script call on the waiters' lane, refusing once the
    /// client is shut down.
    pub(crate) async fn run<C: ScriptCall>(&self, keys: &LockKeys, call: &C) -> Result<C::Output> {
        self.run_on(Lane::Waiters, keys, call).await
    }

    /// Runs a lock or permit script call on the waiters' lane, on its
    /// script socket if that owes no reply (`redis/script_socket/`);
    /// `unanswered` says while the call's reply there is unread (see
    /// [`Via::Socket`]).
    pub(crate) async fn run_direct<C: ScriptCall>(
        &self,
        keys: &LockKeys,
        call: &C,
        unanswered: &AtomicBool,
    ) -> Result<C::Output> {
        self.check_open()?;
        let via = Via::Socket(Order::IfClear, Some(unanswered));
        Box::pin(self.redis.run_via(Lane::Waiters, via, keys, call)).await
    }

    /// Runs a lock or permit script call on the waiters' lane, on its
    /// script socket if that owes no reply, else through fred: for a call
    /// nothing has to run behind (a heartbeat), which through fred cost a
    /// copy of its keys and arguments into fred's types.
    pub(crate) async fn run_on_waiters_socket<C: ScriptCall>(
        &self,
        keys: &LockKeys,
        call: &C,
    ) -> Result<C::Output> {
        self.check_open()?;
        let via = Via::Socket(Order::IfClear, None);
        Box::pin(self.redis.run_via(Lane::Waiters, via, keys, call)).await
    }

    /// Runs a lock script call on `lane` (see [`Lane`]).
    pub(crate) async fn run_on<C: ScriptCall>(
        &self,
        lane: Lane,
        keys: &LockKeys,
        call: &C,
    ) -> Result<C::Output> {
        self.check_open()?;
        // Boxed: the Redis call's future is large, and every waiting task
        // would otherwise carry it inline for its whole wait.
        Box::pin(self.redis.run(lane, keys, call)).await
    }

    /// Runs a lock script call on `lane` also while the client closes: for
    /// what a closing client's holders and waiters do last (a release, a
    /// cancel), so that a guard dropped just before `shutdown()` is still
    /// released. Once the connections are being quit, it is refused.
    pub(crate) async fn run_while_closing<C: ScriptCall>(
        &self,
        lane: Lane,
        keys: &LockKeys,
        call: &C,
    ) -> Result<C::Output> {
        self.run_while_closing_via(lane, Via::Fred, keys, call)
            .await
    }

    /// [`Self::run_while_closing`], travelling `via`.
    pub(crate) async fn run_while_closing_via<C: ScriptCall>(
        &self,
        lane: Lane,
        via: Via<'_>,
        keys: &LockKeys,
        call: &C,
    ) -> Result<C::Output> {
        if self.quitting.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        Box::pin(self.redis.run_via(lane, via, keys, call)).await
    }

    /// Closes the connections (the last step of shutting down); every
    /// later call fails with [`Error::Closed`] at once.
    pub(crate) async fn quit(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.quitting.store(true, Ordering::SeqCst);
        self.redis.quit().await;
    }

    /// Renews or checks several grants of one slot in one call.
    pub(crate) async fn renew(&self, batch: &RenewBatch<'_>) -> Result<Vec<RenewStatus>> {
        self.check_open()?;
        Box::pin(self.redis.renew(batch)).await
    }

    /// Runs one batched waiter heartbeat (see [`crate::heartbeat`]).
    pub(crate) async fn heartbeat(
        &self,
        batch: &HeartbeatBatch<'_>,
    ) -> Result<Vec<HeartbeatReply>> {
        self.check_open()?;
        Box::pin(self.redis.heartbeat(batch)).await
    }

    /// A new owner id: a random 128-bit nonce, this process's tag and
    /// the lease it asks for.
    pub(crate) fn new_owner_id(&self, lease_ms: u64) -> String {
        OwnerId::new(
            &uuid::Uuid::new_v4().simple().to_string(),
            &self.tag,
            lease_ms,
        )
        .as_str()
        .to_owned()
    }

    /// Whether an owner id was made by this process.
    pub(crate) fn is_ours(&self, owner_id: &str) -> bool {
        OwnerId::tag_of(owner_id) == Some(self.tag.as_str())
    }

    /// Leaves the queue for `owner_id`, passing on a grant that raced the
    /// cancellation. A failure is retried by the heartbeat. `after_socket`:
    /// an acquire call of the waiter went on the script socket and its
    /// reply was never read, so the cancel is written behind it there
    /// (Redis may not have run it yet; through fred the cancel could
    /// overtake it), and then sent through fred too, behind a later
    /// acquire call that went there while the socket owed that reply and
    /// may still be in flight. A cancel runs twice safely: the second
    /// finds nothing, or an entry such a later call made.
    pub(crate) async fn cancel(
        self: &Arc<Self>,
        keys: &Arc<LockKeys>,
        owner_id: &str,
        after_socket: bool,
    ) {
        if after_socket {
            let behind_socket = Via::Socket(Order::AfterSocket, None);
            if !self.cancel_via(keys, owner_id, behind_socket).await {
                return;
            }
        }
        self.cancel_via(keys, owner_id, Via::Fred).await;
    }

    /// One cancel call for [`Self::cancel`] sent `via`; `false` if it
    /// failed (a retry is then left to the heartbeat, or none is worth it).
    async fn cancel_via(
        self: &Arc<Self>,
        keys: &Arc<LockKeys>,
        owner_id: &str,
        via: Via<'_>,
    ) -> bool {
        let result = if keys.permit_family().is_some() {
            self.cancel_permit_call(keys, owner_id, via).await
        } else {
            let call = Cancel {
                owner_id,
                timings: &self.timings,
                channel_prefix: &self.channel_prefix(keys),
            };
            // Also while the client closes: leaving the queue is what a
            // closing client's waiters do last.
            self.run_while_closing_via(Lane::Waiters, via, keys, &call)
                .await
                .map(|reply| reply.purged)
        };
        match result {
            Ok(purged) => {
                self.after_purge(keys, purged);
                return true;
            }
            Err(error) => self.retry_as_cancel(keys, owner_id, &error, "leave the queue"),
        }
        false
    }

    /// After a cancel or a release of `owner_id` that failed with `error`
    /// (it may not have run; `what` it was for, for the log): if a retry
    /// may cure the failure (an outage, a timeout), the heartbeat sends a
    /// cancel for `owner_id` with its next round, and with every round
    /// after until one runs. A cancel leaves the queue, frees the lock or
    /// gives back the permit if `owner_id` still holds it, and changes
    /// nothing if that already happened or the lease ended (owner ids are
    /// never reused). Not retried otherwise: a queue entry left behind is
    /// dropped as dead once this process stops refreshing it, a grant ends
    /// with its lease; nor by a closed client, which has no heartbeat left.
    pub(crate) fn retry_as_cancel(
        &self,
        keys: &Arc<LockKeys>,
        owner_id: &str,
        error: &Error,
        what: &'static str,
    ) {
        match error {
            // The release found the grant gone: nothing left to undo.
            Error::NotOwner { .. } => {}
            Error::Closed => {
                tracing::debug!(
                    lock = keys.owner(),
                    what,
                    "fairlock closed before it could finish"
                );
            }
            error if !retry_may_cure(error) => {
                tracing::warn!(lock = keys.owner(), %error, what, "fairlock failed and will not retry; the queue entry or grant ends with its deadline or lease");
            }
            error => {
                tracing::warn!(lock = keys.owner(), %error, what, "fairlock failed; the heartbeat retries");
                self.waiters.cancel_later(keys, owner_id);
            }
        }
    }

    /// Counts purged dead waiters and, if dead waiters are left at the head
    /// of the queue, goes on purging in the background (each call bounded
    /// in Redis) until the oldest live waiter has the lock.
    pub(crate) fn after_purge(self: &Arc<Self>, keys: &Arc<LockKeys>, purged: Purged) {
        waiters_evicted(purged.dropped);
        if !purged.more {
            return;
        }
        let state = Arc::clone(self);
        let keys = Arc::clone(keys);
        self.spawn(async move {
            for _ in 0..MAX_PURGE_CALLS {
                match state.purge_call(&keys).await {
                    Ok(purged) => {
                        waiters_evicted(purged.dropped);
                        if !purged.more {
                            return;
                        }
                    }
                    // Heartbeats of the waiting processes go on from here.
                    Err(_) => return,
                }
            }
        });
    }

    /// One bounded purge of dead waiters at the head of a lock's or a
    /// permit set's queue: a heartbeat call with no waiter to keep alive.
    async fn purge_call(&self, keys: &LockKeys) -> Result<Purged> {
        let channel_prefix = self.channel_prefix(keys);
        if keys.permit_family().is_some() {
            let call = PermitHeartbeat {
                tag: &self.tag,
                probes: &[],
                timings: &self.timings,
                channel_prefix: &channel_prefix,
            };
            return Ok(self.run(keys, &call).await?.purged);
        }
        let call = Heartbeat::purge(&self.tag, &self.timings, &channel_prefix);
        Ok(self.run(keys, &call).await?.purged)
    }

    /// Whether `held` still owns its lock, asked of Redis (read-only).
    pub(crate) async fn owns(&self, held: &HeldLock) -> Result<bool> {
        let state = self.run(&held.keys, &Inspect { waiters: 0 }).await?;
        Ok(state.owner.as_deref() == Some(held.owner_id.as_str()))
    }
}

/// Whether retrying a failed cancel or release with the heartbeat can
/// succeed. A foreign key type, a missing ACL permission or a read-only
/// replica refuse every retry the same way: retrying would cost one script
/// call and one warning per heartbeat for as long as the cause lasts. Not
/// retrying is safe: a queue entry left behind is dropped as dead once
/// this process stops refreshing its deadline there, and a grant ends with
/// its lease.
fn retry_may_cure(error: &Error) -> bool {
    !matches!(
        error,
        Error::WrongType(_) | Error::NoPermission(_) | Error::ReadOnly(_)
    )
}

/// One piece of work counted in `counter` while it lives (also when its
/// future is dropped).
pub(crate) struct InFlight<'a> {
    counter: &'a AtomicUsize,
}

impl<'a> InFlight<'a> {
    pub(crate) fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self { counter }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use fairlock_testkit::RedisServer;

    use crate::test_waits::{held_connections, wait_until};
    use crate::LockClient;

    /// A `try_lock` caller is known to the waiter registry from before its
    /// script runs until its grant is tracked, as a waiting caller is: a
    /// heartbeat reply that names it as the new holder before its own
    /// reply is handled is then delivered to it, not handed back as a
    /// grant nobody waits for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_caller_is_known_while_its_script_runs() {
        let server = RedisServer::start().expect("redis-server");
        let client = LockClient::connect(&server.url()).await.expect("client");
        let state = client.state().clone();
        server
            .cmd_ok(&["CLIENT", "PAUSE", "5000", "WRITE"])
            .expect("pause writes");
        let attempt = {
            let client = client.clone();
            tokio::spawn(async move { client.try_lock("trying").await })
        };
        // Its script is in Redis, held by the pause (before, a 300 ms
        // sleep stood for this: a try not yet registered by then failed
        // the test, one not yet sent passed it without the case).
        wait_until("the try's script held by the pause", || {
            !held_connections(&server).is_empty()
        })
        .await;
        assert!(!attempt.is_finished(), "the try waits in Redis");
        let known_in_flight = state.waiters.len();
        server.cmd_ok(&["CLIENT", "UNPAUSE"]).expect("unpause");
        let guard = attempt
            .await
            .expect("task")
            .expect("try_lock")
            .expect("the lock was free");
        assert_eq!(known_in_flight, 1, "the try caller was not registered");
        assert_eq!(
            state.waiters.len(),
            0,
            "it leaves the registry once granted"
        );
        guard.release().await.expect("release");
        client.shutdown().await;
    }
}
