//! The client: one per process (clone it freely), holding the Redis
//! connections and the background tasks shared by all its locks.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fairlock_core::{
    decode_fenced, FencedOp, FencedReply, FencedScript, FencedWrite, ForceRelease, Inspect,
    LockKeys, LockName, LockState, Release, ReleaseReply, Renew, RenewReply, Reply, ScriptSource,
    Timings,
};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::acquire::{acquire, Mode};
use crate::config::{millis, ClientConfig, LockOptions};
use crate::error::{Error, Result};
use crate::guard::{FencingToken, HeldLock, LockGuard};
use crate::owner::LockOwner;
use crate::redis::RedisConnection;
use crate::registry::{WaiterEvent, WaiterRegistry};
use crate::telemetry::waiters_evicted;
use crate::watchdog::LeaseWatchdog;
use crate::{heartbeat, subscription, watchdog};

/// State shared by the client handles, guards and background tasks.
pub(crate) struct Core {
    pub(crate) redis: RedisConnection,
    pub(crate) config: ClientConfig,
    pub(crate) timings: Timings,
    /// This process's grant channel: `channel_prefix` + `tag`.
    pub(crate) channel: String,
    pub(crate) channel_prefix: String,
    /// Random routing tag of this client, the suffix of all its members.
    pub(crate) tag: String,
    pub(crate) registry: WaiterRegistry,
    pub(crate) watchdog: LeaseWatchdog,
    pub(crate) heartbeat_now: Notify,
    closed: AtomicBool,
}

struct ClientHandle {
    core: Arc<Core>,
    runtime: Handle,
    tasks: Vec<AbortHandle>,
}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let core = Arc::clone(&self.core);
        self.runtime.spawn(async move { core.redis.quit().await });
    }
}

/// What a client is doing right now, for tests and health checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientStats {
    /// Tasks waiting for a lock.
    pub waiters: usize,
    /// Leases the watchdog renews.
    pub watched_leases: usize,
    /// Grants held (watchdog-kept or fixed), not yet released.
    pub held: usize,
}

