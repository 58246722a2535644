//! The fair semaphore: at most `permits` holders at once, granted first
//! come, first served, each permit with its own lease.
//!
//! A handle validates the name and computes the set's keys once. Every
//! acquire sends the handle's permit count, and the set keeps the latest
//! one it was sent (see [`Semaphore`] for what a change does). The protocol
//! is in `fairlock-core`'s `scripts/permit_*.lua`.

use std::future::Future;
use std::sync::Arc;

use fairlock_core::{LockKeys, LockName, PermitFamily, PermitRequest, MAX_PERMITS};

use crate::acquire::acquire_permit;
use crate::acquire::Mode;
use crate::client::LockClient;
use crate::config::LockOptions;
use crate::error::{Error, Result};
use crate::permit::Permit;

/// A fair distributed semaphore: at most `permits` holders at once,
/// granted in arrival order (a newcomer never overtakes a waiter), each
/// permit with its own lease kept by the watchdog (or fixed), so a holder
/// that dies gives its permit back when its lease runs out. A release
/// hands the permit straight to the next live waiter, woken by pub/sub.
///
/// **Changing the count.** Every acquire sends its handle's count and the
/// semaphore keeps the latest one sent. Raising it grants waiters at once
/// (on that acquire); lowering it revokes nobody: holders keep their
/// permits, and new grants wait until fewer than the new count hold. Give
/// every process the same count unless you mean to change it.
///
/// A semaphore and a lock of the same name are independent: their keys
/// differ.
///
/// ```no_run
/// # async fn demo(client: fairlock::LockClient) -> fairlock::Result<()> {
/// use std::time::Duration;
/// // At most 3 concurrent calls to a rate-limited API, across all processes.
/// let api = client
///     .semaphore("partner-api", 3)?
///     .with_options(fairlock::LockOptions::new().wait_timeout(Duration::from_secs(5)));
/// let permit = api.acquire().await?;
/// // ... call the API ...
/// permit.release().await?;
/// if let Some(permit) = api.try_acquire().await? {
///     // got one without waiting
///     permit.release().await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    client: LockClient,
    name: Arc<str>,
    keys: Arc<LockKeys>,
    permits: u32,
    options: LockOptions,
}

/// Checks a permit count: 1 to [`MAX_PERMITS`].
fn check_permits(permits: u32) -> Result<u32> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::InvalidOptions(format!(
            "a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"
        )));
    }
    Ok(permits)
}

impl Semaphore {
    /// A handle for semaphore `name` with `permits` permits (1 to
    /// 1,000,000). Checks the name and the count; Redis is not touched.
    pub fn new(client: &LockClient, name: &str, permits: u32) -> Result<Self> {
        let permits = check_permits(permits)?;
        let keys = LockKeys::permits(
            &client.state().config.prefix,
            &LockName::new(name)?,
            PermitFamily::Semaphore,
        );
        Ok(Self {
            client: client.clone(),
            name: Arc::from(name),
            keys: Arc::new(keys),
            permits,
            options: LockOptions::default(),
        })
    }

    /// The same handle with other default options (lease, wait timeout,
    /// deadline-aware admission).
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The same handle with another permit count, sent from the next
    /// acquire on (see [`Semaphore`] for what a change does).
    pub fn with_permits(mut self, permits: u32) -> Result<Self> {
        self.permits = check_permits(permits)?;
        Ok(self)
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The permit count this handle sends.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Waits for a permit with the handle's options.
    pub fn acquire(&self) -> impl Future<Output = Result<Permit>> + Send + '_ {
        self.acquire_with(self.options)
    }

    /// Waits for a permit with `options`. A wait that runs out fails with
    /// [`Error::WaitTimeout`] and leaves the queue.
    // Not an `async fn`: a waiting task would carry its arguments twice.
    #[allow(clippy::manual_async_fn)]
    pub fn acquire_with(
        &self,
        options: LockOptions,
    ) -> impl Future<Output = Result<Permit>> + Send + '_ {
        async move { crate::acquire::waited_grant(self.take(&options, Mode::Wait).await?) }
    }

    /// Takes a permit only if one is free and nobody waits; `Ok(None)`
    /// otherwise.
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        self.take(&self.options, Mode::Try).await
    }

    #[allow(clippy::manual_async_fn)]
    fn take<'a>(
        &'a self,
        options: &'a LockOptions,
        mode: Mode,
    ) -> impl Future<Output = Result<Option<Permit>>> + Send + 'a {
        async move {
            let state = self.client.state();
            let request = PermitRequest::Shared(self.permits);
            Ok(
                acquire_permit(state, &self.name, &self.keys, request, options, mode)
                    .await?
                    .map(|held| Permit::new(Arc::clone(state), held)),
            )
        }
    }
}

impl LockClient {
    /// A handle for the fair semaphore `name` with `permits` permits; see
    /// [`Semaphore`].
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        Semaphore::new(self, name, permits)
    }
}
