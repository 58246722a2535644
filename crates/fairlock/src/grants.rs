//! The grant path: socket → waiter, in one place.
//!
//! A grant arrives on the process's pub/sub subscription. On a single
//! server, behind Sentinel and on a cluster, over plain TCP or TLS, that
//! is fairlock's own connection, whose reader calls [`route_notice`]
//! itself (`grant_connection.rs`, `sharded_grants.rs`: socket → waiter
//! slot → waiter, one task hop); for RedLock's primaries it is fred's
//! subscriber, read by the router task here ([`spawn_router`]).
//!
//! Each process subscribes once, at connect, to its own channel
//! `<prefix>notify:<client tag>`, before any of its tasks can enqueue: a
//! grant can never be published before its waiter listens. Scripts publish
//! `<owner id> <token> <owner key>` on the channel of the granted owner id's
//! process when they hand it the lock, and `<owner id> revoked <owner key>`
//! when an administrator force-releases it. For a semaphore or read-write
//! lock the last part is the permit set's holders key; the message is the
//! same, so one router serves both.
//!
//! [`route_grant`] is the one place a grant reaches a waiter, whether it
//! came by pub/sub, in a heartbeat reply (a lost message) or in the reply
//! of a release made here: the waiting task is woken through its slot; a
//! grant for an owner id that holds the lock already is a duplicate; a grant
//! nobody here waits for any more is handed back at once, so it never
//! stalls the lock.

use std::sync::Arc;

use fairlock_core::LockKeys;

use crate::redis::{Messages, Reconnects};
use crate::state::ClientState;
use crate::task::{BackgroundTask, ShutdownSignal};
use crate::telemetry;
use crate::waiters::WaiterEvent;

/// What a message on the grant channel says.
#[derive(Debug, PartialEq, Eq)]
enum Notice<'a> {
    Granted {
        owner_id: &'a str,
        token: u64,
        owner_key: &'a str,
    },
    /// A forced release of the grant with `token` (`None` from a script
    /// that did not say which: any grant of the owner id).
    Revoked {
        owner_id: &'a str,
        token: Option<u64>,
        owner_key: &'a str,
    },
}

fn parse(payload: &str) -> Option<Notice<'_>> {
    let mut parts = payload.splitn(3, ' ');
    let (owner_id, what, owner_key) = (parts.next()?, parts.next()?, parts.next()?);
    if let Some(revoked) = what.strip_prefix("revoked") {
        let token = match revoked.strip_prefix(':') {
            Some(token) => Some(token.parse().ok()?),
            None if revoked.is_empty() => None,
            None => return None,
        };
        return Some(Notice::Revoked {
            owner_id,
            token,
            owner_key,
        });
    }
    Some(Notice::Granted {
        owner_id,
        token: what.parse().ok()?,
        owner_key,
    })
}

/// Hands a grant for `owner_id` (one of ours) to its waiting task, or back
/// to the lock if nobody here waits for it. `confirm` marks a grant found
/// by a heartbeat rather than announced (see [`WaiterEvent::Granted`]).
///
/// The lock's keys are only needed to hand a grant back, so `keys` makes
/// them then: a grant that reaches its waiter allocates nothing here.
pub(crate) fn route_grant(
    state: &Arc<ClientState>,
    owner_id: &str,
    token: u64,
    confirm: bool,
    keys: impl FnOnce() -> Option<Arc<LockKeys>>,
) {
    if state
        .waiters
        .deliver(owner_id, WaiterEvent::Granted { token, confirm })
    {
        return;
    }
    // A waiter registers its grant with the held locks before it leaves
    // the registry, so this is never a grant in the middle of being taken.
    if state.held.contains(owner_id) {
        return;
    }
    match keys() {
        Some(keys) => state.hand_back(keys, owner_id.to_owned()),
        None => tracing::warn!(
            owner_id,
            "fairlock could not hand back a grant nobody waits for: its key is unknown"
        ),
    }
}

/// Acts on one message of this process's grant channel: a grant goes to
/// its waiter ([`route_grant`]), a forced release to its holder.
pub(crate) fn route_notice(state: &Arc<ClientState>, payload: &str) {
    match parse(payload) {
        // Every grant fairlock sends goes to its owner id's own process:
        // one naming another process's owner id was published by hand, and
        // handing it "back" would release that process's lock.
        Some(Notice::Granted { owner_id, .. }) if !state.is_ours(owner_id) => {
            tracing::warn!(%payload, "fairlock ignored a grant message for another process's owner id");
        }
        Some(Notice::Granted {
            owner_id,
            token,
            owner_key,
        }) => route_grant(state, owner_id, token, false, || {
            LockKeys::from_owner_key(owner_key)
                .or_else(|| LockKeys::from_holders_key(owner_key))
                .map(Arc::new)
        }),
        Some(Notice::Revoked {
            owner_id, token, ..
        }) => {
            if let Some(held) = state.held.revoke(owner_id, token) {
                held.mark_lost("an administrator force-released the lock");
            }
        }
        None => tracing::warn!(%payload, "fairlock ignored a malformed grant message"),
    }
}

/// After the grant channel was subscribed again (a reconnect): messages
/// sent while nobody listened are lost, so a heartbeat round at once
/// re-delivers every grant they carried.
pub(crate) fn resubscribed(state: &ClientState) {
    telemetry::pubsub_reconnected();
    tracing::info!("fairlock pub/sub connection re-established; re-checking all waiters");
    state.heartbeat_now.notify_one();
}

/// The task reading fred's subscriber connection.
pub(crate) fn spawn_router(
    state: Arc<ClientState>,
    mut messages: Messages,
    mut reconnects: Reconnects,
) -> BackgroundTask {
    BackgroundTask::spawn(
        "grant router",
        move |mut shutdown: ShutdownSignal| async move {
            // Grants lost to a lagging receiver are recovered by a heartbeat
            // now, not at the next interval.
            let heal = |state: &ClientState| state.heartbeat_now.notify_one();
            loop {
                tokio::select! {
                    _ = shutdown.requested() => return,
                    message = messages.recv(|_| heal(&state)) => match message {
                        Some(message) if state.is_our_channel(message.channel()) => route_notice(&state, &message.payload()),
                        Some(_) => {}
                        None => return,
                    },
                    reconnected = reconnects.next() => {
                        if !reconnected {
                            return;
                        }
                        resubscribed(&state);
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_parse() {
        assert_eq!(
            parse("abc.01.5 42 p:{a b}:owner"),
            Some(Notice::Granted {
                owner_id: "abc.01.5",
                token: 42,
                owner_key: "p:{a b}:owner"
            })
        );
        assert_eq!(
            parse("abc.01.5 revoked:42 k"),
            Some(Notice::Revoked {
                owner_id: "abc.01.5",
                token: Some(42),
                owner_key: "k"
            })
        );
        assert_eq!(
            parse("abc.01.5 revoked k"),
            Some(Notice::Revoked {
                owner_id: "abc.01.5",
                token: None,
                owner_key: "k"
            })
        );
        assert_eq!(parse("abc.01.5 revoked:x k"), None);
        assert_eq!(parse("abc.01.5 revokedx k"), None);
        assert_eq!(parse("abc.01"), None);
        assert_eq!(parse("abc.01 x k"), None);
    }
}
