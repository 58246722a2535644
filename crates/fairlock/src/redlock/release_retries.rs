//! Releases sent again to the primaries a release round did not reach.
//!
//! A release round runs on every primary once; a primary that is down,
//! slower than the call timeout, or refuses the call keeps its vote until
//! the key's lease ends, and until then that minority's key can split
//! other callers' votes. A guard's release (or a won majority given back
//! because no guard will hold it) leaves its missed primaries here: one
//! task per client sends the release to them again, with a backoff, until
//! each has answered or the lease has ended (the key is gone by then). A
//! release sent again changes nothing where the first one ran: it deletes
//! the key only if it still holds this owner id, which no later grant
//! reuses (an acquire's own attempts share one owner id, so the votes an
//! attempt gives back are never retried: a retry could delete that
//! acquire's next vote).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fairlock_core::{RedLockKeys, RedlockRelease};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::error::PrimaryFailure;
use crate::task::{BackgroundTask, ShutdownSignal};

use super::primaries::{call, Primaries, Primary};

/// The pause before the first retry; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two retries.
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// The most releases kept for retrying at once; more are not retried
/// (their keys end with their leases, as before the retries).
const MAX_KEPT: usize = 10_000;

/// A release to send again.
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

/// A kept release and when it is tried next.
struct Retry {
    release: MissedRelease,
    until: Instant,
    next: Instant,
    pause: Duration,
}

#[derive(Default)]
struct Queue {
    retries: Vec<Retry>,
    /// Retries taken out to be sent now: they come back unless answered,
    /// so they count against [`MAX_KEPT`].
    sending: usize,
    /// Set by `shutdown`: nothing is kept after it.
    closed: bool,
}

impl Queue {
    /// Whether one more release may be kept.
    fn has_room(&self) -> bool {
        !self.closed && self.retries.len() + self.sending < MAX_KEPT
    }

    /// Takes out the retries due at `now` to be sent.
    fn take_due(&mut self, now: Instant) -> Vec<Retry> {
        let (due, later): (Vec<Retry>, Vec<Retry>) = std::mem::take(&mut self.retries)
            .into_iter()
            .partition(|r| r.next <= now);
        self.retries = later;
        self.sending += due.len();
        due
    }

    /// Puts back what a round of `sent` retries left to try again.
    fn put_back(&mut self, sent: usize, again: Vec<Retry>) {
        self.sending -= sent;
        if !self.closed {
            self.retries.extend(again);
        }
    }
}

/// The releases one RedLock client sends again, and the task sending them
/// (started with the first one, stopped by `RedLock::close` or when the
/// client's shared state is dropped).
#[derive(Default)]
pub(crate) struct ReleaseRetries {
    queue: Arc<Mutex<Queue>>,
    kept: Arc<Notify>,
    task: Mutex<Option<BackgroundTask>>,
}

impl ReleaseRetries {
    /// Keeps `release` to send again to the primaries it missed.
    pub(crate) fn keep(&self, primaries: &Arc<Primaries>, release: MissedRelease) {
        if release.missed.is_empty() {
            return;
        }
        {
            let mut queue = lock(&self.queue);
            if queue.closed {
                return;
            }
            if !queue.has_room() {
                tracing::warn!(
                    lock = release.keys.owner(),
                    "RedLock: too many releases waiting to be sent again; this one's keys end with their lease"
                );
                return;
            }
            let now = Instant::now();
            queue.retries.push(Retry {
                until: now + release.lease,
                next: now + FIRST_PAUSE,
                pause: FIRST_PAUSE,
                release,
            });
        }
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        // Checked under the task's lock, which `shutdown` takes after
        // closing the queue: no task starts after it.
        if task.is_none() && !lock(&self.queue).closed {
            let (queue, kept) = (Arc::clone(&self.queue), Arc::clone(&self.kept));
            let primaries = Arc::clone(primaries);
            *task = Some(BackgroundTask::spawn(
                "RedLock release retries",
                move |shutdown| send_again(primaries, queue, kept, shutdown),
            ));
        }
        drop(task);
        self.kept.notify_one();
    }

    /// Stops the retries; none is kept after this.
    pub(crate) async fn shutdown(&self) {
        {
            let mut queue = lock(&self.queue);
            queue.closed = true;
            queue.retries.clear();
        }
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut task) = task {
            task.shutdown().await;
        }
    }
}

fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends each kept release again when due, all due ones at once, until
/// shutdown is asked for.
async fn send_again(
    primaries: Arc<Primaries>,
    queue: Arc<Mutex<Queue>>,
    kept: Arc<Notify>,
    mut shutdown: ShutdownSignal,
) {
    loop {
        let next = lock(&queue).retries.iter().map(|r| r.next).min();
        tokio::select! {
            () = shutdown.requested() => return,
            () = kept.notified() => continue,
            () = sleep_until(next) => {}
        }
        let now = Instant::now();
        let due = lock(&queue).take_due(now);
        let sent = due.len();
        let mut calls = JoinSet::new();
        for retry in due {
            let primaries = Arc::clone(&primaries);
            calls.spawn(async move { send_once(&primaries, retry).await });
        }
        let round = async {
            let mut again = Vec::new();
            while let Some(done) = calls.join_next().await {
                if let Ok(Some(retry)) = done {
                    again.push(retry);
                }
            }
            again
        };
        let again = tokio::select! {
            () = shutdown.requested() => return,
            again = round => again,
        };
        lock(&queue).put_back(sent, again);
    }
}

/// Sleeps until `next`, or for ever when nothing is kept.
async fn sleep_until(next: Option<Instant>) {
    match next {
        Some(next) => tokio::time::sleep_until(next).await,
        None => std::future::pending().await,
    }
}

/// Sends one release again to the primaries it still misses; gives it
/// back to be tried again later unless every one answered or its lease
/// will have ended by then.
async fn send_once(primaries: &Primaries, mut retry: Retry) -> Option<Retry> {
    let release = &retry.release;
    let answers = primaries
        .on(release.missed.iter().copied(), |primary| {
            let (keys, owner_id) = (Arc::clone(&release.keys), Arc::clone(&release.owner_id));
            release_on(primary, keys, owner_id, release.announce)
        })
        .await;
    for (index, answer) in answers {
        if answer.is_ok() {
            retry.release.missed.retain(|&m| m != index);
        }
    }
    let lock = retry.release.keys.owner();
    if retry.release.missed.is_empty() {
        tracing::debug!(
            lock,
            "RedLock: a release reached the primaries it had missed"
        );
        return None;
    }
    retry.pause = (retry.pause * 2).min(MAX_PAUSE);
    retry.next = Instant::now() + retry.pause;
    if retry.next >= retry.until {
        tracing::debug!(
            lock,
            unreached = retry.release.missed.len(),
            "RedLock: a release still missed primaries when its lease ended"
        );
        return None;
    }
    Some(retry)
}

/// Runs `redlock_release.lua` for `owner_id` on one primary: whether it
/// deleted the owner id's key.
pub(crate) async fn release_on(
    primary: Arc<Primary>,
    keys: Arc<RedLockKeys>,
    owner_id: Arc<str>,
    announce: bool,
) -> Result<bool, PrimaryFailure> {
    let channel = if announce { keys.channel() } else { "" };
    let release = RedlockRelease {
        owner_id: &owner_id,
        channel,
    };
    call(&primary, &[keys.owner()], &release).await
}

#[cfg(test)]
mod tests {
    use fairlock_core::{KeyPrefix, LockName};

    use super::*;

    fn retry(keys: &Arc<RedLockKeys>, next: Instant) -> Retry {
        Retry {
            release: MissedRelease {
                keys: Arc::clone(keys),
                owner_id: Arc::from("owner"),
                announce: false,
                missed: vec![0],
                lease: Duration::from_secs(30),
            },
            until: next + Duration::from_secs(30),
            next,
            pause: FIRST_PAUSE,
        }
    }

    /// Retries out being sent count against the bound until their round
    /// is over: a full queue taken out to be sent leaves no room, and the
    /// round's answered ones make room again. Before, the bound counted
    /// only the retries waiting, and the queue could hold twice it.
    #[test]
    fn retries_being_sent_count_against_the_bound() {
        let prefix = KeyPrefix::new("fairlock:redlock:").expect("prefix");
        let keys = Arc::new(RedLockKeys::new(
            &prefix,
            &LockName::new("jobs").expect("name"),
        ));
        let now = Instant::now();
        let mut queue = Queue {
            retries: (0..MAX_KEPT).map(|_| retry(&keys, now)).collect(),
            ..Queue::default()
        };
        queue
            .retries
            .push(retry(&keys, now + Duration::from_secs(1)));
        assert!(!queue.has_room());
        let due = queue.take_due(now);
        assert_eq!((due.len(), queue.retries.len()), (MAX_KEPT, 1));
        assert!(
            !queue.has_room(),
            "a release was kept while the bound's worth was being sent"
        );
        let again: Vec<Retry> = due.into_iter().take(10).collect();
        queue.put_back(MAX_KEPT, again);
        assert_eq!((queue.retries.len(), queue.sending), (11, 0));
        assert!(queue.has_room());
    }
}
