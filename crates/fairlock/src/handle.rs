//! A reusable handle for one lock name, and scoped locking that stops the
//! work when the lease is lost.
//!
//! [`Lock`] validates the name and computes its keys once; it is cheap to
//! clone into tasks and carries its own default options. `with_lock` runs
//! a body while the lock is held, drops (cancels) the body the moment the
//! lease-lost signal fires, and releases on every way out, so a body can
//! never go on working under a lock it no longer has. Only the body's own
//! future is dropped: tasks it spawned (with [`Held`] moved into them)
//! run on and must watch for themselves (fence their writes with the
//! token).

use std::future::Future;
use std::sync::Arc;

use fairlock_core::{LockKeys, LockName, LockState};

use crate::acquire::{acquire_keys, waited_grant, Mode};
use crate::client::LockClient;
use crate::config::LockOptions;
use crate::error::{Error, Result};
use crate::guard::{FencingToken, LockGuard};
use crate::state::ClientState;

/// A handle for one lock name: keys computed once, cheap to clone, with its
/// own default options (see [`LockClient::handle`]).
///
/// ```no_run
/// # async fn demo(client: fairlock::LockClient) -> fairlock::Result<()> {
/// use std::time::Duration;
/// let stock = client
///     .handle("stock:42")?
///     .with_options(fairlock::LockOptions::new().wait_timeout(Duration::from_secs(2)));
/// let sold = stock
///     .with_lock(|held| async move {
///         // ... read and write the stock, passing held.token() along ...
///         held.token().value()
///     })
///     .await?;
/// # let _ = sold;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Lock {
    client: LockClient,
    name: LockName,
    keys: Arc<LockKeys>,
    options: LockOptions,
}

/// What the body of a `with_lock` gets: the grant's identity, owned, so the
/// body can move it into tasks.
#[derive(Debug, Clone)]
pub struct Held {
    name: LockName,
    token: FencingToken,
    owner_id: String,
}

impl Held {
    pub(crate) fn from_guard(guard: &LockGuard) -> Self {
        Self {
            name: guard.lock_name().clone(),
            token: guard.token(),
            owner_id: guard.owner_id().to_owned(),
        }
    }

    /// The lock's name as text (lossy for a name that is not UTF-8).
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The lock's name, exact bytes included.
    pub fn lock_name(&self) -> &LockName {
        &self.name
    }

    /// The grant's fencing token: pass it to every write the lock protects.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The holder's id as stored in Redis.
    pub fn owner_id(&self) -> &str {
        &self.owner_id
    }
}

impl Lock {
    pub(crate) fn new(client: LockClient, name: LockName) -> Self {
        let keys = client.state().keys_of(&name);
        Self {
            client,
            name,
            keys,
            options: LockOptions::default(),
        }
    }

    /// The same handle with other default options.
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The lock's name as text (lossy for a name that is not UTF-8).
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The lock's name, exact bytes included.
    pub fn lock_name(&self) -> &LockName {
        &self.name
    }

    fn state(&self) -> &Arc<ClientState> {
        self.client.state()
    }

    /// Waits for the lock with the handle's options.
    pub fn lock(&self) -> impl Future<Output = Result<LockGuard>> + Send + '_ {
        self.lock_with(self.options)
    }

    /// Waits for the lock with `options`.
    // An `async fn` would keep its arguments twice (see `acquire_validated`).
    #[allow(clippy::manual_async_fn)]
    pub fn lock_with(
        &self,
        options: LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send + '_ {
        async move {
            let keys = Arc::clone(&self.keys);
            let held = waited_grant(
                acquire_keys(self.state(), &self.name, keys, &options, Mode::Wait).await?,
            )?;
            Ok(LockGuard::new(Arc::clone(self.state()), held))
        }
    }

    /// Takes the lock only if it is free and nobody waits or, if the
    /// handle's options have a wait timeout, waits up to that long (see
    /// [`LockClient::try_lock_with`]).
    pub async fn try_lock(&self) -> Result<Option<LockGuard>> {
        Ok(acquire_keys(
            self.state(),
            &self.name,
            Arc::clone(&self.keys),
            &self.options,
            Mode::Try,
        )
        .await?
        .map(|held| LockGuard::new(Arc::clone(self.state()), held)))
    }

    /// A read-only snapshot of the lock.
    pub async fn inspect(&self) -> Result<LockState> {
        self.client.inspect(self.name.as_bytes()).await
    }

    /// Runs `body` while holding the lock (waiting with the handle's
    /// options); see [`LockClient::with_lock`].
    pub async fn with_lock<F, Fut, T>(&self, body: F) -> Result<T>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lock().await?;
        run_while_held(guard, body).await
    }
}

