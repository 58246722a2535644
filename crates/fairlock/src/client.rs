//! The client: one per process (clone it freely). It connects, checks the
//! server's settings, subscribes the process's one grant channel, starts
//! the background tasks, and offers the lock operations.

use std::future::Future;
use std::sync::{Arc, Mutex};

use fairlock_core::{
    decode_fenced, key_slot, FencedOp, FencedReply, FencedScript, FencedWrite, ForceRelease,
    Inspect, LockKeys, LockName, LockState, OwnerId, PublishCheck, PublishCommand, RenewBatch,
    RenewItem, RenewStatus, Reply, ScriptSource,
};

use crate::acquire::{acquire, acquire_keys, waited_grant, Mode};
use crate::config::{millis, ClientConfig, EvictionCheck, LockOptions};
use crate::error::{Error, Result};
use crate::grant_connection::{spawn_grant_reader, GrantConnection};
use crate::grants::spawn_router;
use crate::guard::{FencingToken, LockGuard};
use crate::heartbeat::spawn_heartbeat;
use crate::held::LeaseCall;
use crate::redis::{Lane, PubSub, RedisConnection};
use crate::sharded_grants::spawn_sharded_grants;
use crate::state::ClientState;
use crate::task::BackgroundTask;
use crate::watchdog::spawn_watchdog;

/// Eviction policies under which Redis never evicts a key. Every fairlock
/// key has a TTL, so even the `volatile-*` policies can evict lock state.
const SAFE_POLICIES: &[&str] = &["noeviction"];

struct ClientHandle {
    state: Arc<ClientState>,
    /// The grant router, the waiter heartbeat and the lease watchdog.
    tasks: Mutex<Vec<BackgroundTask>>,
    eviction_warning: Option<String>,
}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        // The tasks stop on their own when dropped (they watch their
        // shutdown signal); the connections are closed in the background,
        // once the releases and cancels already on their way have run (a
        // guard dropped just before its client: the end of a scope).
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let state = Arc::clone(&self.state);
        self.state.spawn(async move {
            state.settle_waiters().await;
            state.quit().await;
        });
    }
}

/// The most waiters [`LockClient::inspect_queue`] lists in one call.
pub const MAX_INSPECT_WAITERS: u64 = 10_000;

/// What a client is doing right now, for tests and health checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientStats {
    /// Tasks waiting for a lock.
    pub waiters: usize,
    /// Of those, the tasks this client knows to be in a queue: their
    /// acquire call answered with a place. The others' first call is on
    /// its way, or its answer was lost with its connection.
    pub queued: usize,
    /// Leases the watchdog renews.
    pub watched_leases: usize,
    /// Grants held (watchdog-kept or fixed), not yet released.
    pub held: usize,
}

/// A fairlock client: connect once per process and clone it into tasks.
///
/// It holds three Redis connections (two command lanes, one for waiters'
/// and one for holders' calls so a release never queues behind a burst of
/// enqueues, and the single pub/sub subscription of the process) and three
/// background tasks: the grant
/// router, the waiter heartbeat and the lease watchdog. They stop when the
/// last clone of the client is dropped, or at [`LockClient::shutdown`].
#[derive(Clone)]
pub struct LockClient {
    handle: Arc<ClientHandle>,
}

