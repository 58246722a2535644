//! The state every part of a RedLock client shares: its configuration, its
//! primaries and its release-notice subscriptions.

use std::sync::Arc;

use super::config::RedLockConfig;
use super::primaries::Primaries;
use super::wakeups::Wakeups;

/// Shared by the client, its attempts, its guards and their watchdogs.
pub(crate) struct Shared {
    pub(crate) config: RedLockConfig,
    pub(crate) primaries: Arc<Primaries>,
    pub(crate) wakeups: Wakeups,
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
