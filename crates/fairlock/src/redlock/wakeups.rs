//! Waking waiters when a holder releases: pub/sub, not polling.
//!
//! A release announces itself on the lock's channel
//! (`<prefix>{<name>}:released`) on every primary it releases. A RedLock
//! client has one subscriber connection per primary, shared by all its
//! waiters; it subscribes to a lock's channel when the first of its tasks
//! starts waiting on that lock and unsubscribes when the last one stops.
//! One router task per primary turns each message into a wake-up of every
//! local waiter on that lock ([`Subscription::notified`]). The waiters then
//! race for the majority again: RedLock keeps no queue, so a release wakes
//! this client's waiters on the lock, not one of them.
//!
//! Pub/sub is at-most-once (and a primary may be down when the release is
//! sent), so a waiter never relies on a notice alone: it also retries when
//! the holder's lease would run out. A subscriber reconnect wakes every
//! waiter, since a release may have been missed meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use crate::error::PrimaryFailureKind;
use crate::redis::RedisConnection;
use crate::task::BackgroundTask;

use super::primaries::{Primaries, Primary};

/// The release-notice subscriptions of one RedLock client.
pub(crate) struct Wakeups {
    inner: Arc<Inner>,
}

struct Inner {
    primaries: Arc<Primaries>,
    /// Per channel: the wake-up counter and how many local tasks wait.
    channels: Mutex<HashMap<String, Channel>>,
    /// Per channel in use: whether it is subscribed on the servers, behind
    /// a gate held across that channel's (un)subscribe calls, so a
    /// subscribe and an unsubscribe of one channel never interleave, while
    /// other channels go on (a slow primary would otherwise hold up every
    /// lock's first waiter behind one another).
    subscribed: Mutex<HashMap<String, Gate>>,
    routers: Mutex<Vec<BackgroundTask>>,
}

struct Channel {
    wake: watch::Sender<u64>,
    waiters: usize,
}

/// A channel's gate: `true` once it is subscribed on the servers.
type Gate = Arc<tokio::sync::Mutex<bool>>;

