//! The process's one pub/sub subscription and the task that routes its
//! messages.
//!
//! A client subscribes once, at connect, to its own channel
//! `<prefix>notify:<client tag>`, before any of its tasks can enqueue: a
//! grant can never be published before its waiter listens. Release scripts
//! publish `<member> <token>` on the channel of the granted member's
//! process only; the router hands it to the waiting task through the
//! [`WaiterRegistry`](crate::registry::WaiterRegistry).

use std::sync::Arc;

use crate::client::Core;
use crate::redis::{Messages, Reconnects};
use crate::registry::WaiterEvent;
use crate::telemetry;

/// Parses a grant message, `<member> <token>`.
pub(crate) fn parse_grant(payload: &str) -> Option<(&str, u64)> {
    let (member, token) = payload.split_once(' ')?;
    Some((member, token.parse().ok()?))
}

/// Routes grant messages to waiting tasks until the connection closes.
pub(crate) async fn route_grants(core: Arc<Core>, mut messages: Messages) {
    // Grants lost to a lagging receiver are recovered by a heartbeat now,
    // not at the next interval.
    let heal = || core.heartbeat_now.notify_one();
    while let Some((channel, payload)) = messages.recv(|_| heal()).await {
        if channel != core.channel {
            continue;
        }
        match parse_grant(&payload) {
            Some((member, token)) => {
                // No waiter: it was cancelled; its cancel script passes the lock on.
                core.registry
                    .deliver(member, WaiterEvent::Granted { token });
            }
            None => tracing::warn!(%payload, "fairlock ignored a malformed grant message"),
        }
    }
}

/// After the subscriber reconnects, messages sent while it was away are
/// lost: run a heartbeat at once, which re-delivers every grant.
pub(crate) async fn heal_after_reconnect(core: Arc<Core>, mut reconnects: Reconnects) {
    while reconnects.next().await {
        telemetry::pubsub_reconnected();
        tracing::info!("fairlock pub/sub connection re-established; re-checking all waiters");
        core.heartbeat_now.notify_one();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn grant_messages_parse() {
        assert_eq!(super::parse_grant("abc.01 42"), Some(("abc.01", 42)));
        assert_eq!(super::parse_grant("abc.01"), None);
        assert_eq!(super::parse_grant("abc.01 x"), None);
    }
}
