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
