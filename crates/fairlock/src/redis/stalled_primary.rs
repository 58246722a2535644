//! Leaving a primary that stopped answering, behind Sentinel.
//!
//! fred asks the sentinels where the primary is only when it connects, and
//! connects again only when a connection closes. A primary that stops
//! answering without closing its connections (a stalled process, a frozen
//! VM, a network that drops packets) keeps them open: the sentinels
//! promote a replica, and every call of this client still goes to the old
//! primary and times out, for as long as it stays stalled. Redis's
//! guidance for Sentinel clients is to ask the sentinels again after a
//! timeout.
//!
//! So behind Sentinel a call that times out (through fred or on a script
//! socket) has the command connections opened again (at most once per
//! command timeout, in the background): fred then asks the sentinels, and
//! connects to the primary they name once it answers `ROLE` as one (while
//! they still name the stalled one, that attempt times out and fred tries
//! again, backing off to 2 s). The script sockets are closed with them;
//! they, and the grant connection, follow fred's announcement of the new
//! primary (see `grant_endpoint.rs`). A server that is only slow costs a
//! reconnect per command timeout.

use std::sync::Mutex;
use std::time::Instant;

use fred::prelude::ClientLike;

use super::RedisConnection;

/// When the connections were last opened again for a timeout.
#[derive(Default)]
pub(super) struct StalledPrimary {
    last: Mutex<Option<Instant>>,
}

impl RedisConnection {
    /// A call through fred timed out: behind Sentinel, opens the command
    /// connections again in the background, unless that was done within
    /// the last command timeout. Nothing elsewhere.
    pub(super) fn after_timeout(&self) {
        let Some(stalled) = &self.stalled_primary else {
            return;
        };
        // A client being closed is not connected again: a call timing out
        // while `quit` runs would otherwise reopen what it closes.
        if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        {
            let mut last = stalled.last.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| at.elapsed() < self.command_timeout) {
                return;
            }
            *last = Some(Instant::now());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        tracing::warn!(
            "a call to fairlock's primary timed out: connecting again through the sentinels, \
             in case they promoted another"
        );
        if let Some(sockets) = &self.sockets {
            for (_, pair) in sockets.all() {
                for socket in pair.iter() {
                    socket.disconnect();
                }
            }
        }
        let clients = [self.commands.clone(), self.holders.clone()];
        // Bounded: a reconnect to a primary that does not answer ends at
        // fred's own timeouts; fred goes on trying after this gives up.
        let bound = self.command_timeout * 2;
        // Ends on its own within `bound`.
        drop(runtime.spawn(async move {
            for client in clients {
                let reconnected = tokio::time::timeout(bound, client.force_reconnection()).await;
                if !matches!(reconnected, Ok(Ok(()))) {
                    tracing::debug!("fairlock's reconnect after a timeout: {reconnected:?}");
                }
            }
        }));
    }
}
