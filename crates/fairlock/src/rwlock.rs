//! The fair read-write lock: readers share, a writer holds alone, and
//! everyone is served first come, first served.
//!
//! It is a permit set whose readers ask for one of an unlimited number of
//! shared permits and whose writers ask for the whole set: the scripts
//! grant from the head of the queue while the head fits and stop at the
//! first that does not, which gives exactly the FIFO rule below.

use std::future::Future;
use std::sync::Arc;

use fairlock_core::{LockKeys, LockName, PermitFamily, PermitRequest, MAX_PERMITS};

use crate::acquire::acquire_permit;
use crate::acquire::Mode;
use crate::client::LockClient;
use crate::config::LockOptions;
use crate::error::Result;
use crate::permit::Permit;

/// A fair distributed read-write lock.
///
/// Readers share it; a writer holds it alone. The order is strict FIFO: a
/// waiting writer blocks the readers that come after it, so a stream of
/// readers never starves a writer, and the readers at the head of the
/// queue are granted together. Every hold has its own lease (watchdog-kept
/// or fixed), lease-lost signal and fencing token; tokens increase with
/// every grant, so a write hold's token is greater than every read hold's
/// granted before it. Read and write holds are [`Permit`]s.
///
/// A read-write lock and a lock or semaphore of the same name are
/// independent: their keys differ. Holds are not re-entrant and a read
/// hold cannot be upgraded: a task that holds a read and asks for a write
/// waits for itself.
///
/// ```no_run
/// # async fn demo(client: fairlock::LockClient) -> fairlock::Result<()> {
/// let catalog = client.rw_lock("catalog")?;
/// let read = catalog.read().await?;
/// // ... read the catalog; other readers may too ...
/// read.release().await?;
/// let write = catalog.write().await?;
/// // ... rewrite it alone, passing write.token() to the store ...
/// write.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RwLock {
    client: LockClient,
    name: Arc<str>,
    keys: Arc<LockKeys>,
    options: LockOptions,
}

impl RwLock {
    /// A handle for read-write lock `name`. Checks the name; Redis is not
    /// touched.
    pub fn new(client: &LockClient, name: &str) -> Result<Self> {
        let keys = LockKeys::permits(
            &client.state().config.prefix,
            &LockName::new(name)?,
            PermitFamily::ReadWrite,
        );
        Ok(Self {
            client: client.clone(),
            name: Arc::from(name),
            keys: Arc::new(keys),
            options: LockOptions::default(),
        })
    }

    /// The same handle with other default options (lease, wait timeout,
    /// deadline-aware admission, as for a semaphore's permits).
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for a read hold with the handle's options.
    pub fn read(&self) -> impl Future<Output = Result<Permit>> + Send + '_ {
        self.read_with(self.options)
    }

    /// Waits for a read hold with `options`.
    pub fn read_with(
        &self,
        options: LockOptions,
    ) -> impl Future<Output = Result<Permit>> + Send + '_ {
        self.wait(READ, options)
    }

    /// Takes a read hold only if no writer holds and nobody waits.
    pub async fn try_read(&self) -> Result<Option<Permit>> {
        self.take(READ, &self.options, Mode::Try).await
    }

    /// Waits for a write hold with the handle's options.
    pub fn write(&self) -> impl Future<Output = Result<Permit>> + Send + '_ {
        self.write_with(self.options)
    }

    /// Waits for a write hold with `options`.
    pub fn write_with(
        &self,
        options: LockOptions,
    ) -> impl Future<Output = Result<Permit>> + Send + '_ {
        self.wait(PermitRequest::Exclusive, options)
    }

    /// Takes a write hold only if nobody holds and nobody waits.
    pub async fn try_write(&self) -> Result<Option<Permit>> {
        self.take(PermitRequest::Exclusive, &self.options, Mode::Try)
            .await
    }

    // Not `async fn`s: a waiting task would carry their arguments twice.
    #[allow(clippy::manual_async_fn)]
    fn wait(
        &self,
        request: PermitRequest,
        options: LockOptions,
    ) -> impl Future<Output = Result<Permit>> + Send + '_ {
        async move { crate::acquire::waited_grant(self.take(request, &options, Mode::Wait).await?) }
    }

    #[allow(clippy::manual_async_fn)]
    fn take<'a>(
        &'a self,
        request: PermitRequest,
        options: &'a LockOptions,
        mode: Mode,
    ) -> impl Future<Output = Result<Option<Permit>>> + Send + 'a {
        async move {
            let state = self.client.state();
            Ok(
                acquire_permit(state, &self.name, &self.keys, request, options, mode)
                    .await?
                    .map(|held| Permit::new(Arc::clone(state), held)),
            )
        }
    }
}

/// A reader: one of an unlimited number of shared permits.
const READ: PermitRequest = PermitRequest::Shared(MAX_PERMITS);

impl LockClient {
    /// A handle for the fair read-write lock `name`; see [`RwLock`].
    pub fn rw_lock(&self, name: &str) -> Result<RwLock> {
        RwLock::new(self, name)
    }
}
