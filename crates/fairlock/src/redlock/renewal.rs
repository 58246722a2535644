//! Keeping a RedLock lease: renewal by majority, and the lease-lost signal.
//!
//! A grant's status is one value, [`HoldStatus`]: until when the lock is
//! safely held (by the local monotonic clock) and whether it is known lost.
//! A fixed lease never moves its deadline. A watchdog lease is renewed every
//! third of the lease by [`LeaseWatchdog`]: `redlock_renew.lua` on every
//! primary at once (it also takes the key back on a primary where it is
//! missing and free, so a holder survives the loss of a minority); when a
//! majority confirmed in time, the deadline moves to `round start + lease -
//! drift` (if the round left `lease - elapsed - drift` of it), as for an
//! acquire. A round
//! confirmed by fewer than a majority (primaries down or slow) is tried
//! again every [`RETRY_PAUSE`] while the validity lasts: until it ends
//! nobody else can hold a majority, so a retry is as safe as the round.
//! Once the deadline has passed without a confirmed round (or passed
//! before a round began: the process was paused), the lock is marked lost
//! and the watchdog stops: a later success could not prove the lock was
//! not held by another meanwhile.
//!
//! Metrics, as the single-primary watchdog records them: one renewal per
//! round by its result (`renewed`, `error` for a round a majority did not
//! confirm, `lost` for one a majority refused), and the lease lost once
//! per grant, by whoever first finds it lost: the watchdog
//! ([`mark_lost`]), or the guard when its validity ran out unnoticed
//! ([`lost_by_now`]; a fixed lease has no watchdog). A round that raced
//! the guard's release counts nothing; nor does anything after
//! `RedLock::close`: the watchdog stops and the lease runs out, as
//! `LockClient`'s do after `shutdown()`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock_core::{RedLockKeys, RedlockRenew};
use tokio::sync::watch;

use crate::task::BackgroundTask;
use crate::telemetry::{lease_renewals, LockTelemetry};

use super::primaries::call;
use super::quorum::{deadline_left, millis};
use super::shared::Shared;

/// How soon an unconfirmed renewal round is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Whether and until when a grant is held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HoldStatus {
    /// The end of the validity, by the local monotonic clock.
    pub(crate) deadline: Instant,
    /// Known lost (a failed renewal, or released).
    pub(crate) lost: bool,
    /// Released (or its guard dropped): nothing about it is counted any
    /// more.
    pub(crate) released: bool,
    /// Its lost lease was counted (once per grant).
    pub(crate) lost_counted: bool,
}

impl HoldStatus {
    pub(crate) fn is_lost(&self) -> bool {
        self.lost || Instant::now() >= self.deadline
    }

    /// Notes that the lease is lost: `true` if it is the first to, and the
    /// loss is to be counted (not after a release).
    fn first_to_count_loss(&mut self) -> bool {
        if self.lost_counted || self.released {
            return false;
        }
        self.lost_counted = true;
        true
    }
}

/// Marks the grant lost (the watchdog found so), counting the lost lease
/// unless counted already: before the guard's `lost()` wakes, so whoever
/// sees the signal finds it counted.
pub(crate) fn mark_lost(status: &watch::Sender<HoldStatus>, telemetry: &LockTelemetry) {
    status.send_if_modified(|s| {
        if s.first_to_count_loss() {
            telemetry.lease_lost();
        }
        !std::mem::replace(&mut s.lost, true)
    });
}

/// Whether the grant is lost (known lost, or its validity ran out);
/// counts the lost lease if nobody did yet (a fixed lease, which has no
/// watchdog, or a watchdog that has not looked yet), unless the client
/// is `closed` (its leases run out by design, as `LockClient`'s after
/// `shutdown()`). Changes nothing else: a renewal round in flight may
/// still confirm the lock.
pub(crate) fn lost_by_now(
    status: &watch::Sender<HoldStatus>,
    telemetry: &LockTelemetry,
    closed: bool,
) -> bool {
    let (mut lost, mut count) = (false, false);
    // Only the bookkeeping of the count changes: nobody is notified.
    status.send_if_modified(|s| {
        lost = s.is_lost();
        count = lost && !closed && s.first_to_count_loss();
        false
    });
    if count {
        telemetry.lease_lost();
    }
    lost
}

/// The renewal loop of one watchdog-kept grant.
pub(crate) struct LeaseWatchdog;