impl Wakeups {
    pub(crate) fn new(primaries: Arc<Primaries>) -> Self {
        Self {
            inner: Arc::new(Inner {
                primaries,
                channels: Mutex::new(HashMap::new()),
                subscribed: Mutex::new(HashMap::new()),
                routers: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Starts routing `primary`'s messages (once it is connected) and
    /// subscribes it to the channels already in use.
    pub(crate) fn attach(&self, primary: &Arc<Primary>) {
        let Some(connection) = primary.connection().cloned() else {
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let router = BackgroundTask::spawn("redlock release notices", {
            let connection = Arc::clone(&connection);
            move |mut stop| async move {
                // RedLock's primaries always have fred's subscriber
                // (`PubSub::Fred`).
                let (Some(mut messages), Some(mut reconnects)) =
                    (connection.messages(), connection.subscriber_reconnects())
                else {
                    return;
                };
                loop {
                    tokio::select! {
                        () = stop.requested() => break,
                        message = messages.recv(|_| wake_all(&weak)) => match message {
                            Some(message) => wake(&weak, message.channel()),
                            None => break,
                        },
                        reconnected = reconnects.next() => {
                            if !reconnected {
                                break;
                            }
                            resubscribe(&weak, &connection);
                            wake_all(&weak);
                        }
                    }
                }
            }
        });
        lock(&self.inner.routers).push(router);
        resubscribe(&Arc::downgrade(&self.inner), &connection);
    }

    /// Registers a waiting task on `channel`, subscribing the channel on
    /// every connected primary if this is the client's first waiter there.
    /// Register before the attempt that may be followed by a wait, so a
    /// release in between is not missed.
    pub(crate) async fn subscribe(&self, channel: &str) -> Subscription {
        let wake = {
            let mut channels = lock(&self.inner.channels);
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    wake: watch::channel(0).0,
                    waiters: 0,
                });
            entry.waiters += 1;
            entry.wake.subscribe()
        };
        let subscription = Subscription {
            wake,
            channel: channel.to_owned(),
            inner: Arc::clone(&self.inner),
        };
        let gate = Arc::clone(
            lock(&self.inner.subscribed)
                .entry(channel.to_owned())
                .or_default(),
        );
        let mut on_servers = gate.lock().await;
        if !*on_servers {
            let name: Arc<str> = Arc::from(channel);
            let answers = self
                .inner
                .primaries
                .on_all(|primary| {
                    let name = Arc::clone(&name);
                    async move {
                        // A primary that is down is subscribed by its
                        // router when it reconnects.
                        match primary.connection().filter(|c| c.is_connected()) {
                            Some(connection) => connection.subscribe(&name).await.map_err(|e| {
                                primary.failure(PrimaryFailureKind::Failed(e.to_string()))
                            }),
                            None => Err(primary.failure(PrimaryFailureKind::Disconnected)),
                        }
                    }
                })
                .await;
            for (_, answer) in answers {
                if let Err(failure) = answer {
                    tracing::debug!(%failure, "RedLock: release notices from this primary will not arrive; waiters fall back to the lease timer");
                }
            }
            *on_servers = true;
        }
        subscription
    }

    /// Wakes every local waiter on every lock (the client is closing).
    pub(crate) fn wake_everyone(&self) {
        wake_all(&Arc::downgrade(&self.inner));
    }

    /// Asks the routers to stop, without waiting for them.
    pub(crate) fn stop_routers(&self) {
        lock(&self.inner.routers).clear();
    }

    /// Stops the routers.
    pub(crate) async fn shutdown(&self) {
        let routers = std::mem::take(&mut *lock(&self.inner.routers));
        for mut router in routers {
            router.shutdown().await;
        }
    }
}

/// One waiting task's registration on a lock's release channel.
pub(crate) struct Subscription {
    wake: watch::Receiver<u64>,
    channel: String,
    inner: Arc<Inner>,
}

impl Subscription {
    /// Resolves at the next release notice (or subscriber reconnect) since
    /// the last call, or since the registration.
    pub(crate) async fn notified(&mut self) {
        if self.wake.changed().await.is_err() {
            // The client is gone; the caller's other timers still run.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let idle = {
            let mut channels = lock(&self.inner.channels);
            match channels.get_mut(&self.channel) {
                Some(entry) => {
                    entry.waiters = entry.waiters.saturating_sub(1);
                    entry.waiters == 0
                }
                None => false,
            }
        };
        if !idle {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::clone(&self.inner);
        let channel = std::mem::take(&mut self.channel);
        runtime.spawn(async move {
            let Some(gate) = lock(&inner.subscribed).get(&channel).map(Arc::clone) else {
                return;
            };
            let mut on_servers = gate.lock().await;
            {
                let mut channels = lock(&inner.channels);
                match channels.get(&channel) {
                    Some(entry) if entry.waiters == 0 => {
                        channels.remove(&channel);
                    }
                    _ => return,
                }
            }
            if std::mem::take(&mut *on_servers) {
                for primary in inner.primaries.all() {
                    if let Some(connection) = primary.connection() {
                        let _ = connection.unsubscribe(&channel).await;
                    }
                }
            }
            // Ours and the map's: nobody is about to subscribe it again.
            let mut subscribed = lock(&inner.subscribed);
            if Arc::strong_count(&gate) == 2 {
                subscribed.remove(&channel);
            }
        });
    }
}

/// Subscribes `connection` (new, or just reconnected) to every channel in
/// use, in the background. fred resubscribes what it knew of after a
/// reconnect; this also covers channels first subscribed while the
/// primary was down.
fn resubscribe(inner: &Weak<Inner>, connection: &Arc<RedisConnection>) {
    let Some(inner) = inner.upgrade() else {
        return;
    };
    let connection = Arc::clone(connection);
    tokio::spawn(async move {
        let gates: Vec<(String, Gate)> = lock(&inner.subscribed)
            .iter()
            .map(|(channel, gate)| (channel.clone(), Arc::clone(gate)))
            .collect();
        for (channel, gate) in gates {
            let on_servers = gate.lock().await;
            if !*on_servers {
                continue;
            }
            if let Err(error) = connection.subscribe(&channel).await {
                tracing::warn!(%error, channel, "RedLock: cannot subscribe a primary to release notices; its waiters fall back to the lease timer");
            }
        }
    });
}

fn wake(inner: &Weak<Inner>, channel: &str) {
    if let Some(inner) = inner.upgrade() {
        if let Some(entry) = lock(&inner.channels).get(channel) {
            entry.wake.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

fn wake_all(inner: &Weak<Inner>) {
    if let Some(inner) = inner.upgrade() {
        for entry in lock(&inner.channels).values() {
            entry.wake.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// Locks a mutex, recovering from a panic elsewhere (the data is plain
/// bookkeeping that stays consistent).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
