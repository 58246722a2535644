//! Keeps each fred connection task running until the client closes: fred
//! ends it for good on some routing errors.

use std::time::Duration;

use fred::prelude::ClientLike;
use fred::types::ConnectHandle;

use crate::task::{BackgroundTask, ShutdownSignal};

/// How long a keeper waits before starting a connection task again, so a
/// task that fails at once does not spin (fred's reconnect policy paces the
/// connection attempts themselves).
pub(super) const RESTART_PAUSE: Duration = Duration::from_millis(50);

/// Keeps `client`'s fred connection task (`task`, then each one started in
/// its place) running until [`RedisConnection::quit`](super::RedisConnection::quit).
///
/// fred's task runs until `QUIT` with an unlimited reconnect policy, except
/// when its router fails: then it ends with the error, for good, and every
/// later call on that client waits out its timeout, the waiter heartbeat's
/// included, so the client's waiters are evicted as dead and never
/// granted. fred 10.1 does this on an `ASK` redirect: it sends `ASKING` to
/// the node the redirect names but the command itself back to the slot's
/// owner, which answers `ASK` again, and the third `ASK`, after the
/// command's last write attempt, ends the router. Every command that
/// reaches a slot in migration after its keys left the source does so
/// (one heartbeat or renewal in that window was enough). The command
/// fails with a routing error, and [`RedisConnection::eval`](super::RedisConnection::eval) sends it
/// again until the migration is done; the keeper starts the task again, which reconnects every node and
/// tells the subscriber's listeners, so its channels are subscribed again
/// and a heartbeat re-checks every waiter.
pub(super) fn keep_connected<C>(
    connection: &'static str,
    client: C,
    mut task: ConnectHandle,
) -> BackgroundTask
where
    C: ClientLike + Clone + Send + Sync + 'static,
{
    BackgroundTask::spawn(
        "Redis connection keeper",
        move |mut shutdown: ShutdownSignal| async move {
            loop {
                let ended = tokio::select! {
                    _ = shutdown.requested() => return,
                    ended = &mut task => ended,
                };
                match ended {
                    // Closed by QUIT.
                    Ok(Ok(())) => return,
                    Ok(Err(error)) => tracing::warn!(
                        connection,
                        %error,
                        "fairlock's Redis connection stopped after an error; connecting it again"
                    ),
                    Err(join) if join.is_cancelled() => return,
                    Err(join) => tracing::warn!(
                        connection,
                        error = %join,
                        "fairlock's Redis connection task panicked; connecting it again"
                    ),
                }
                tokio::select! {
                    _ = shutdown.requested() => return,
                    _ = tokio::time::sleep(RESTART_PAUSE) => {}
                }
                task = client.connect();
            }
        },
    )
}