impl LockClient {
    /// Connects with default settings (see [`ClientConfig::new`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::with_config(ClientConfig::new(url)).await
    }

    /// Connects with `config`. Fails with [`Error::Unreachable`] within the
    /// connect timeout if Redis does not answer, and with
    /// [`Error::UnsafeServer`] if the server may evict lock keys and
    /// [`ClientConfig::eviction_check`] is [`EvictionCheck::Fail`], and with
    /// [`Error::NoPermission`] if its ACL user may not subscribe to its
    /// grant channel or publish grants to other processes. A server
    /// that answers the connect and then stalls fails the checks that
    /// follow (the eviction policy, the grant subscription) with
    /// [`Error::Timeout`] or [`Error::Unreachable`], each within its own
    /// timeout: in all, about twice the connect timeout plus the command
    /// timeout at most.
    pub async fn with_config(config: ClientConfig) -> Result<Self> {
        config.validate()?;
        let timings = config.timings()?;
        let redis = RedisConnection::connect(&config, PubSub::OwnWherePossible).await?;
        if config.replica_acks.is_some() && redis.is_clustered() {
            // A `WAIT` counts the writes of its own connection on its own
            // node; fred sends a keyless command to one arbitrary primary,
            // so on a cluster it would vouch for writes it never saw.
            redis.quit().await;
            return Err(Error::InvalidOptions(
                "replica_acks is not supported on a Redis Cluster (a WAIT would be answered by \
                 one arbitrary primary, not the one holding the lock's keys); use it with a \
                 single server or Sentinel"
                    .into(),
            ));
        }
        let eviction_warning = match check_eviction(&redis, config.eviction_check).await {
            Ok(warning) => warning,
            Err(error) => {
                redis.quit().await;
                return Err(error);
            }
        };
        let tag = format!("{:016x}", uuid::Uuid::new_v4().as_u64_pair().0);
        crate::telemetry::start_alerting_counters(&config.metrics_lock_label);
        let state = Arc::new(ClientState::new(config, timings, redis, tag));
        if let Err(error) = check_publish(&state).await {
            state.redis.quit().await;
            return Err(error);
        }
        let router = match subscribe_grants(&state).await {
            Ok(router) => router,
            Err(error) => {
                state.redis.quit().await;
                return Err(error);
            }
        };
        let tasks = vec![
            router,
            spawn_heartbeat(Arc::clone(&state)),
            spawn_watchdog(Arc::clone(&state)),
        ];
        Ok(Self {
            handle: Arc::new(ClientHandle {
                state,
                tasks: Mutex::new(tasks),
                eviction_warning,
            }),
        })
    }

    pub(crate) fn state(&self) -> &Arc<ClientState> {
        &self.handle.state
    }

    /// Why the server's settings put the guarantees at risk (an eviction
    /// policy that can evict lock keys), if they do; see the README's
    /// "What Redis must be configured for".
    pub fn eviction_warning(&self) -> Option<&str> {
        self.handle.eviction_warning.as_deref()
    }

    /// Waits until the lock is granted, with a watchdog-kept lease.
    ///
    /// Waiters are granted in arrival order. Not reentrant: a task that
    /// already holds `name` through another guard waits for itself.
    ///
    /// The name is checked when this is called; the future then carries
    /// only the checked name, not the caller's name value (a waiting task
    /// holds this future for its whole wait, so it is kept small).
    pub fn lock(
        &self,
        name: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<LockGuard>> + Send + '_ {
        self.lock_with(name, LockOptions::default())
    }

    /// Waits until the lock is granted, with a lease and wait timeout from
    /// `options`. A wait that runs out fails with [`Error::WaitTimeout`]
    /// and leaves the queue.
    pub fn lock_with(
        &self,
        name: impl AsRef<[u8]>,
        options: LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send + '_ {
        let state = self.state();
        let named = LockName::new(name).map(|name| {
            let keys = state.keys_of(&name);
            (name, keys)
        });
        // The name is used where it was captured, not moved into a local:
        // the waiting task would carry both.
        async move {
            let (name, keys) = match &named {
                Ok((name, keys)) => (name, Arc::clone(keys)),
                Err(error) => return Err(error.clone().into()),
            };
            let held = waited_grant(acquire_keys(state, name, keys, &options, Mode::Wait).await?)?;
            Ok(LockGuard::new(Arc::clone(state), held))
        }
    }

    /// Takes the lock only if it is free and nobody is queued for it
    /// (a newcomer never overtakes a waiter); `Ok(None)` otherwise.
    pub async fn try_lock(&self, name: impl AsRef<[u8]>) -> Result<Option<LockGuard>> {
        self.try_lock_with(name, LockOptions::default()).await
    }

    /// [`LockClient::try_lock`] with a lease and wait timeout from
    /// `options`. Without a wait timeout (or with a zero one) it does not
    /// wait: `Ok(None)` unless the lock is free with nobody queued. With
    /// one, it waits in the queue like [`LockClient::lock_with`] (fairly:
    /// behind the waiters already there) and returns `Ok(None)` instead of
    /// [`Error::WaitTimeout`] if the time runs out, having left the queue.
    ///
    /// ```no_run
    /// # async fn demo(client: fairlock::LockClient) -> fairlock::Result<()> {
    /// use std::time::Duration;
    /// let options = fairlock::LockOptions::new().wait_timeout(Duration::from_millis(200));
    /// match client.try_lock_with("report", options).await? {
    ///     Some(guard) => guard.release().await?,
    ///     None => println!("busy for 200 ms; skipping this run"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_lock_with(
        &self,
        name: impl AsRef<[u8]>,
        options: LockOptions,
    ) -> Result<Option<LockGuard>> {
        Ok(acquire(self.state(), name, options, Mode::Try)
            .await?
            .map(|held| LockGuard::new(Arc::clone(self.state()), held)))
    }

    /// Releases lock `name` on behalf of the holder `owner_id` (a
    /// [`LockGuard::owner_id`], e.g. passed from another process).
    /// Refused with [`Error::NotOwner`], changing nothing, unless that
    /// holder has the lock, or is among its last 8 releases (a release is
    /// idempotent: the lock remembers its last 8 releases for its idle TTL,
    /// 10 minutes by default, and answers a second one released, changing
    /// nothing).
    pub async fn release_by_owner_id(&self, name: impl AsRef<[u8]>, owner_id: &str) -> Result<()> {
        let name = LockName::new(name)?;
        check_owner_id(owner_id)?;
        let keys = self.state().keys_of(&name);
        self.state()
            .release_owner_id(name.as_str(), &keys, owner_id)
            .await
    }

    /// Sets the lease of lock `name` held by `owner_id` to `lease` from
    /// now (a holder in this process then counts its lease from now too).
    /// Refused with [`Error::NotOwner`], changing nothing, unless that
    /// holder has the lock.
    pub async fn extend_by_owner_id(
        &self,
        name: impl AsRef<[u8]>,
        owner_id: &str,
        lease: std::time::Duration,
    ) -> Result<()> {
        let name = LockName::new(name)?;
        LockOptions::new().lease(lease).validate()?;
        check_owner_id(owner_id)?;
        let keys = self.state().keys_of(&name);
        let batch = RenewBatch {
            items: vec![RenewItem {
                owner_key: keys.owner(),
                owner_id,
                lease_ms: millis(lease),
                token: None,
            }],
        };
        // A holder in this process counts its lease from here too (its
        // lost signal fires by that local deadline), also if the call
        // fails or is dropped before its answer, when it may have run.
        let held = self
            .state()
            .held
            .get(owner_id)
            .filter(|held| held.name == name);
        let call = held.as_deref().map(|held| LeaseCall::start(held, lease));
        let status = self.state().renew(&batch).await?.first().copied();
        if let Some(call) = call {
            match status {
                Some(RenewStatus::Held) => call.set(),
                _ => call.refused(),
            }
        }
        match status {
            Some(RenewStatus::Held) => Ok(()),
            Some(RenewStatus::WrongType) => Err(Error::WrongType(format!(
                "WRONGTYPE fairlock key {} holds a value of another type",
                keys.owner()
            ))),
            _ => Err(Error::NotOwner {
                name: name.to_string(),
            }),
        }
    }

    /// ADMIN: frees lock `name` from whoever holds it now and grants it to
    /// the oldest live waiter. The evicted holder's process is told at once
    /// (its lease-lost signal fires). Returns whether a holder was evicted.
    ///
    /// Safe to resend: it reads the holder first and frees only that
    /// holder, so a retry never frees the next one.
    pub async fn force_release(&self, name: impl AsRef<[u8]>) -> Result<bool> {
        let name = LockName::new(name)?;
        let keys = self.state().keys_of(&name);
        let seen = self.state().run(&keys, &Inspect { waiters: 0 }).await?;
        // The grant seen, owner id and token: a resend never frees a later
        // grant, not even one to the same owner id.
        let holder = seen
            .owner
            .map(|owner| format!("{owner} {}", seen.token))
            .unwrap_or_default();
        self.force_release_from(name.as_bytes(), &holder).await
    }

    /// ADMIN: frees lock `name` only if `holder` still holds it: a holder's
    /// id as shown by [`LockClient::inspect`] or [`LockGuard::owner_id`],
    /// optionally followed by a space and the grant's token to name exactly
    /// one grant; `Ok(false)` and no change
    /// if another holder has it by now or it is free. An empty `holder`
    /// only hands a free lock with waiters on.
    pub async fn force_release_from(&self, name: impl AsRef<[u8]>, holder: &str) -> Result<bool> {
        let keys = self.state().keys(name)?;
        if !holder.is_empty() {
            let owner_id = match holder.split_once(' ') {
                Some((owner_id, token))
                    if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    owner_id
                }
                _ => holder,
            };
            check_owner_id(owner_id)?;
        }
        let state = self.state();
        let reply = state
            .run(
                &keys,
                &ForceRelease {
                    expected: holder,
                    timings: &state.timings,
                    channel_prefix: &state.channel_prefix(&keys),
                },
            )
            .await?;
        state.after_purge(&keys, reply.purged);
        Ok(reply.released)
    }

    /// A read-only snapshot of lock `name`: holder, token, lease, queue
    /// length and the first `waiters` waiters with their liveness (at most
    /// [`MAX_INSPECT_WAITERS`]: one script call reads them all, and holds
    /// Redis up for everyone meanwhile).
    pub async fn inspect_queue(&self, name: impl AsRef<[u8]>, waiters: u64) -> Result<LockState> {
        let keys = self.state().keys(name)?;
        if waiters > MAX_INSPECT_WAITERS {
            return Err(Error::InvalidOptions(format!(
                "inspect lists at most {MAX_INSPECT_WAITERS} waiters, not {waiters}"
            )));
        }
        self.state().run(&keys, &Inspect { waiters }).await
    }

    /// A read-only snapshot of lock `name`: holder, token, lease, queue length.
    pub async fn inspect(&self, name: impl AsRef<[u8]>) -> Result<LockState> {
        self.inspect_queue(name, 0).await
    }

    /// Releases every lock this client holds, handing each to its next
    /// waiter, e.g. before shutting down. Their guards become inert: their
    /// lost signal fires (a `with_lock` body under one is stopped and ends
    /// with [`Error::LeaseLost`]), and releasing them changes nothing and
    /// succeeds. Returns
    /// how many were released; the first error, if any, after trying all.
    pub async fn release_all(&self) -> Result<usize> {
        let state = self.state();
        let mut released = 0;
        let mut first_error = None;
        for held in state.held.all() {
            match state.release(&held).await {
                Ok(()) => released += 1,
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(released),
        }
    }

    /// Applies `op` to `target_key` only if `token` is newer than the
    /// newest token that used the resource whose fence key is `fence_key`
    /// (or is that same token of the same holder); otherwise fails with
    /// [`Error::StaleToken`], changing nothing. Keep `fence_key` and
    /// `target_key` under one hash tag, and the fence key a key of its own:
    /// an empty key, a fence key that is also the target (the write would
    /// replace the fence record) and, on a cluster, keys in different slots
    /// are refused with [`Error::InvalidOptions`]. Fence the reads that decide a write
    /// too ([`FencedOp::Get`]); for several writes that must land together,
    /// use [`LockClient::fenced_eval`] with one script.
    /// [`FencedOp::IncrBy`] is not idempotent if the connection drops and
    /// the command is resent (fred resends a command written but not
    /// answered when its connection dropped; fairlock itself never resends
    /// a fenced call). Such a resend can also answer [`Error::StaleToken`]
    /// for a write that was applied: its first send ran, its reply was
    /// lost, and a newer holder wrote before the resend, which the fence
    /// then refuses; "changing nothing" is the resend's, not the first
    /// send's. Values are bytes and pass unchanged both
    /// ways: a value read back that is not UTF-8 comes as [`Reply::Bytes`].
    ///
    /// ```no_run
    /// # async fn demo(client: fairlock::LockClient, guard: fairlock::LockGuard) -> fairlock::Result<()> {
    /// use fairlock::FencedOp;
    /// client
    ///     .fenced_write("{stock:42}:fence", "{stock:42}:count", guard.token(), FencedOp::IncrBy(-1))
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn fenced_write(
        &self,
        fence_key: &str,
        target_key: &str,
        token: FencingToken,
        op: FencedOp<'_>,
    ) -> Result<Reply> {
        let holder = token.holder();
        let write = FencedWrite {
            token: token.value(),
            holder: &holder,
            op,
        };
        self.fenced(
            FencedWrite::script(),
            &[fence_key, target_key],
            token,
            write.args(),
        )
        .await
    }

    /// Runs a user script (see [`FencedScript`]) only if `token` passes the
    /// same check as [`LockClient::fenced_write`]; otherwise fails with
    /// [`Error::StaleToken`], changing nothing. fairlock never sends it
    /// again after an error, but fred resends a command written and not
    /// answered when its connection dropped: a script that is not safe to
    /// run twice (an `INCR`) should tell a rerun from a first run itself.
    /// The arguments are bytes (`&str`, `String`, `&[u8]`, `Vec<u8>`),
    /// passed to Redis unchanged; an empty list is written `&[] as &[&str]`.
    /// `keys` must not list `fence_key` (checked as for
    /// [`LockClient::fenced_write`]).
    pub async fn fenced_eval<A: AsRef<[u8]>>(
        &self,
        script: &FencedScript,
        fence_key: &str,
        keys: &[&str],
        token: FencingToken,
        args: &[A],
    ) -> Result<Reply> {
        let mut all_keys = vec![fence_key];
        all_keys.extend_from_slice(keys);
        let mut all_args = vec![
            token.value().to_string().into_bytes(),
            token.holder().into_bytes(),
        ];
        all_args.extend(args.iter().map(|a| a.as_ref().to_vec()));
        self.fenced(script.as_source(), &all_keys, token, all_args)
            .await
    }

    async fn fenced(
        &self,
        script: ScriptSource<'_>,
        keys: &[&str],
        token: FencingToken,
        args: Vec<Vec<u8>>,
    ) -> Result<Reply> {
        self.state().check_open()?;
        check_fenced_keys(keys, self.state().redis.is_clustered())?;
        let reply = self
            .state()
            .redis
            .eval_user(Lane::Holders, script, keys, args)
            .await?;
        match decode_fenced("fenced write", reply)? {
            FencedReply::Applied(reply) => Ok(reply),
            FencedReply::Stale { newest } => Err(Error::StaleToken {
                token: token.value(),
                newest,
            }),
        }
    }

    /// What this client is doing right now.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            waiters: self.state().waiters.len(),
            queued: self.state().waiters.queued(),
            watched_leases: self.state().held.watched(),
            held: self.state().held.len(),
        }
    }

    /// The servers (`host:port`) to which fairlock's own pub/sub
    /// connections for this process's grants are open: the single server;
    /// behind Sentinel the primary fred's command connection uses (it
    /// follows a fail-over within a heartbeat interval); on a Redis Cluster
    /// each node serving a slot this process has waited in. Over plain TCP
    /// or TLS alike. Empty while a connection is being opened again.
    pub fn grants_subscribed_at(&self) -> Vec<String> {
        let at = self.state().grants_at.lock();
        at.unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stops the background tasks and closes the connections, even while
    /// guards are alive. Locks still held by live guards are not released:
    /// their leases run out (a later `release()` fails with
    /// [`Error::Closed`]). Tasks waiting for a lock or a permit end with
    /// [`Error::Closed`], and so do later calls; their queue entries, those
    /// of acquires dropped just before (a Ctrl-C), and the releases of
    /// guards and permits dropped just before are finished before the
    /// connections close (within the command timeout).
    pub async fn shutdown(&self) {
        self.state().close();
        self.state().settle_waiters().await;
        let mut tasks =
            std::mem::take(&mut *self.handle.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in &mut tasks {
            task.shutdown().await;
        }
        self.state().quit().await;
    }
}

/// Subscribes the process's grant channel and starts the task that routes
/// its grants: fairlock's own grant connection on a single plain-TCP
/// server and behind Sentinel, fred's subscriber elsewhere. Subscribed before anything can be
/// enqueued, so no grant for this process is published unheard.
async fn subscribe_grants(state: &Arc<ClientState>) -> Result<BackgroundTask> {
    if state.redis.grant_endpoint().is_some_and(|e| e.is_sharded()) {
        // Per slot, on first use (`ClientState::subscribe_slot`).
        let (requests, received) = tokio::sync::mpsc::unbounded_channel();
        let _ = state.shard_requests.set(requests);
        return Ok(spawn_sharded_grants(Arc::clone(state), received));
    }
    if let Some(endpoint) = state.redis.grant_endpoint() {
        let connection =
            // A client pointed at a replica connects as it always did (its
            // writes get `ReadOnly`); only a connection opened again
            // refuses one (`grant_connection.rs`).
            GrantConnection::open(endpoint, &state.channel, state.config.connect_timeout, false)
                .await
                .map_err(|e| e.at_connect(&state.config.url, &state.channel))?;
        return Ok(spawn_grant_reader(Arc::clone(state), connection));
    }
    // Listen before subscribing: a message right after SUBSCRIBE is kept.
    let (Some(messages), Some(reconnects)) =
        (state.redis.messages(), state.redis.subscriber_reconnects())
    else {
        return Err(Error::InvalidOptions(
            "internal: a client without its own grant connection has no fred subscriber".into(),
        ));
    };
    state.redis.subscribe(&state.channel).await?;
    Ok(spawn_router(Arc::clone(state), messages, reconnects))
}

/// Reads `maxmemory-policy` and judges it (see [`EvictionCheck`]): on a
/// cluster, every primary's.
async fn check_eviction(redis: &RedisConnection, check: EvictionCheck) -> Result<Option<String>> {
    if check == EvictionCheck::Off {
        return Ok(None);
    }
    let warning = match redis.config_get_each("maxmemory-policy").await {
        Ok(each) => {
            let Some((node, policy)) = each.into_iter().find(|(_, policy)| {
                !policy
                    .as_deref()
                    .is_some_and(|p| SAFE_POLICIES.contains(&p))
            }) else {
                return Ok(None);
            };
            let server = if node.is_empty() {
                "Redis".to_owned()
            } else {
                format!("the cluster's primary {node}")
            };
            match policy {
                Some(policy) => format!(
                    "{server} runs with maxmemory-policy {policy}, which can evict lock keys: a \
                     holder's key evicted means two holders; set maxmemory-policy noeviction on \
                     the server"
                ),
                None => format!(
                    "could not read maxmemory-policy of {server}; make sure the server runs with \
                     maxmemory-policy noeviction"
                ),
            }
        }
        // A server that stopped answering is that, not an unsafe server.
        Err(error @ (Error::Timeout { .. } | Error::Unreachable { .. })) => return Err(error),
        Err(_) => "could not read maxmemory-policy (CONFIG GET refused?); make sure \
             the server runs with maxmemory-policy noeviction"
            .to_owned(),
    };
    match check {
        EvictionCheck::Fail => Err(Error::UnsafeServer(warning)),
        _ => {
            tracing::warn!(%warning, "fairlock server settings put the lock guarantees at risk");
            Ok(Some(warning))
        }
    }
}

/// The lock whose keys route the publish check (on a cluster, to its
/// slot's node); the check reads and writes no key.
const PUBLISH_CHECK_LOCK: &str = "fairlock-publish-check";
/// A client tag no process has: the check asks about another process's
/// grant channel, where releases publish.
const NOBODYS_TAG: &str = "0000000000000000";

/// Refuses an ACL user that may subscribe to its grant channel but not
/// publish on other processes' (`-publish`, `-spublish`): every grant its
/// releases hand to another process would go unheard (the scripts take a
/// refused message as one nobody received) and wait for that process's
/// next heartbeat. Where the check cannot run (a user
/// without `EVAL`/`EVALSHA`, whose lock calls then fail with
/// `NoPermission` themselves; a server before Redis 7.0, without
/// `redis.acl_check_cmd`) nothing is refused.
async fn check_publish(state: &ClientState) -> Result<()> {
    let name =
        LockName::new(PUBLISH_CHECK_LOCK).map_err(|e| Error::InvalidOptions(e.to_string()))?;
    let keys = LockKeys::new(&state.config.prefix, &name);
    let (command, shown) = if state.redis.is_clustered() {
        (PublishCommand::Spublish, "SPUBLISH")
    } else {
        (PublishCommand::Publish, "PUBLISH")
    };
    let channel = format!("{}{NOBODYS_TAG}", state.channel_prefix(&keys));
    match state
        .run(
            &keys,
            &PublishCheck {
                command,
                channel: &channel,
            },
        )
        .await
    {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::NoPermission(format!(
            "the ACL user may not run {shown} on fairlock's grant channels (such as {channel}), \
             where a release hands a lock to a waiter of another process; allow it \
             (+{} and the channels' pattern)",
            shown.to_lowercase()
        ))),
        Err(error @ (Error::Timeout { .. } | Error::Unreachable { .. } | Error::Closed)) => {
            Err(error)
        }
        Err(error) => {
            tracing::debug!(%error, "fairlock could not check that its user may publish grants");
            Ok(())
        }
    }
}