/// Runs `body` under `guard`: stops it when the lease is lost, releases on
/// every way out (a panic in the body releases through the guard's drop).
pub(crate) async fn run_while_held<F, Fut, T>(guard: LockGuard, body: F) -> Result<T>
where
    F: FnOnce(Held) -> Fut,
    Fut: Future<Output = T>,
{
    let held = Held::from_guard(&guard);
    let name = held.name().to_owned();
    let outcome = tokio::select! {
        // Dropping the body's future here cancels it.
        _ = guard.lost() => None,
        value = body(held) => Some(value),
    };
    match outcome {
        Some(value) => released_outcome(value, false, guard.release().await, name),
        None => {
            // Dropping the guard hands the lock on if it is still ours.
            drop(guard);
            Err(Error::LeaseLost { name })
        }
    }
}

/// What a scoped body's caller gets once its lock was released: the body's
/// value, or [`Error::LeaseLost`] if the lease was `lost` before the
/// release or the release found the lock no longer ours. A release that
/// failed otherwise (a timeout, a connection lost) says nothing about the
/// lease the body ran under: the value is kept, so the caller does not
/// redo finished work, and the lock is freed once Redis answers a retry
/// of the release (`ClientState::retry_as_cancel`), at the latest when its
/// lease runs out (the watchdog stopped at the release).
fn released_outcome<T>(value: T, lost: bool, released: Result<()>, name: String) -> Result<T> {
    match released {
        Ok(()) if !lost => Ok(value),
        Ok(()) | Err(Error::NotOwner { .. }) => Err(Error::LeaseLost { name }),
        Err(_) if lost => Err(Error::LeaseLost { name }),
        Err(error) => {
            tracing::warn!(lock = %name, %error, "fairlock could not release after a scoped body finished");
            Ok(value)
        }
    }
}

/// The handle and scoped-locking entry points of the client; they live
/// here, beside [`Lock`] and `run_while_held`, so the client module does
/// not depend on this one.
impl LockClient {
    /// A reusable handle for lock `name`: the name is checked and its keys
    /// computed once; clone it freely. `lock(name)` stays the shortcut.
    ///
    /// Lock names are bytes everywhere in the API (`&str`, `String`,
    /// `&[u8]`, `Vec<u8>`, byte literals; invalid UTF-8 is fine), 1 to
    /// [`crate::MAX_NAME_BYTES`] of them; see [`LockName`].
    pub fn handle(&self, name: impl AsRef<[u8]>) -> Result<Lock> {
        Ok(Lock::new(self.clone(), LockName::new(name)?))
    }

    /// Runs `body` while holding lock `name`, and releases it on every way
    /// out. If the lease is lost meanwhile (expired, force-released, the key
    /// vanished), the body's future is dropped at once, stopping the work,
    /// and the call fails with [`Error::LeaseLost`]. A body that finished
    /// under its lease keeps its value even if the release then fails for
    /// another reason (a timeout): the lock is then freed when its lease
    /// runs out. The body gets the grant's [`Held`] identity, with its
    /// fencing token.
    ///
    /// ```no_run
    /// # async fn demo(client: fairlock::LockClient) -> fairlock::Result<()> {
    /// let report = client
    ///     .with_lock("nightly-report", fairlock::LockOptions::new(), |held| async move {
    ///         format!("built under token {}", held.token())
    ///     })
    ///     .await?;
    /// # let _ = report;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn with_lock<F, Fut, T>(
        &self,
        name: impl AsRef<[u8]>,
        options: LockOptions,
        body: F,
    ) -> Result<T>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lock_with(name, options).await?;
        run_while_held(guard, body).await
    }

    /// [`LockClient::with_lock`] for synchronous code: blocks the calling
    /// thread. From a plain thread or `spawn_blocking` it waits there; on a
    /// worker thread of a multi-threaded runtime it moves the wait off the
    /// worker first (`tokio::task::block_in_place`: the worker's other
    /// tasks go to another thread). On the thread that drives a
    /// current-thread runtime nothing may block, and tokio panics ("Cannot
    /// start a runtime from within a runtime"; tokio offers no way to tell
    /// that thread from its `spawn_blocking` threads, where this works):
    /// use [`LockClient::with_lock`] there.
    /// The body cannot be interrupted: it should check
    /// [`LockGuard::is_lost`]-style state itself through the [`Held`]
    /// token's writes; if the lease was lost by the time it returns, the
    /// call fails with [`Error::LeaseLost`].
    pub fn with_lock_blocking<F, T>(
        &self,
        name: impl AsRef<[u8]>,
        options: LockOptions,
        body: F,
    ) -> Result<T>
    where
        F: FnOnce(Held) -> T,
    {
        let run = || {
            let runtime = self.state().runtime().clone();
            let guard = runtime.block_on(self.lock_with(name, options))?;
            let held = Held::from_guard(&guard);
            let guard_name = held.name().to_owned();
            let value = body(held);
            let lost = guard.is_lost();
            released_outcome(value, lost, runtime.block_on(guard.release()), guard_name)
        };
        match tokio::runtime::Handle::try_current().map(|on| on.runtime_flavor()) {
            // A multi-threaded runtime's thread: a worker hands its tasks
            // on first; any other thread (spawn_blocking's) just runs it.
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(run),
            // No runtime, or a current-thread one's spawn_blocking thread:
            // this thread may block.
            _ => run(),
        }
    }
}