/// A fairlock client: connect once per process and clone it into tasks.
///
/// It holds two Redis connections (commands, and the single pub/sub
/// subscription of the process) and three background tasks: the grant
/// router, the waiter heartbeat and the lease watchdog. They stop when the
/// last clone of the client and the last guard are dropped, or at
/// [`LockClient::shutdown`].
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
    /// connect timeout if Redis does not answer.
    pub async fn with_config(config: ClientConfig) -> Result<Self> {
        config.validate()?;
        let redis = RedisConnection::connect(&config).await?;
        let tag = format!("{:016x}", uuid::Uuid::new_v4().as_u64_pair().0);
        let channel_prefix = config.prefix.channel_prefix();
        let channel = format!("{channel_prefix}{tag}");
        // Listen before subscribing, and subscribe before anything can be
        // enqueued: no grant for this process can be published unheard.
        let messages = redis.messages();
        let reconnects = redis.subscriber_reconnects();
        if let Err(error) = redis.subscribe(&channel).await {
            redis.quit().await;
            return Err(error);
        }
        let core = Arc::new(Core {
            redis,
            timings: config.timings(),
            config,
            channel,
            channel_prefix,
            tag,
            registry: WaiterRegistry::default(),
            watchdog: LeaseWatchdog::default(),
            heartbeat_now: Notify::new(),
            closed: AtomicBool::new(false),
        });
        let tasks = vec![
            tokio::spawn(subscription::route_grants(Arc::clone(&core), messages)).abort_handle(),
            tokio::spawn(subscription::heal_after_reconnect(
                Arc::clone(&core),
                reconnects,
            ))
            .abort_handle(),
            tokio::spawn(heartbeat::run_waiter_heartbeat(Arc::clone(&core))).abort_handle(),
            tokio::spawn(watchdog::run_lease_watchdog(Arc::clone(&core))).abort_handle(),
        ];
        Ok(Self {
            handle: Arc::new(ClientHandle {
                core,
                runtime: Handle::current(),
                tasks,
            }),
        })
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.handle.core
    }

    /// Runs a cleanup future on the client's runtime, from any context
    /// (including `Drop`).
    pub(crate) fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        self.handle.runtime.spawn(future);
    }

    /// Waits until the lock is granted, with a watchdog-kept lease.
    ///
    /// Waiters are granted in arrival order. Not reentrant: a task that
    /// already holds `name` through another guard waits for itself.
    pub async fn lock(&self, name: &str) -> Result<LockGuard> {
        self.lock_with(name, LockOptions::default()).await
    }

    /// Waits until the lock is granted, with a lease and wait timeout from
    /// `options`. A wait that runs out fails with [`Error::WaitTimeout`]
    /// and leaves the queue.
    pub async fn lock_with(&self, name: &str, options: LockOptions) -> Result<LockGuard> {
        match acquire(self, name, options, Mode::Wait).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::Redis(
                "acquire in wait mode ended without a grant".into(),
            )),
        }
    }

    /// Takes the lock only if it is free and nobody is queued for it
    /// (a newcomer never overtakes a waiter); `Ok(None)` otherwise.
    pub async fn try_lock(&self, name: &str) -> Result<Option<LockGuard>> {
        self.try_lock_with(name, LockOptions::default()).await
    }

    /// [`LockClient::try_lock`] with a lease from `options` (the wait
    /// timeout is ignored: try never waits).
    pub async fn try_lock_with(
        &self,
        name: &str,
        options: LockOptions,
    ) -> Result<Option<LockGuard>> {
        acquire(self, name, options, Mode::Try).await
    }

    /// Releases lock `name` on behalf of the owner `owner_id` (a
    /// [`LockGuard::owner_id`], e.g. passed from another process).
    /// Refused with [`Error::NotOwner`], changing nothing, unless that
    /// owner holds the lock.
    pub async fn release_by_owner_id(&self, name: &str, owner_id: &str) -> Result<()> {
        let keys = self.keys(name)?;
        self.core().release_member(name, &keys, owner_id).await
    }

    /// Sets the lease of lock `name` held by `owner_id` to `lease` from
    /// now. Refused with [`Error::NotOwner`], changing nothing, unless that
    /// owner holds the lock.
    pub async fn extend_by_owner_id(
        &self,
        name: &str,
        owner_id: &str,
        lease: std::time::Duration,
    ) -> Result<()> {
        LockOptions::new().lease(lease).validate()?;
        let keys = self.keys(name)?;
        match self
            .core()
            .run(
                &keys,
                &Renew {
                    member: owner_id,
                    lease_ms: millis(lease),
                },
            )
            .await?
        {
            RenewReply::Renewed { .. } => Ok(()),
            RenewReply::NotOwner => Err(Error::NotOwner {
                name: name.to_owned(),
            }),
        }
    }

    /// ADMIN: frees lock `name` whoever holds it and grants it to the
    /// oldest live waiter. The evicted holder learns of it at its next
    /// renewal (its lease-lost signal fires). Returns whether it was held.
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        let keys = self.keys(name)?;
        let core = self.core();
        let reply = core
            .run(
                &keys,
                &ForceRelease {
                    timings: &core.timings,
                    channel_prefix: &core.channel_prefix,
                },
            )
            .await?;
        Ok(reply.had_owner)
    }

    /// A read-only snapshot of lock `name`: holder, token, lease, queue.
    pub async fn inspect(&self, name: &str) -> Result<LockState> {
        let keys = self.keys(name)?;
        self.core().run(&keys, &Inspect).await
    }

    /// An owner handle for re-entrant locking (see [`LockOwner`]).
    pub fn owner(&self) -> LockOwner {
        LockOwner::new(self.clone())
    }

    /// Releases every lock this client holds, handing each to its next
    /// waiter, e.g. before shutting down. Their guards become inert. Returns
    /// how many were released; the first error, if any, after trying all.
    pub async fn release_all(&self) -> Result<usize> {
        let core = self.core();
        let mut released = 0;
        let mut first_error = None;
        for held in core.watchdog.all() {
            match core.release(&held).await {
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

    /// Applies `op` to `target_key` only if `token` is not older than the
    /// newest token that used the resource whose fence key is `fence_key`;
    /// otherwise fails with [`Error::StaleToken`], changing nothing. Keep
    /// `fence_key` and `target_key` under one hash tag. Fence the reads that
    /// decide a write too ([`FencedOp::Get`]); for several writes that must
    /// land together, use [`LockClient::fenced_eval`] with one script.
    /// [`FencedOp::IncrBy`] is not idempotent if the connection drops and
    /// the command is resent.
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
        let write = FencedWrite { token: token.0, op };
        self.fenced(
            FencedWrite::script(),
            &[fence_key, target_key],
            token,
            write.args(),
        )
        .await
    }

    /// Runs a user script (see [`FencedScript`]) only if `token` is not
    /// older than the newest token the resource behind `fence_key` has
    /// seen; otherwise fails with [`Error::StaleToken`], changing nothing.
    pub async fn fenced_eval(
        &self,
        script: &FencedScript,
        fence_key: &str,
        keys: &[&str],
        token: FencingToken,
        args: &[&str],
    ) -> Result<Reply> {
        let mut all_keys = vec![fence_key];
        all_keys.extend_from_slice(keys);
        let mut all_args = vec![token.0.to_string()];
        all_args.extend(args.iter().map(|a| (*a).to_owned()));
        self.fenced(script.as_source(), &all_keys, token, all_args)
            .await
    }

    async fn fenced(
        &self,
        script: ScriptSource<'_>,
        keys: &[&str],
        token: FencingToken,
        args: Vec<String>,
    ) -> Result<Reply> {
        let core = self.core();
        if core.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let reply = core.redis.eval(script, keys, args).await?;
        match decode_fenced("fenced write", reply)? {
            FencedReply::Applied(reply) => Ok(reply),
            FencedReply::Stale { newest } => Err(Error::StaleToken {
                token: token.0,
                newest,
            }),
        }
    }

    /// What this client is doing right now.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            waiters: self.core().registry.len(),
            watched_leases: self.core().watchdog.watched(),
            held: self.core().watchdog.all().len(),
        }
    }

    /// Stops the background tasks and closes the connections, even while
    /// guards are alive. Locks still held are not released: their leases
    /// run out. Later calls fail with [`Error::Closed`].
    pub async fn shutdown(&self) {
        self.core().closed.store(true, Ordering::SeqCst);
        for task in &self.handle.tasks {
            task.abort();
        }
        self.core().redis.quit().await;
    }

    pub(crate) fn keys(&self, name: &str) -> Result<Arc<LockKeys>> {
        let name = LockName::new(name)?;
        Ok(Arc::new(LockKeys::new(&self.core().config.prefix, &name)))
    }
}