/// Refuses, before any call to Redis, an owner id fairlock could not have
/// written (a release or extend by it could only fail there, or act on a
/// key another program wrote).
fn check_owner_id(owner_id: &str) -> Result<()> {
    if OwnerId::is_well_formed(owner_id) {
        return Ok(());
    }
    let shown: String = owner_id.chars().take(80).collect();
    Err(Error::InvalidOptions(format!(
        "{shown:?} is not an owner id fairlock writes (<hex nonce>.<hex tag>.<lease ms>, as LockGuard::owner_id and inspect show it)"
    )))
}

/// Refuses, before any call to Redis, keys a fenced call cannot use: an
/// empty key, a fence key the call would also write (the write would
/// replace the fence record and switch fencing off for the resource), and
/// on a cluster keys in different slots.
fn check_fenced_keys(keys: &[&str], clustered: bool) -> Result<()> {
    let Some((&fence, written)) = keys.split_first() else {
        return Err(Error::InvalidOptions(
            "a fenced call needs a fence key".into(),
        ));
    };
    if keys.iter().any(|key| key.is_empty()) {
        return Err(Error::InvalidOptions(
            "a fenced call's keys must not be empty".into(),
        ));
    }
    if written.contains(&fence) {
        return Err(Error::InvalidOptions(format!(
            "the fence key {fence:?} is also a key the fenced call writes: that would overwrite the fence record and switch fencing off; give the fence a key of its own under the same hash tag"
        )));
    }
    if clustered {
        let slot = key_slot(fence.as_bytes());
        if let Some(other) = written.iter().find(|key| key_slot(key.as_bytes()) != slot) {
            return Err(Error::InvalidOptions(format!(
                "the fence key {fence:?} and {other:?} are in different cluster slots: put them under one hash tag, e.g. {{stock:42}}:fence and {{stock:42}}:count"
            )));
        }
    }
    Ok(())
}
