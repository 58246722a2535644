//! One acquire attempt: ask every primary for its vote, count, and keep the
//! lock only with a majority and time left.
//!
//! The steps, all within one attempt:
//!
//! 1. Note the local monotonic time, then run `redlock_acquire.lua` on every
//!    primary at once (each call bounded by the call timeout). A primary
//!    restarted less than the restart delay ago refuses to vote.
//! 2. With a majority of votes, take the fencing token over that majority
//!    and write it back to it ([`super::fencing`]).
//! 3. The validity is `lease - elapsed - drift` from the end of step 2,
//!    elapsed counted from step 1, drift = `lease * drift_factor +
//!    drift_floor`: the lock is held until `start + lease - drift`, only
//!    if the validity is positive; the holder must finish before it ends
//!    (the guard's `validity()`).
//! 4. Otherwise give every vote back, on every primary (a vote whose reply
//!    was lost may still have landed). Only an attempt that had won a
//!    majority announces the release: a minority blocked nobody.
//!
//! If the attempt is dropped half way (its future cancelled), a guard gives
//! the votes back in the background.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock_core::{RedLockKeys, RedlockAcquire, Vote};

use crate::error::PrimaryFailure;

use super::fencing::{token_from_floors, write_back};
use super::primaries::{call, restarted_recently};
use super::release_retries::{release_on, MissedRelease};
use super::shared::Shared;

/// A won majority.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Won {
    /// The grant's fencing token.
    pub(crate) token: u64,
    /// Until when the lock is safely held: the attempt's start plus the
    /// lease less the drift allowance (every key was set after the start).
    pub(crate) deadline: Instant,
}

/// How an attempt ended.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// The caller holds the lock.
    Won(Won),
    /// Another owner holds a majority; it loses it (if not renewed) after
    /// `expires_in`.
    Held { expires_in: Option<Duration> },
    /// A majority answered but no one won it (votes split between
    /// contenders): try again soon.
    Split,
    /// A majority was won, but the lease was used up by the time it was:
    /// the lease is too short for these primaries.
    NoValidity { elapsed: Duration },
    /// Fewer than a majority of primaries could vote.
    NoQuorum {
        answered: usize,
        failures: Vec<PrimaryFailure>,
    },
}

/// Runs one attempt for `owner_id` with `lease`. The primaries its
/// give-back did not reach are added to `missed` (see [`LeftVotes`]).
pub(crate) async fn attempt(
    shared: &Arc<Shared>,
    keys: &Arc<RedLockKeys>,
    owner_id: &Arc<str>,
    lease: Duration,
    missed: &mut BTreeSet<usize>,
) -> Attempt {
    let config = &shared.config;
    let quorum = config.quorum();
    let started = Instant::now();
    let mut cleanup = VoteCleanup {
        target: Some(Votes::new(shared, keys, owner_id, lease)),
    };

    let lease_ms = millis(lease);
    let min_uptime_ms = millis(config.restart_delay);
    let votes = shared
        .primaries
        .on_all(|primary| {
            let keys = Arc::clone(keys);
            let owner_id = Arc::clone(owner_id);
            async move {
                let acquire = RedlockAcquire {
                    owner_id: &owner_id,
                    lease_ms,
                    min_uptime_ms,
                };
                call(&primary, &[keys.owner(), keys.seq()], &acquire).await
            }
        })
        .await;

    let mut granted: Vec<(usize, u64)> = Vec::new();
    let mut held: HashMap<String, Vec<i64>> = HashMap::new();
    let mut failures = Vec::new();
    for (index, vote) in votes {
        match vote {
            Ok(Vote::Granted { floor }) => granted.push((index, floor)),
            Ok(Vote::Held { pttl_ms, holder }) => held.entry(holder).or_default().push(pttl_ms),
            Ok(Vote::TooYoung { uptime_ms }) => {
                if let Some(primary) = shared.primaries.all().get(index) {
                    failures.push(primary.failure(restarted_recently(uptime_ms)));
                }
            }
            Err(failure) => failures.push(failure),
        }
    }
    let answered = granted.len() + held.values().map(Vec::len).sum::<usize>();

    if granted.len() >= quorum {
        let token = token_from_floors(granted.iter().map(|(_, floor)| *floor));
        let indexes: Vec<usize> = granted.iter().map(|(index, _)| *index).collect();
        let (confirmed, mut lost) = write_back(&shared.primaries, &indexes, keys, token).await;
        match deadline_left(started, lease, config.drift(lease)) {
            Some(deadline) if confirmed.len() >= quorum => {
                cleanup.disarm();
                return Attempt::Won(Won { token, deadline });
            }
            Some(_) => {
                missed.extend(cleanup.give_back(true).await);
                if answered.saturating_sub(lost.len()) < quorum {
                    failures.append(&mut lost);
                    return Attempt::NoQuorum { answered, failures };
                }
                return Attempt::Split;
            }
            None => {
                missed.extend(cleanup.give_back(true).await);
                return Attempt::NoValidity {
                    elapsed: started.elapsed(),
                };
            }
        }
    }

    // Not won: give back whatever this attempt took.
    if !granted.is_empty() || !failures.is_empty() {
        missed.extend(cleanup.give_back(false).await);
    } else {
        cleanup.disarm();
    }
    if answered < quorum {
        return Attempt::NoQuorum { answered, failures };
    }
    // The owner with the most votes: if it has a majority, it loses it when
    // its (count - quorum + 1)-th earliest key expires.
    let leader = held.into_values().max_by_key(Vec::len);
    match leader {
        Some(mut pttls) if pttls.len() >= quorum => {
            pttls.sort_unstable();
            let expires_in = pttls
                .get(pttls.len() - quorum)
                .and_then(|ms| u64::try_from(*ms).ok())
                .map(Duration::from_millis);
            Attempt::Held { expires_in }
        }
        _ => Attempt::Split,
    }
}