impl LeaseWatchdog {
    /// Starts renewing `owner_id`'s hold of `keys` every third of `lease`.
    pub(crate) fn spawn(
        shared: Arc<Shared>,
        keys: Arc<RedLockKeys>,
        owner_id: Arc<str>,
        lease: Duration,
        status: Arc<watch::Sender<HoldStatus>>,
        telemetry: LockTelemetry,
    ) -> BackgroundTask {
        BackgroundTask::spawn("redlock watchdog", move |mut stop| async move {
            let interval = lease / 3;
            let mut wait = interval;
            loop {
                tokio::select! {
                    () = stop.requested() => return,
                    () = tokio::time::sleep(wait) => {}
                }
                if shared.is_closed() {
                    // The connections are gone: the lease runs out, and
                    // neither the failed renewals nor the loss is counted.
                    return;
                }
                if status.borrow().is_lost() {
                    if wait != interval {
                        tracing::warn!(
                            lock = keys.owner(),
                            "RedLock: no renewal was confirmed by a majority before the validity ended; the lease is lost"
                        );
                    }
                    mark_lost(&status, &telemetry);
                    return;
                }
                let round = in_time(
                    renew(&shared, &keys, &owner_id, lease).await,
                    &status.borrow(),
                );
                if status.borrow().released || shared.is_closed() {
                    // The round raced the guard's release or the client's
                    // close: not counted.
                    return;
                }
                match round {
                    Round::Confirmed(deadline) => {
                        lease_renewals("renewed", 1);
                        status.send_modify(|s| s.deadline = deadline);
                        wait = interval;
                    }
                    Round::Unanswered => {
                        lease_renewals("error", 1);
                        tracing::warn!(
                            lock = keys.owner(),
                            "RedLock: a renewal was not confirmed by a majority; trying again while the lease is valid"
                        );
                        wait = RETRY_PAUSE.min(interval);
                    }
                    Round::Late => {
                        lease_renewals("error", 1);
                        tracing::warn!(
                            lock = keys.owner(),
                            "RedLock: a renewal was confirmed by a majority too late (after the validity it was to extend ended, or leaving none); the lease is lost"
                        );
                        mark_lost(&status, &telemetry);
                        return;
                    }
                    Round::Refused => {
                        lease_renewals("lost", 1);
                        tracing::warn!(
                            lock = keys.owner(),
                            "RedLock: a majority of primaries no longer has this grant; the lease is lost"
                        );
                        mark_lost(&status, &telemetry);
                        return;
                    }
                }
            }
        })
    }
}

/// A round as it stands once answered: a majority's confirmation counts
/// only if it came while the validity it extends still held (`status`'s
/// deadline not passed). One answered later may have reached primaries
/// after their keys expired, and another client may have held a majority
/// in between: the lease is lost (`Late`), never revived (the guard's
/// `lost()` may have fired already).
fn in_time(round: Round, status: &HoldStatus) -> Round {
    match round {
        Round::Confirmed(_) if status.is_lost() => Round::Late,
        round => round,
    }
}

/// What one renewal round found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// A majority confirmed in time: the new deadline.
    Confirmed(Instant),
    /// Too few confirmed, but primaries that did not answer (down, slow)
    /// could still make a majority: worth trying again.
    Unanswered,
    /// Too many primaries answered that the key is another's: no retry can
    /// make a majority.
    Refused,
    /// A majority confirmed, but the round took the whole validity.
    Late,
}

/// One renewal round.
async fn renew(
    shared: &Arc<Shared>,
    keys: &Arc<RedLockKeys>,
    owner_id: &Arc<str>,
    lease: Duration,
) -> Round {
    let started = Instant::now();
    let lease_ms = millis(lease);
    let answers = shared
        .primaries
        .on_all(|primary| {
            let keys = Arc::clone(keys);
            let owner_id = Arc::clone(owner_id);
            async move {
                let renew = RedlockRenew {
                    owner_id: &owner_id,
                    lease_ms,
                };
                call(&primary, &[keys.owner()], &renew).await
            }
        })
        .await;
    let confirmed = answers
        .iter()
        .filter(|(_, answer)| matches!(answer, Ok(true)))
        .count();
    let refused = answers
        .iter()
        .filter(|(_, answer)| matches!(answer, Ok(false)))
        .count();
    let quorum = shared.config.quorum();
    if confirmed < quorum {
        return if shared.primaries.len() - refused < quorum {
            Round::Refused
        } else {
            Round::Unanswered
        };
    }
    match deadline_left(started, lease, shared.config.drift(lease)) {
        Some(deadline) => Round::Confirmed(deadline),
        None => Round::Late,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{in_time, HoldStatus, Round};

    fn held_until(deadline: Instant) -> HoldStatus {
        HoldStatus {
            deadline,
            lost: false,
            released: false,
            lost_counted: false,
        }
    }

    /// A confirmation answered after the validity it was to extend ended
    /// is a lost lease, not a renewed one: before, it moved the deadline
    /// on, and a guard whose `lost()` had fired held again.
    #[test]
    fn a_confirmation_after_the_validity_ended_does_not_revive_the_lease() {
        let now = Instant::now();
        let new_deadline = now + Duration::from_secs(2);
        let ended = held_until(now.checked_sub(Duration::from_millis(10)).expect("past"));
        assert_eq!(in_time(Round::Confirmed(new_deadline), &ended), Round::Late);
        let holding = held_until(now + Duration::from_secs(1));
        assert_eq!(
            in_time(Round::Confirmed(new_deadline), &holding),
            Round::Confirmed(new_deadline)
        );
        let mut lost = holding;
        lost.lost = true;
        assert_eq!(in_time(Round::Confirmed(new_deadline), &lost), Round::Late);
        assert_eq!(in_time(Round::Unanswered, &ended), Round::Unanswered);
    }
}
