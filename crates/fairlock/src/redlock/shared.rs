//! The state every part of a RedLock client shares: its configuration, its
//! primaries and its release-notice subscriptions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::error::{Error, Result};

use super::config::RedLockConfig;
use super::primaries::Primaries;
use super::release_retries::ReleaseRetries;
use super::wakeups::Wakeups;

/// Shared by the client, its attempts, its guards and their watchdogs.
pub(crate) struct Shared {
    pub(crate) config: RedLockConfig,
    pub(crate) primaries: Arc<Primaries>,
    pub(crate) wakeups: Wakeups,
    /// Set by `RedLock::close`: acquires end with `Error::Closed`.
    pub(crate) closed: AtomicBool,
    /// Wakes the waiters pausing before an attempt when the client closes.
    pub(crate) closing: Notify,
    /// Releases sent again to the primaries a release round missed.
    pub(crate) release_retries: ReleaseRetries,
}

impl Shared {
    /// Whether `RedLock::close` was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Resolves once `RedLock::close` was called (at once if it was).
    pub(crate) async fn closed(&self) {
        let closing = self.closing.notified();
        tokio::pin!(closing);
        // Registered before the check: a close between them still wakes it.
        closing.as_mut().enable();
        if !self.is_closed() {
            closing.await;
        }
    }

    /// [`Error::Closed`] once `RedLock::close` was called.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Marks the client closed and wakes its waiters, which then end with
    /// `Error::Closed`.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.closing.notify_waiters();
        self.wakeups.wake_everyone();
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last client, guard and waiter are gone: stop routing release
        // notices and close every connection in the background.
        self.wakeups.stop_routers();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let primaries = Arc::clone(&self.primaries);
        runtime.spawn(async move {
            for primary in primaries.all() {
                if let Some(connection) = primary.connection() {
                    connection.quit().await;
                }
            }
        });
    }
}