/// An acquire's votes: the lock, the owner id they were cast for, and the
/// lease they were asked with.
struct Votes {
    shared: Arc<Shared>,
    keys: Arc<RedLockKeys>,
    owner_id: Arc<str>,
    lease: Duration,
}

impl Votes {
    fn new(
        shared: &Arc<Shared>,
        keys: &Arc<RedLockKeys>,
        owner_id: &Arc<str>,
        lease: Duration,
    ) -> Self {
        Self {
            shared: Arc::clone(shared),
            keys: Arc::clone(keys),
            owner_id: Arc::clone(owner_id),
            lease,
        }
    }
}

/// Gives an attempt's votes back unless disarmed: on every path that did
/// not win, and when the attempt's future is dropped half way.
struct VoteCleanup {
    target: Option<Votes>,
}

impl VoteCleanup {
    fn disarm(&mut self) {
        self.target = None;
    }

    /// Gives the votes back now; `announce` wakes waiters (only when the
    /// attempt had a majority, which blocked them). Returns the primaries
    /// it missed, not sent it again here: the acquire may go on with
    /// another attempt under the same owner id, whose vote there a late
    /// release would delete ([`LeftVotes`] sends it once the acquire ends).
    async fn give_back(&mut self, announce: bool) -> Vec<usize> {
        let Some(votes) = self.target.take() else {
            return Vec::new();
        };
        let (_, _, failures) =
            release_everywhere(&votes.shared, &votes.keys, &votes.owner_id, announce, None).await;
        missed_primaries(&votes.shared, &failures)
    }
}

impl Drop for VoteCleanup {
    fn drop(&mut self) {
        if let Some(votes) = self.target.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    // The acquire was dropped: its owner id votes no more.
                    let Votes {
                        shared,
                        keys,
                        owner_id,
                        lease,
                    } = votes;
                    release_everywhere(&shared, &keys, &owner_id, true, Some(lease)).await;
                });
            }
        }
    }
}

/// Gives `owner_id`'s votes back on every primary in a task of its own: a
/// won majority that no guard will hold.
pub(crate) fn give_back_later(
    shared: &Arc<Shared>,
    keys: &Arc<RedLockKeys>,
    owner_id: &Arc<str>,
    lease: Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (shared, keys, owner_id) = (Arc::clone(shared), Arc::clone(keys), Arc::clone(owner_id));
    runtime.spawn(async move {
        release_everywhere(&shared, &keys, &owner_id, true, Some(lease)).await;
    });
}