impl Core {
    /// Runs a script call, refusing once the client is shut down.
    pub(crate) async fn run<C: fairlock_core::ScriptCall>(
        &self,
        keys: &LockKeys,
        call: &C,
    ) -> Result<C::Output> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        // Boxed: the Redis call's future is large, and every waiting task
        // would otherwise carry it inline for its whole wait.
        Box::pin(self.redis.run(keys, call)).await
    }

    /// A new member: a random 128-bit owner id and this client's tag.
    pub(crate) fn new_member(&self) -> String {
        format!("{}.{}", uuid::Uuid::new_v4().simple(), self.tag)
    }

    /// Releases a guard's grant.
    pub(crate) async fn release(&self, held: &HeldLock) -> Result<()> {
        if !held.set_released() {
            // Released already (by `release_all`): nothing left to do.
            return Ok(());
        }
        self.watchdog.forget(&held.member);
        let result = self
            .release_member(&held.name, &held.keys, &held.member)
            .await;
        held.telemetry.held_for(held.granted_at);
        tracing::debug!(lock = %held.name, token = held.token, ok = result.is_ok(), "fairlock lock released");
        if matches!(result, Err(Error::NotOwner { .. })) {
            held.mark_lost("release found the lock no longer held");
        }
        result
    }

    async fn release_member(&self, name: &str, keys: &LockKeys, member: &str) -> Result<()> {
        let reply = self
            .run(
                keys,
                &Release {
                    member,
                    timings: &self.timings,
                    channel_prefix: &self.channel_prefix,
                },
            )
            .await?;
        match reply {
            ReleaseReply::Released { handed_to, evicted } => {
                waiters_evicted(evicted);
                if let Some((member, token)) = handed_to {
                    // The next owner may wait in this very process: wake it
                    // now instead of after the pub/sub round trip. Its
                    // message still arrives and is then ignored.
                    self.registry
                        .deliver(&member, WaiterEvent::Granted { token });
                }
                Ok(())
            }
            ReleaseReply::NotOwner => Err(Error::NotOwner {
                name: name.to_owned(),
            }),
        }
    }

    /// Whether `held` still owns its lock, asked of Redis (read-only).
    pub(crate) async fn owns(&self, held: &HeldLock) -> Result<bool> {
        let state = self.run(&held.keys, &Inspect).await?;
        Ok(state.owner.as_deref() == Some(held.member.as_str()))
    }
}
