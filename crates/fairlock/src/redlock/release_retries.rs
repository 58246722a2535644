//! Releases sent again to the primaries a release round did not reach.
//!
//! A release round runs on every primary once; a primary that is down,
//! slower than the call timeout, or refuses the call keeps its vote until
//! the key's lease ends, and until then that minority's key can split
//! other callers' votes. Each such round leaves a task here that sends the
//! release again to the primaries it missed, with a backoff, until each has
//! answered or the lease has ended (the key is gone by then). A release
//! sent again changes nothing where the first one ran: it deletes the key
//! only if it still holds this owner id.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fairlock_core::{RedLockKeys, RedlockRelease};
use tokio::time::Instant;

use crate::task::{BackgroundTask, ShutdownSignal};

use super::primaries::{call, Primaries};

/// The pause before the first retry; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two retries.
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// What a retry needs of the release it repeats.
pub(crate) struct MissedRelease {
    pub(crate) keys: Arc<RedLockKeys>,
    pub(crate) owner_id: Arc<str>,
    /// Whether the release notice goes out (as the first round's did).
    pub(crate) announce: bool,
    /// The primaries (by index) the round did not reach.
    pub(crate) missed: Vec<usize>,
    /// The lease the keys were last given: past it from the round, they
    /// have expired and nothing is left to release.
    pub(crate) lease: Duration,
}

/// The retry tasks of one RedLock client, stopped by `RedLock::close`
/// (and asked to stop when the client's shared state is dropped).
#[derive(Default)]
pub(crate) struct ReleaseRetries {
    tasks: Mutex<Vec<BackgroundTask>>,
    /// Set by `shutdown`: no retry starts after it.
    closed: Mutex<bool>,
}

impl ReleaseRetries {
    /// Starts sending `release` again to the primaries it missed.
    pub(crate) fn start(&self, primaries: &Arc<Primaries>, release: MissedRelease) {
        if release.missed.is_empty() {
            return;
        }
        let closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        if *closed {
            return;
        }
        let mut tasks = self.tasks();
        tasks.retain(BackgroundTask::is_running);
        let primaries = Arc::clone(primaries);
        tasks.push(BackgroundTask::spawn(
            "RedLock release retries",
            move |shutdown| retry(primaries, release, shutdown),
        ));
    }

    /// Stops every retry under way; none starts after this.
    pub(crate) async fn shutdown(&self) {
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = true;
        let tasks = std::mem::take(&mut *self.tasks());
        for mut task in tasks {
            task.shutdown().await;
        }
    }

    fn tasks(&self) -> MutexGuard<'_, Vec<BackgroundTask>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sends the release again to each missed primary until it answers, the
/// lease ends, or shutdown is asked for.
async fn retry(primaries: Arc<Primaries>, release: MissedRelease, mut shutdown: ShutdownSignal) {
    let MissedRelease {
        keys,
        owner_id,
        announce,
        mut missed,
        lease,
    } = release;
    let until = Instant::now() + lease;
    let mut pause = FIRST_PAUSE;
    while !missed.is_empty() {
        let next = Instant::now() + pause;
        if next >= until {
            break;
        }
        tokio::select! {
            () = shutdown.requested() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        let answers = primaries
            .on(missed.iter().copied(), |primary| {
                let (keys, owner_id) = (Arc::clone(&keys), Arc::clone(&owner_id));
                async move {
                    let channel = if announce { keys.channel() } else { "" };
                    let call_args = RedlockRelease {
                        owner_id: &owner_id,
                        channel,
                    };
                    call(&primary, &[keys.owner()], &call_args).await
                }
            })
            .await;
        for (index, answer) in answers {
            if answer.is_ok() {
                missed.retain(|&m| m != index);
            }
        }
        pause = (pause * 2).min(MAX_PAUSE);
    }
    if !missed.is_empty() {
        tracing::debug!(
            lock = keys.owner(),
            unreached = missed.len(),
            "RedLock: a release still missed primaries when its lease ended"
        );
    } else {
        tracing::debug!(
            lock = keys.owner(),
            "RedLock: a release reached the primaries it had missed"
        );
    }
}