/// Runs `redlock_release.lua` for `owner_id` on every primary; returns how
/// many primaries answered and how many deleted the owner id's key. With
/// `retry_for` (the keys' lease), the primaries it missed get it again
/// later: only for an owner id that will never vote again.
pub(crate) async fn release_everywhere(
    shared: &Shared,
    keys: &Arc<RedLockKeys>,
    owner_id: &Arc<str>,
    announce: bool,
    retry_for: Option<Duration>,
) -> (usize, usize, Vec<PrimaryFailure>) {
    let answers = shared
        .primaries
        .on_all(|primary| release_on(primary, Arc::clone(keys), Arc::clone(owner_id), announce))
        .await;
    let mut answered = 0;
    let mut deleted = 0;
    let mut failures = Vec::new();
    for (_, answer) in answers {
        match answer {
            Ok(was_ours) => {
                answered += 1;
                deleted += usize::from(was_ours);
            }
            Err(failure) => failures.push(failure),
        }
    }
    if !failures.is_empty() {
        tracing::warn!(
            lock = keys.owner(),
            unreached = failures.len(),
            primaries = shared.primaries.len(),
            "RedLock: a release did not reach every primary"
        );
    }
    // Until the key on those primaries is released or ends with its lease,
    // a minority's key can split other callers' votes: the release is sent
    // there again (`release_retries.rs`), where `retry_for` (the keys'
    // lease) is given, except to a primary refused as another one's server.
    if let Some(lease) = retry_for {
        let missed = missed_primaries(shared, &failures);
        shared.release_retries.keep(
            &shared.primaries,
            MissedRelease {
                keys: Arc::clone(keys),
                owner_id: Arc::clone(owner_id),
                announce,
                missed,
                lease,
            },
        );
    }
    (answered, deleted, failures)
}

/// The primaries of `failures` a release may still reach: not those
/// refused as another one's server.
fn missed_primaries(shared: &Shared, failures: &[PrimaryFailure]) -> Vec<usize> {
    let all = shared.primaries.all();
    failures
        .iter()
        .map(|failure| failure.index)
        .filter(|&index| all.get(index).is_some_and(|p| !p.is_refused()))
        .collect()
}

/// The primaries an acquire's attempts gave their votes back to without
/// reaching them. Once the acquire ends without a guard (given up,
/// refused, timed out, or its future dropped) its owner id votes no more,
/// and the release is sent to them again (`release_retries.rs`); a won
/// acquire's guard releases on every primary itself.
pub(crate) struct LeftVotes {
    votes: Votes,
    /// Cleared once the acquire won.
    armed: bool,
    /// The primaries missed so far.
    pub(crate) missed: BTreeSet<usize>,
}

impl LeftVotes {
    pub(crate) fn new(
        shared: &Arc<Shared>,
        keys: &Arc<RedLockKeys>,
        owner_id: &Arc<str>,
        lease: Duration,
    ) -> Self {
        Self {
            votes: Votes::new(shared, keys, owner_id, lease),
            armed: true,
            missed: BTreeSet::new(),
        }
    }

    /// The acquire won: its guard releases on every primary.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for LeftVotes {
    fn drop(&mut self) {
        if !self.armed || self.missed.is_empty() {
            return;
        }
        let votes = &self.votes;
        votes.shared.release_retries.keep(
            &votes.shared.primaries,
            MissedRelease {
                keys: Arc::clone(&votes.keys),
                owner_id: Arc::clone(&votes.owner_id),
                announce: true,
                missed: std::mem::take(&mut self.missed).into_iter().collect(),
                lease: votes.lease,
            },
        );
    }
}

/// The end of a lock's validity for keys set (or renewed) with `lease` by
/// a round that began at `started` and has just been answered: `started +
/// lease - drift` (no key was set before `started`), if any of it is left
/// now (RedLock's `lease - elapsed - drift` still positive).
pub(crate) fn deadline_left(started: Instant, lease: Duration, drift: Duration) -> Option<Instant> {
    // The lease as the scripts set it, in whole milliseconds.
    let lease = Duration::from_millis(millis(lease));
    let validity = lease.checked_sub(drift)?;
    let deadline = started + validity;
    (deadline > Instant::now()).then_some(deadline)
}

/// A duration in whole milliseconds, for a script.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
