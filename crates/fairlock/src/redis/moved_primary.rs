//! Following a single server's URL to where it now leads, when the server
//! at the other end of the open connections answers `READONLY`.
//!
//! A primary can be demoted to a replica without its connections closing:
//! a coordinated `FAILOVER`, an operator's `REPLICAOF`, or a DNS name or
//! virtual IP moved to the new primary while the old one is made its
//! replica (how managed services fail over). The open connections then
//! stay on the demoted server, and every write is answered `READONLY`;
//! connecting again reaches the server the URL now names. Behind Sentinel
//! fred follows the primary itself, and on a cluster fred's slot map does,
//! so this is for a single server's URL only.
//!
//! The call that sees `READONLY` first opens the command connections again
//! (fred's, and the script sockets) and is sent again once; calls sent
//! before that was done wait for it and are sent again too. Each waits
//! only until its own deadline, the reconnect included. A URL that names a
//! replica for good is answered `READONLY` again right after: the call then
//! fails with [`Error::ReadOnly`](crate::Error::ReadOnly), and so does
//! every call for [`AGAIN_AFTER`] before the next attempt, so that a
//! misconfigured URL costs one reconnect a second, not one per call.
//!
//! The grant connection is opened again at its next keep-alive check (one
//! heartbeat interval): until then it hears the new primary's grants
//! through the demoted server, which replicates them, but the new primary
//! counts no listener and cuts each such grant's lease to the waiter TTL
//! (a holder with a watchdog renews it at its next renewal; a fixed
//! lease's holder is told the lease is lost when it ends). A client whose
//! calls all go on connections opened after the move never meets
//! `READONLY`: its grant connection, if it stayed on the demoted server,
//! moves only when it drops or a call of the client meets `READONLY`.

use std::time::{Duration, Instant};

use fred::prelude::ClientLike;

use super::RedisConnection;

/// After opening the connections again for a `READONLY` answer, the
/// shortest time before doing it again for a later one.
const AGAIN_AFTER: Duration = Duration::from_secs(1);

/// When the connections were last opened again for a `READONLY` answer;
/// held while that is under way, so that calls answered `READONLY`
/// meanwhile wait for it instead of doing it again.
#[derive(Default)]
pub(super) struct MovedPrimary {
    last: tokio::sync::Mutex<Option<Instant>>,
}

impl RedisConnection {
    /// A call sent at `sent` was answered `READONLY`. Opens the command
    /// connections again unless that was done since `sent` (then waits
    /// for it if it is under way). `true` if the call is to be sent again:
    /// the connections were opened again after it was sent, so it may now
    /// reach a primary. `false` where this client does not follow its URL
    /// (Sentinel, a cluster, RedLock), or if they were opened again less
    /// than [`AGAIN_AFTER`] before and the server still answers `READONLY`
    /// (a replica for good), or if `deadline` (the call's) passes while
    /// another call opens them.
    ///
    /// The wait for the reconnect ends at `deadline` too: fred goes on
    /// connecting, and the call, sent again past its deadline, ends with
    /// a timeout. Before, a call could wait two command timeouts past its
    /// own, one per connection opened again.
    pub(super) async fn follow_moved_primary(&self, sent: Instant, deadline: Instant) -> bool {
        let Some(moved) = &self.moved_primary else {
            return false;
        };
        let Ok(mut last) = tokio::time::timeout_at(deadline.into(), moved.last.lock()).await else {
            return false;
        };
        match *last {
            Some(at) if at >= sent => return true,
            Some(at) if at.elapsed() < AGAIN_AFTER => return false,
            _ => {}
        }
        tracing::warn!(
            "fairlock's server answered READONLY: it is a replica now; connecting again to \
             reach the primary the URL now leads to"
        );
        if let Some(sockets) = &self.sockets {
            for (_, pair) in sockets.all() {
                for socket in pair.iter() {
                    socket.disconnect();
                }
            }
        }
        if let Some(endpoint) = self.grant_endpoint() {
            endpoint.moved();
        }
        for connection in [&self.commands, &self.holders] {
            let until = deadline.min(Instant::now() + self.command_timeout);
            let reconnected =
                tokio::time::timeout_at(until.into(), connection.force_reconnection()).await;
            if !matches!(reconnected, Ok(Ok(()))) {
                tracing::warn!("fairlock could not connect again after READONLY: {reconnected:?}");
            }
        }
        *last = Some(Instant::now());
        true
    }
}
