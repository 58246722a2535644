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
use crate::task::{BackgroundTask, ShutdownSignal};

/// When the connections were last opened again for a timeout, and the
/// reconnect under way.
#[derive(Default)]
pub(super) struct StalledPrimary {
    last: Mutex<Option<Instant>>,
    /// The task opening the command connections again: owned here, one at
    /// a time, and stopped by [`StalledPrimary::stop`] when the client
    /// closes, so none reopens what `quit` closes.
    reconnect: Mutex<Option<BackgroundTask>>,
}

impl StalledPrimary {
    /// Stops the reconnect under way, if any, and waits until it has.
    pub(super) async fn stop(&self) {
        let task = self
            .reconnect
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut task) = task {
            task.shutdown().await;
        }
    }

    /// Whether a reconnect is under way.
    #[cfg(test)]
    pub(super) fn reconnecting(&self) -> bool {
        self.reconnect
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(BackgroundTask::is_running)
    }
}

impl RedisConnection {
    /// A call through fred timed out: behind Sentinel, opens the command
    /// connections again in the background, unless that was done within
    /// the last command timeout or is still under way. Nothing elsewhere.
    pub(super) fn after_timeout(&self) {
        let Some(stalled) = &self.stalled_primary else {
            return;
        };
        // A client being closed is not connected again: a call timing out
        // while `quit` runs would otherwise reopen what it closes.
        if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let mut reconnect = stalled.reconnect.lock().unwrap_or_else(|p| p.into_inner());
        // One at a time: a reconnect under way already asks the sentinels.
        // `closing` is read again under the lock, which `quit` takes after
        // setting it: a reconnect started here is one `quit` stops.
        let closing = self.closing.load(std::sync::atomic::Ordering::SeqCst);
        if closing || reconnect.as_ref().is_some_and(BackgroundTask::is_running) {
            return;
        }
        {
            // Taken only under `reconnect`: one lock order.
            let mut last = stalled.last.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| at.elapsed() < self.command_timeout) {
                return;
            }
            *last = Some(Instant::now());
        }
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
        *reconnect = Some(BackgroundTask::spawn(
            "reconnect through the sentinels",
            move |mut shutdown: ShutdownSignal| async move {
                for client in clients {
                    let reconnected = tokio::select! {
                        biased;
                        () = shutdown.requested() => return,
                        reconnected = tokio::time::timeout(bound, client.force_reconnection()) => reconnected,
                    };
                    if !matches!(reconnected, Ok(Ok(()))) {
                        tracing::debug!("fairlock's reconnect after a timeout: {reconnected:?}");
                    }
                }
            },
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fairlock_testkit::SentinelGroup;

    /// The reconnect a timeout starts behind Sentinel is the connection's
    /// own task, under way while the primary does not answer, and shutting
    /// the client down stops it, so nothing is left reconnecting what
    /// `quit` closed (before, it ran detached for up to two command
    /// timeouts a connection).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutting_down_stops_a_reconnect_under_way() {
        let group = SentinelGroup::start(1).expect("sentinel group");
        let mut config = crate::ClientConfig::new(group.url());
        config.command_timeout = Duration::from_secs(5);
        let client = crate::LockClient::with_config(config)
            .await
            .expect("client");
        let redis = &client.state().redis;
        let stalled = redis.stalled_primary.as_ref().expect("behind Sentinel");
        let primary = group.primary_addr().expect("primary");
        let node = group.node(&primary).expect("the primary's node");
        // Every client of the primary waits, for less than the sentinels'
        // down-after time: fred's reconnect waits for its role check.
        node.cmd_ok(&["CLIENT", "PAUSE", "1500", "ALL"])
            .expect("pause");
        redis.after_timeout();
        assert!(stalled.reconnecting(), "a reconnect started");
        client.shutdown().await;
        assert!(
            !stalled.reconnecting(),
            "the reconnect ran on after the client shut down"
        );
        assert!(
            stalled.reconnect.lock().expect("lock").is_none(),
            "the shut-down client still owns a reconnect"
        );
    }
}
