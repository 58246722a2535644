//! Acquiring a lock, or a permit of a semaphore or read-write lock: one
//! script call, then (if queued) a wait for the grant, which arrives
//! already made: the releasing script made this waiter the owner, with its
//! own lease, before waking it. Locks and permits share this one loop; they
//! differ only in their owner id, their script and their renewal
//! ([`Request`]).
//!
//! Waiting costs Redis nothing per waiter: the wait has no timer of its
//! own besides the caller's wait timeout. The process's heartbeat (one call
//! per 32 locks waited on) keeps the waiter alive, re-delivers a grant
//! whose message was lost, and asks the waiter to re-run acquire if the
//! queue lost it.
//!
//! Cancellation safety lives in [`PendingAcquire`]: until a grant is taken,
//! dropping the acquire future at any await point deregisters the waiter
//! and runs `cancel.lua`, which removes the queue entry and, if a grant
//! raced the cancellation, hands the lock on at once. The cancel always
//! runs after any acquire call it races: both travel one pipelined
//! connection in order, or, if the acquire went on the script socket
//! and its reply was never read, the cancel is written behind it there
//! (`redis/script_socket/`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tracing::Instrument;

use fairlock_core::{
    Acquire, AcquireMode, AcquireReply, LockKeys, LockName, PermitAcquire, PermitRenewBatch,
    PermitRenewItem, PermitRequest, ProtocolError, RenewBatch, RenewItem, RenewStatus,
};

use crate::config::{millis, Lease, LockOptions};
use crate::error::{Error, Result};
use crate::held::{Grant, HeldLock};
use crate::redis::ReconnectMark;
use crate::state::{ClientState, Replication};
use crate::telemetry::LockTelemetry;
use crate::waiters::{WaiterEvent, WaiterSlot};

/// Whether the caller waits in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Wait,
    Try,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Wait => "wait",
            Mode::Try => "try",
        }
    }

    fn script_mode(self) -> AcquireMode {
        match self {
            Mode::Wait => AcquireMode::Wait,
            Mode::Try => AcquireMode::Try,
        }
    }
}

/// What a caller asks for: the lock itself, or a permit of a semaphore or
/// read-write lock (whose keys are then a permit set's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    Lock,
    Permit(PermitRequest),
}

impl Request {
    /// How many such requests one turn of the queue can grant together:
    /// one for a lock or a writer, as many as share the set for a
    /// semaphore permit or a reader (admission counts turns, not places).
    fn per_turn(self) -> u64 {
        match self {
            Request::Lock | Request::Permit(PermitRequest::Exclusive) => 1,
            Request::Permit(PermitRequest::Shared(permits)) => u64::from(permits.max(1)),
        }
    }
}

/// Takes lock `name`: the grant, or `None` if `mode` is try and the lock is
/// busy.
pub(crate) async fn acquire(
    state: &Arc<ClientState>,
    name: impl AsRef<[u8]>,
    options: LockOptions,
    mode: Mode,
) -> Result<Option<Arc<HeldLock>>> {
    let name = LockName::new(name)?;
    let keys = state.keys_of(&name);
    acquire_keys(state, &name, keys, &options, mode).await
}

/// [`acquire`] with the keys computed already (a [`crate::Lock`] handle).
///
/// A try with a non-zero wait timeout waits for the lock up to that long,
/// in the queue like any waiter (so it never overtakes one), and ends in
/// `None` instead of [`Error::WaitTimeout`] when the time runs out.
// An `async fn` would keep its arguments twice (see `acquire_validated`).
#[allow(clippy::manual_async_fn)]
pub(crate) fn acquire_keys<'a>(
    state: &'a Arc<ClientState>,
    name: &'a LockName,
    keys: Arc<LockKeys>,
    options: &'a LockOptions,
    mode: Mode,
) -> impl Future<Output = Result<Option<Arc<HeldLock>>>> + Send + 'a {
    async move {
        options.validate()?;
        let try_waits = mode == Mode::Try && options.wait_timeout.is_some_and(|t| !t.is_zero());
        let mode = if try_waits { Mode::Wait } else { mode };
        let span = crate::telemetry::acquire_span(name.as_str(), mode.label());
        let outcome = acquire_validated(state, name, keys, options, mode, Request::Lock)
            .instrument(span)
            .await;
        match outcome {
            Err(Error::WaitTimeout { .. }) if try_waits => Ok(None),
            outcome => outcome,
        }
    }
}

/// Takes a permit of the set `keys` (named `name`) for `request`: the
/// grant, or `None` if `mode` is try and the request does not fit now or
/// someone waits. Unlike a lock's, a permit's try never waits.
// Not an `async fn`, for the reason `acquire_validated` gives.
#[allow(clippy::manual_async_fn)]
pub(crate) fn acquire_permit<'a>(
    state: &'a Arc<ClientState>,
    name: &'a str,
    keys: &'a Arc<LockKeys>,
    request: PermitRequest,
    options: &'a LockOptions,
    mode: Mode,
) -> impl Future<Output = Result<Option<Arc<HeldLock>>>> + Send + 'a {
    async move {
        options.validate()?;
        // Checked when the set's keys were made; the grant keeps it as bytes.
        let lock_name = LockName::new(name)?;
        let span = crate::telemetry::acquire_span(name, mode.label());
        acquire_validated(
            state,
            &lock_name,
            Arc::clone(keys),
            options,
            mode,
            Request::Permit(request),
        )
        .instrument(span)
        .await
    }
}

// Not an `async fn`: that would keep its arguments twice in its future (as
// arguments and as the locals they move into), and a waiting task carries
// the future for its whole wait.
#[allow(clippy::manual_async_fn)]
fn acquire_validated<'a>(
    state: &'a Arc<ClientState>,
    name: &'a LockName,
    keys: Arc<LockKeys>,
    // By reference: the caller keeps the options, and a copy here would
    // be a second one in the future a waiting task carries.
    options: &'a LockOptions,
    mode: Mode,
    request: Request,
) -> impl Future<Output = Result<Option<Arc<HeldLock>>>> + Send + 'a {
    async move {
        let telemetry = state.config.metrics_lock_label.labels(name.as_str());
        let started = Instant::now();
        let lease_len = match options.lease {
            Lease::Fixed(lease) => lease,
            Lease::Watchdog => state.config.watchdog_lease,
        };
        // Shared with the waiter registry.
        let owner_id: Arc<str> = match request {
            Request::Lock => state.new_owner_id(millis(lease_len)),
            Request::Permit(permits) => state.new_permit_owner_id(millis(lease_len), permits)?,
        }
        .into();
        let mut pending = PendingAcquire::new(state, &keys, &owner_id, &telemetry);
        // The wait timeout's timer, boxed: most waits have none, and a timer
        // kept inline would make every waiting task larger.
        let mut deadline = options
            .wait_timeout
            .filter(|_| mode == Mode::Wait)
            .map(|timeout| Box::pin(tokio::time::sleep_until((started + timeout).into())));
        let mut ticket = None;
        // When the call that drew the current ticket was sent: a handed-over
        // grant's lease is counted from here plus the server time between
        // ticket and token (see `handed_on_at`).
        let mut ticket_sent_at = started;
        // Turns of the queue ahead when this waiter joined, and when: a
        // grant rate sample.
        let mut joined: Option<(u64, Instant)> = None;
        // Whether this waiter's grants may be heard where they are not
        // published (see `ClientState::grants_heard_elsewhere`): its grant
        // then gets its own lease set, as a grant found by a heartbeat does.
        let mut heard_elsewhere = false;
        // With admission on: wakes when a new grant-rate estimate says this
        // waiter cannot make its deadline after all.
        let mut recheck: Option<Recheck<'_>> = None;
        // Subscribed before the first call that could make a grant for us.
        // A try never queues, so no grant of it comes by message: it needs
        // no subscription (and answers while none can be made, a node
        // refusing this process a new connection).
        // The rare, larger futures below are boxed: every waiting task carries
        // its acquire future for its whole wait, so it stays small.
        if mode == Mode::Wait {
            if let Err(error) = Box::pin(state.subscribe_slot(&keys, false)).await {
                return Err(pending.failed(error));
            }
        }
        let channel_prefix = state.channel_prefix(&keys);
        let grant = |token, ticket, lease_from| Grant {
            token,
            ticket,
            lease: options.lease,
            lease_len,
            lease_from,
        };

        loop {
            let sent_at = Instant::now();
            let mark = state.replication_mark();
            // The call and its reply live in their own block, so the reply is
            // out of scope during the wait below: a binding kept in scope
            // across that wait would make every waiting task carry it.
            let answer = 'call: {
                // Each call is boxed with its arguments: the waiting task's
                // future need not have room for them.
                let reply = match request {
                    Request::Lock => {
                        Box::pin(async {
                            let call = Acquire {
                                owner_id: &owner_id,
                                mode: mode.script_mode(),
                                timings: &state.timings,
                                channel_prefix: &channel_prefix,
                                // After a re-check: back in its old place if
                                // its entry was lost.
                                rejoin: ticket,
                            };
                            state.run_direct(&keys, &call, &pending.unanswered).await
                        })
                        .await
                    }
                    Request::Permit(_) => {
                        Box::pin(async {
                            let call = PermitAcquire {
                                owner_id: &owner_id,
                                mode: mode.script_mode(),
                                timings: &state.timings,
                                channel_prefix: &channel_prefix,
                                rejoin: ticket,
                            };
                            state.run_direct(&keys, &call, &pending.unanswered).await
                        })
                        .await
                    }
                };
                let reply = match reply {
                    Ok(reply) => reply,
                    // A re-check of a waiter already queued, cut off by an
                    // outage: the waiter keeps its place and waits on. Its
                    // entry is where it was, or the heartbeat finds it
                    // missing once Redis answers again and has it check
                    // again; a grant the call made meanwhile reaches it
                    // from the heartbeat, which names the holder.
                    Err(error)
                        if ticket.is_some() && error.is_outage() && state.check_open().is_ok() =>
                    {
                        // Debug, not warn: an outage can cut off every
                        // waiter's re-check at once; the heartbeat warns.
                        tracing::debug!(%error, "fairlock could not re-check a waiter's place in the queue; it keeps waiting");
                        break 'call Answer::Unchecked;
                    }
                    Err(error) => return Err(pending.failed(error)),
                };
                match reply {
                    AcquireReply::Granted { token, purged } => {
                        // As for a handed-over grant below.
                        state
                            .check_open()
                            .map_err(|closed| pending.failed(closed))?;
                        // A grant past dead waiters: count them, and go on
                        // purging if more are left (a permit may be free for
                        // a live waiter behind them).
                        state.after_purge(&keys, purged);
                        if ticket.is_some() {
                            // A waiter that queued, answered with a grant
                            // on a re-check (a permit the heartbeat found
                            // it holding, a grant whose message reached
                            // nobody): handed over from the queue, as a
                            // grant told by message is.
                            telemetry.handoff();
                            if let Some((turns_ahead, at)) = joined {
                                state
                                    .grant_rates
                                    .record(keys.owner(), turns_ahead, at.elapsed());
                            }
                        }
                        telemetry.granted(token);
                        Answer::Granted(pending.granted(name, grant(token, ticket, sent_at)), mark)
                    }
                    AcquireReply::Busy { purged } => {
                        state.after_purge(&keys, purged);
                        pending.finished();
                        telemetry.acquire_ended("busy", started);
                        return Ok(None);
                    }
                    AcquireReply::Queued {
                        ticket: queued_with,
                        position,
                        purged,
                    } => {
                        state.after_purge(&keys, purged);
                        Answer::Queued {
                            ticket: queued_with,
                            position,
                        }
                    }
                }
            };
            // Granted in the reply: awaited here, with the reply gone.
            let queued = match answer {
                Answer::Queued { ticket, position } => Some((ticket, position)),
                Answer::Granted(held, mark) => {
                    return Box::pin(replicated_or_given_back(state, held, started, mark)).await
                }
                Answer::Unchecked => None,
            };
            if let Some((queued_with, position)) = queued {
                if state.grants_heard_elsewhere(&keys) {
                    heard_elsewhere = true;
                    // A heartbeat round subscribes the slot where it is now.
                    state.heartbeat_now.notify_one();
                }
                let previous_ticket = ticket.replace(queued_with);
                if previous_ticket != Some(queued_with) {
                    ticket_sent_at = sent_at;
                }
                if previous_ticket.is_none() {
                    // Counted before admission's verdict: a call it refuses
                    // did join the queue (then left it), and an overload
                    // it sheds must still show as contention and depth.
                    telemetry.contended(position, queued_with);
                    let turns_ahead = position / request.per_turn();
                    joined = Some((turns_ahead, sent_at));
                    let join = Join {
                        position,
                        turns_ahead,
                        at: sent_at,
                    };
                    // The refusal is moved into the boxed cancel at once, so no
                    // error is kept inline in the waiting future.
                    let refusal = admission_refused(state, &keys, name, *options, join, started)
                        .map(|error| Box::pin(pending.give_up(error, "refused")));
                    if let Some(refusal) = refusal {
                        return Err(refusal.await);
                    }
                    if options.admission && options.wait_timeout.is_some() {
                        recheck = Some(Box::pin(admission_recheck(
                            state, &keys, name, *options, join, started,
                        )));
                    }
                    tracing::debug!(
                        ticket = queued_with,
                        position,
                        "fairlock waiting in the queue"
                    );
                }
                state.waiters.mark_queued(&owner_id, queued_with);
            }

            // Polled in place (no future of its own kept across the wait): the
            // slot first, so a grant that came with the timeout is taken.
            // Only what happened is returned; the awaits come after, so no
            // error is kept inline while the caller waits.
            let woken =
                std::future::poll_fn(|cx| poll_woken(&pending, &mut deadline, &mut recheck, cx))
                    .await;
            let event = match woken {
                Woken::Event(event) => event,
                Woken::TimedOut => {
                    let timeout = Error::WaitTimeout {
                        name: name.to_string(),
                        waited: started.elapsed(),
                    };
                    return Err(Box::pin(pending.give_up(timeout, "timeout")).await);
                }
                Woken::Refused(error) => {
                    return Err(Box::pin(pending.give_up(*error, "refused")).await);
                }
            };
            if let WaiterEvent::Granted { token, confirm } = event {
                // A grant that came as the client closes goes on (the cancel
                // hands it to the next waiter): no guard of a closed client
                // could renew or release it.
                state
                    .check_open()
                    .map_err(|closed| pending.failed(closed))?;
                let taken_at = Instant::now();
                let handed_on = handed_on_at(ticket, ticket_sent_at, token, taken_at);
                // With replica acknowledgement on, the waiter writes once (its
                // own lease) so that WAIT on its connection covers the handoff
                // that came before it in the replication stream. A grant the
                // estimate puts more than half its lease in the past is asked
                // about too: the process may have taken it late (a stalled
                // runtime), or the counter may run ahead of the server clock
                // (tokens then step by one, and their difference says
                // nothing of the time between), and Redis knows which.
                let confirm = confirm
                    || heard_elsewhere
                    || state.config.replica_acks.is_some()
                    || taken_at.saturating_duration_since(handed_on) * 2 > lease_len;
                // A confirmed grant's lease is set again from now; otherwise
                // it runs from when the releasing script drew the token.
                let lease_from = if confirm { taken_at } else { handed_on };
                let mark = state.replication_mark();
                let still_held = if confirm {
                    Box::pin(confirm_lease(state, &keys, &owner_id, token, lease_len)).await
                } else {
                    Ok(true)
                };
                if !still_held.map_err(|error| pending.failed(error))? {
                    // The short lease of an unheard grant ran out first: the
                    // lock went on; queue again.
                    telemetry.recheck();
                    continue;
                }
                telemetry.handoff();
                telemetry.granted(token);
                if let Some((turns_ahead, at)) = joined {
                    state
                        .grant_rates
                        .record(keys.owner(), turns_ahead, at.elapsed());
                }
                tracing::debug!(token, "fairlock lock handed on to this waiter");
                let held = pending.granted(name, grant(token, ticket, lease_from));
                if state.config.replica_acks.is_none() {
                    return Ok(Some(held));
                }
                // Held to the same acknowledgement as a grant in the reply.
                return Box::pin(replicated_or_given_back(state, held, started, mark)).await;
            }
            // Woken by `shutdown()`: ends with `Closed`, not counted as a
            // recheck of the wait.
            state
                .check_open()
                .map_err(|closed| pending.failed(closed))?;
            // Recheck: the queue may have lost us; acquire keeps our place if
            // we still have one, and queues us again otherwise.
            telemetry.recheck();
        }
    }
}

/// When, by this process's clock, the releasing script most likely set a
/// handed-over grant's lease, never later than it did: tickets and tokens
/// are drawn from one counter that follows the server clock in µs, so
/// `token - ticket` is the server time from the enqueue to the handoff,
/// and the enqueue ran after the call that drew the ticket was sent. So a
/// process that took the grant late (a stalled runtime, a starved CPU)
/// does not count a whole lease from then. Never later than `taken_at`;
/// `taken_at` if the numbers do not fit (a token below the ticket, after
/// a fail-over to a server whose clock is behind). Too early while the
/// counter runs ahead of the server clock (each draw then adds one), so
/// an estimate past half the lease is confirmed in Redis instead.
fn handed_on_at(
    ticket: Option<u64>,
    ticket_sent_at: Instant,
    token: u64,
    taken_at: Instant,
) -> Instant {
    ticket
        .and_then(|ticket| token.checked_sub(ticket))
        .and_then(|server_us| ticket_sent_at.checked_add(Duration::from_micros(server_us)))
        .map_or(taken_at, |at| at.min(taken_at))
}

/// What one acquire call answered, with the reply itself gone: a waiting
/// task keeps only this across its wait.
enum Answer {
    /// The caller holds the lock, granted by a call sent at the mark.
    Granted(Arc<HeldLock>, ReconnectMark),
    /// The caller waits in the queue with `ticket`, `position` ahead.
    Queued { ticket: u64, position: u64 },
    /// A re-check that an outage cut off: the caller waits on as it was.
    Unchecked,
}

/// What ended one wait in the queue. The refusal is boxed, so the select
/// that yields it stays small while nothing has happened yet.
enum Woken {
    /// The waiter's slot was told something (a grant, or to check again).
    Event(WaiterEvent),
    /// The wait timeout ran out.
    TimedOut,
    /// Admission found the deadline out of reach.
    Refused(Box<Error>),
}

/// The grant of an acquire in [`Mode::Wait`], which ends in a grant or an
/// error: `acquire.lua` never answers "busy" to a waiting caller, so a
/// `None` here means the script in Redis broke its header's promise.
pub(crate) fn waited_grant<T>(outcome: Option<T>) -> Result<T> {
    outcome.ok_or_else(|| {
        Error::Protocol(ProtocolError {
            script: "acquire",
            detail: "answered busy to a caller that waits in the queue".to_owned(),
        })
    })
}

/// Where a waiter joined the queue: the callers ahead, the turns of the
/// queue before its own (see [`Request::per_turn`]), and when.
#[derive(Clone, Copy)]
struct Join {
    position: u64,
    turns_ahead: u64,
    at: Instant,
}

/// Deadline-aware admission (see [`LockOptions::admission`]): the error to
/// fail with if the holder's turn and those of the callers ahead when this
/// waiter joined cannot all pass, at the lock's current pace, before its
/// wait timeout runs out. The turns ahead count the callers ahead, not the
/// holder, a turn granting as many requests as fit together (one on a
/// lock), so the expected wait is `(turns ahead + 1) × per turn`, as each
/// sample was taken (`GrantRates::record`).
fn admission_refused(
    state: &ClientState,
    keys: &LockKeys,
    name: &LockName,
    options: LockOptions,
    join: Join,
    started: Instant,
) -> Option<Error> {
    let timeout = options.wait_timeout.filter(|_| options.admission)?;
    let per_grant = state.grant_rates.per_grant(keys.owner())?;
    let turns = u32::try_from(join.turns_ahead.saturating_add(1)).unwrap_or(u32::MAX);
    let expected = per_grant.saturating_mul(turns);
    let budget = timeout.saturating_sub(join.at.saturating_duration_since(started));
    (expected > budget).then(|| Error::WouldMissDeadline {
        name: name.to_string(),
        position: join.position,
        per_grant,
        expected,
        budget,
    })
}

/// The admission re-check of one waiter, boxed: only callers that asked
/// for admission carry it.
type Recheck<'a> = Pin<Box<dyn Future<Output = Error> + Send + 'a>>;

/// Waits for the grant-rate estimates to change and checks admission again
/// each time, with the position the waiter joined at: resolves to the
/// refusal once it would miss its deadline, never otherwise. A burst that
/// queued before the lock had any estimate is told within one grant of
/// the first estimate, not when its timeouts run out.
async fn admission_recheck(
    state: &ClientState,
    keys: &LockKeys,
    name: &LockName,
    options: LockOptions,
    join: Join,
    started: Instant,
) -> Error {
    let mut heard = state.grant_rates.announcements();
    loop {
        if let Some(error) = admission_refused(state, keys, name, options, join, started) {
            return error;
        }
        if heard.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// What ends a wait in the queue, if anything has: an event in the
/// waiter's slot, the wait timeout's timer, admission's re-check refusing.
fn poll_woken(
    pending: &PendingAcquire<'_>,
    deadline: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    recheck: &mut Option<Recheck<'_>>,
    cx: &mut Context<'_>,
) -> Poll<Woken> {
    if let Poll::Ready(event) = pending.poll_event(cx) {
        return Poll::Ready(Woken::Event(event));
    }
    if let Some(Poll::Ready(())) = deadline.as_mut().map(|sleep| sleep.as_mut().poll(cx)) {
        return Poll::Ready(Woken::TimedOut);
    }
    match recheck.as_mut().map(|recheck| recheck.as_mut().poll(cx)) {
        Some(Poll::Ready(error)) => Poll::Ready(Woken::Refused(Box::new(error))),
        _ => Poll::Pending,
    }
}

/// With replica acknowledgement on, keeps the grant only once enough
/// replicas have it; otherwise gives it back (the next waiter gets it) and
/// fails with [`Error::NotReplicated`]. Dropped before the replicas have
/// answered (the caller gave up waiting), it gives the grant back too:
/// no guard exists yet that could.
async fn replicated_or_given_back(
    state: &Arc<ClientState>,
    held: Arc<HeldLock>,
    started: Instant,
    since: ReconnectMark,
) -> Result<Option<Arc<HeldLock>>> {
    if state.config.replica_acks.is_none() {
        // Counted as acquired when granted.
        return Ok(Some(held));
    }
    // `shutdown()` waits for the acknowledgement and the give-back below,
    // rather than quitting the connections under them.
    let _settling = state.delaying_shutdown();
    let mut unconfirmed = Unconfirmed {
        state,
        held: Some(held),
        started,
    };
    match grant_replicated(state, unconfirmed.held(), since).await {
        Ok(()) if state.check_open().is_err() => {
            // Acknowledged as the client closed: no guard of a closed
            // client could renew or release it; it goes on.
            if let Some(give_back) = unconfirmed.give_back("cancelled") {
                let _ = give_back.await;
            }
            Err(Error::Closed)
        }
        Ok(()) => Ok(unconfirmed.take()),
        Err(error) => {
            // In a task of its own, so the give-back finishes even if this
            // future is dropped while it runs; awaited, so the lock is
            // free (or the next waiter's) when the error is returned.
            if let Some(give_back) = unconfirmed.give_back("error") {
                let _ = give_back.await;
            }
            Err(error)
        }
    }
}

/// A grant waiting for the replicas' acknowledgement, given back unless
/// taken out of it. Its acquire's outcome is counted when it is taken
/// (`acquired`) or given back (`error`, or `cancelled` when dropped): the
/// grant never reached the caller then, so no hold is sampled either.
struct Unconfirmed<'a> {
    state: &'a Arc<ClientState>,
    held: Option<Arc<HeldLock>>,
    started: Instant,
}

impl Unconfirmed<'_> {
    /// The grant, until taken or given back.
    fn held(&self) -> Option<&Arc<HeldLock>> {
        self.held.as_ref()
    }

    /// The replicas have the grant: the caller holds the lock.
    fn take(&mut self) -> Option<Arc<HeldLock>> {
        let held = self.held.take()?;
        held.telemetry.acquire_ended("acquired", self.started);
        Some(held)
    }

    /// Counts the acquire as `outcome` and releases the grant in a task of
    /// its own (the next waiter gets it).
    fn give_back(&mut self, outcome: &'static str) -> Option<tokio::task::JoinHandle<()>> {
        let held = self.held.take()?;
        held.telemetry.acquire_ended(outcome, self.started);
        let state = Arc::clone(self.state);
        Some(self.state.spawn_cleanup(async move {
            if let Err(error) = state.give_back_unacknowledged(&held).await {
                tracing::warn!(%error, "fairlock could not give back an unacknowledged grant");
            }
        }))
    }
}

impl Drop for Unconfirmed<'_> {
    fn drop(&mut self) {
        drop(self.give_back("cancelled"));
    }
}

/// Confirms that enough replicas have `held`'s grant, written by a call
/// sent at `since`. If a command connection was replaced between that
/// call and its `WAIT` (a reconnect, perhaps to another server behind the
/// same address or after a fail-over), the `WAIT` said nothing about the
/// grant: the grant's lease is written again on the connection now in use
/// (a renewal, which finds the grant gone if that server does not have
/// it, and then fails with [`Error::NotReplicated`]) and that write is
/// confirmed instead; a few times at most.
async fn grant_replicated(
    state: &ClientState,
    held: Option<&Arc<HeldLock>>,
    mut since: ReconnectMark,
) -> Result<()> {
    let Some(held) = held else {
        return Ok(());
    };
    let mut rewrites = 0;
    loop {
        if let Replication::Confirmed = state.confirm_replicated_unless_reconnected(since).await? {
            return Ok(());
        }
        if rewrites == GRANT_REWRITES {
            break;
        }
        rewrites += 1;
        since = state.replication_mark();
        let sent = Instant::now();
        let lease = held.current_lease();
        if !Box::pin(confirm_lease(
            state,
            &held.keys,
            &held.owner_id,
            held.token,
            lease,
        ))
        .await?
        {
            // The server written to now does not have the grant.
            break;
        }
        held.lease_set(sent, lease);
    }
    Err(state.not_replicated(0))
}

/// How many times [`grant_replicated`] writes a grant again after a
/// reconnect before it gives up.
const GRANT_REWRITES: usize = 3;

/// Sets the waiter's own lease on a grant a heartbeat found or a release
/// here saw go unheard (its message reached nobody, and the script then
/// gave it a short lease). `false` if that grant (`token`) is gone
/// already, also when the owner id holds a later grant by then (an older
/// grant delivered late): the waiter then asks again, and the acquire's
/// answer names the grant it holds.
async fn confirm_lease(
    state: &ClientState,
    keys: &LockKeys,
    owner_id: &str,
    token: u64,
    lease: Duration,
) -> Result<bool> {
    let lease_ms = millis(lease);
    let statuses = match keys.permit_family() {
        None => {
            let items = vec![RenewItem {
                owner_key: keys.owner(),
                owner_id,
                lease_ms,
                token: Some(token),
            }];
            state.renew(&RenewBatch { items }).await?
        }
        Some(_) => {
            let items = vec![PermitRenewItem {
                keys,
                owner_id,
                lease_ms,
                token: Some(token),
            }];
            state.renew_permits(&PermitRenewBatch { items }).await?
        }
    };
    Ok(statuses.first() == Some(&RenewStatus::Held))
}

/// An acquire that has not produced a grant yet. Dropping it cancels.
struct PendingAcquire<'a> {
    state: &'a Arc<ClientState>,
    keys: &'a Arc<LockKeys>,
    owner_id: &'a str,
    events: Option<Arc<WaiterSlot>>,
    started: Instant,
    telemetry: &'a LockTelemetry,
    done: bool,
    /// Set while an acquire call of this waiter sits on the script socket
    /// with its reply unread (and after, if that reply was left owed): its
    /// cancel must then be written behind it there.
    unanswered: AtomicBool,
}

impl<'a> PendingAcquire<'a> {
    fn new(
        state: &'a Arc<ClientState>,
        keys: &'a Arc<LockKeys>,
        owner_id: &'a Arc<str>,
        telemetry: &'a LockTelemetry,
    ) -> Self {
        // Register before the first script call: the grant may be published
        // the instant the script queues us. A try caller registers too: a
        // heartbeat reply naming it as the new holder may be handled before
        // its own reply, and must reach it rather than be handed back.
        let events = Some(state.waiters.register(Arc::clone(owner_id), keys));
        Self {
            state,
            keys,
            owner_id,
            events,
            started: Instant::now(),
            telemetry,
            done: false,
            unanswered: AtomicBool::new(false),
        }
    }

    /// The waiter's next event; never one once it left the registry.
    fn poll_event(&self, cx: &mut Context<'_>) -> Poll<WaiterEvent> {
        match self.events.as_ref() {
            Some(slot) => slot.poll_next(cx),
            None => Poll::Pending,
        }
    }

    /// Ends the pending state without cancelling.
    fn finished(&mut self) {
        self.done = true;
        if self.events.take().is_some() {
            self.state.waiters.deregister(self.owner_id);
        }
    }

    /// The caller owns the lock: record the grant (before leaving the
    /// waiter registry, so a duplicate grant message is never taken for an
    /// orphan) and hand it to the watchdog.
    fn granted(&mut self, name: &LockName, grant: Grant) -> Arc<HeldLock> {
        let (token, ticket) = (grant.token, grant.ticket);
        let held = Arc::new(HeldLock::new(
            name.clone(),
            Arc::clone(self.keys),
            self.owner_id.to_owned(),
            grant,
            self.telemetry.clone(),
        ));
        self.state.held.track(&held);
        self.finished();
        // With replica acknowledgement on, counted once the replicas
        // acknowledged it (`replicated_or_given_back`).
        if self.state.config.replica_acks.is_none() {
            self.telemetry.acquire_ended("acquired", self.started);
        }
        tracing::debug!(token, ?ticket, waited = ?self.started.elapsed(), "fairlock lock granted");
        held
    }

    /// A call of this acquire failed: counted as an error, or as cancelled
    /// when the failure is the client's shutdown (`Closed`); once either
    /// way (not again when dropped). The waiter leaves the queue in the
    /// background in case the failed call had queued it (a reply lost
    /// after the script ran), passing on a grant that raced it.
    fn failed(&mut self, error: Error) -> Error {
        self.finished();
        // Ended by `shutdown()`: given up by the caller's own side, not a
        // failed Redis call.
        let outcome = if matches!(error, Error::Closed) {
            "cancelled"
        } else {
            "error"
        };
        self.telemetry.acquire_ended(outcome, self.started);
        crate::telemetry::span_failed(&error);
        drop(self.spawn_cancel());
        error
    }

    /// Leaves the queue now (wait timeout, admission refusal), passing on
    /// a raced grant, and ends with `error` (counted as `outcome`). Owns
    /// the error so the waiting future need not keep one inline. The
    /// cancel runs in a task of its own, awaited: the caller dropping this
    /// future meanwhile (its own timeout) does not stop it.
    async fn give_up(&mut self, error: Error, outcome: &'static str) -> Error {
        self.finished();
        // Counted first: the caller may drop this future while it awaits
        // the cancel, and the outcome must not go uncounted then.
        self.telemetry.acquire_ended(outcome, self.started);
        let _ = self.spawn_cancel().await;
        error
    }

    /// Runs `cancel.lua` for this waiter in a task of its own.
    fn spawn_cancel(&self) -> tokio::task::JoinHandle<()> {
        let state = Arc::clone(self.state);
        let keys = Arc::clone(self.keys);
        let owner_id = self.owner_id.to_owned();
        let after_socket = self.unanswered.load(Ordering::SeqCst);
        self.state
            .spawn_cleanup(async move { state.cancel(&keys, &owner_id, after_socket).await })
    }
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.finished();
        self.telemetry.acquire_ended("cancelled", self.started);
        drop(self.spawn_cancel());
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use fairlock_testkit::RedisServer;

    use crate::test_waits::{connections, held_connections, wait_until};
    use crate::{ClientConfig, Error, LockClient, LockOptions};

    /// A waiter already queued outlives an outage of Redis: a re-check of
    /// its place whose call times out (Redis held by `CLIENT PAUSE` past
    /// the command timeout) leaves it waiting in its place, and it gets
    /// the lock when the holder releases after the outage; a waiter behind
    /// it whose wait timeout runs out during the outage still ends, with
    /// `WaitTimeout`. Both on the script socket and through fred. (Before,
    /// such a waiter failed with `Timeout`, as a re-check sent while fred
    /// is still reconnecting after a restart can.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queued_waiter_whose_recheck_times_out_keeps_waiting() {
        let server = RedisServer::start().expect("redis-server");
        for direct_calls in [true, false] {
            let config = ClientConfig::builder(server.url())
                .command_timeout(Duration::from_millis(300))
                .direct_calls(direct_calls)
                .build()
                .expect("config");
            let client = LockClient::with_config(config).await.expect("client");
            let name = format!("outage-{direct_calls}");
            let holder = client.lock(&name).await.expect("holder");
            let waiter = {
                let client = client.clone();
                let name = name.clone();
                tokio::spawn(async move { client.lock(&name).await })
            };
            while client.inspect(&name).await.expect("inspect").queue_len == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // Behind it, a waiter with a wait timeout shorter than the
            // outage: its wait still ends.
            let bounded = {
                let client = client.clone();
                let name = name.clone();
                let options = LockOptions::new().wait_timeout(Duration::from_millis(800));
                tokio::spawn(async move { client.lock_with(&name, options).await })
            };
            while client.inspect(&name).await.expect("inspect").queue_len < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            server
                .cmd_ok(&["CLIENT", "PAUSE", "1200", "ALL"])
                .expect("pause");
            client.state().waiters.recheck_all();
            // Answered once the pause is over; the re-checks' calls timed
            // out long before.
            server.cmd_ok(&["PING"]).expect("ping");
            let timed_out = tokio::time::timeout(Duration::from_secs(10), bounded)
                .await
                .expect("the bounded waiter ends")
                .expect("task");
            assert!(
                matches!(timed_out, Err(Error::WaitTimeout { .. })),
                "direct_calls {direct_calls}: the bounded waiter ended with {timed_out:?}"
            );
            holder.release().await.expect("release");
            let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .expect("the waiter ends")
                .expect("task")
                .unwrap_or_else(|error| {
                    panic!("direct_calls {direct_calls}: the waiter failed: {error:?}")
                });
            granted.release().await.expect("release");
            client.shutdown().await;
        }
    }

    /// A grant taken with `confirm` (found by a heartbeat) whose token is
    /// not the grant the owner id holds by the time the confirmation runs
    /// (an older grant of the same owner id, delivered late) must not give
    /// the guard that older token. Here the late grant (token 1) is put
    /// into the waiter's slot by hand while Redis is paused; the holder's
    /// release, sent before it, hands the lock to the waiter with a new
    /// token and runs first. Before, the confirmation only asked whether
    /// the owner id held the lock, and the guard carried token 1.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_grant_confirmed_after_a_newer_one_gets_the_newer_token() {
        let server = RedisServer::start().expect("redis-server");
        // Scripts loaded and sockets open: nothing below waits on a load.
        let warm = |client: LockClient| async move {
            let guard = client.lock("warm").await.expect("lock");
            guard.release().await.expect("release");
            client
        };
        let waiting = warm(LockClient::connect(&server.url()).await.expect("client")).await;
        let before_holding = connections(&server);
        let holding = warm(LockClient::connect(&server.url()).await.expect("client")).await;
        let holdings: BTreeSet<u64> = connections(&server)
            .difference(&before_holding)
            .copied()
            .collect();
        let holder = holding.lock("late").await.expect("holder");
        let waiter = {
            let client = waiting.clone();
            tokio::spawn(async move { client.lock("late").await })
        };
        let state = waiting.state().clone();
        let keys = state.keys_of(&fairlock_core::LockName::new("late").expect("name"));
        let owner_id = loop {
            let queue = server
                .cmd_ok(&["ZRANGE", keys.queue(), "0", "0"])
                .expect("ZRANGE");
            if let Some(first) = queue.as_array().and_then(|q| q.first()) {
                break first.as_str().expect("an owner id").to_owned();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        // Lifted by hand once the late grant is delivered.
        server
            .cmd_ok(&["CLIENT", "PAUSE", "30000", "WRITE"])
            .expect("CLIENT PAUSE");
        let release = tokio::spawn(async move { holder.release().await });
        // The release is in Redis's paused clients before the confirmation
        // (before, a 200 ms sleep stood for this, and a 1.5 s pause could
        // end before the late grant was delivered).
        wait_until("the release held by the pause", || {
            !held_connections(&server).is_disjoint(&holdings)
        })
        .await;
        assert!(
            state.waiters.deliver(
                &owner_id,
                crate::waiters::WaiterEvent::Granted {
                    token: 1,
                    confirm: true,
                },
            ),
            "the waiter takes the late grant"
        );
        server
            .cmd_ok(&["CLIENT", "UNPAUSE"])
            .expect("CLIENT UNPAUSE");
        let guard = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("the waiter ends")
            .expect("task")
            .expect("granted");
        release.await.expect("task").expect("release");
        let held = server.cmd_ok(&["GET", keys.owner()]).expect("GET");
        assert_eq!(
            held.as_str(),
            Some(format!("{} {}", guard.owner_id(), guard.token().value()).as_str()),
            "the guard carries the token Redis holds"
        );
        guard.release().await.expect("release");
    }

    /// An acquire whose call on the script socket was left owed (Redis
    /// held by a pause past the command timeout) and whose next call went
    /// through fred (the socket owing a reply) and is still in flight when
    /// the acquire is dropped: its cancel must run after both. Written
    /// only behind the socket's owed call, it ran before the call through
    /// fred, which queued the waiter again: an entry nobody would take,
    /// found only when the queue reaches it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancel_follows_both_an_owed_socket_call_and_one_through_fred() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let server = RedisServer::start().expect("redis-server");
        let config = ClientConfig::builder(server.url())
            .command_timeout(Duration::from_secs(1))
            .build()
            .expect("config");
        let client = LockClient::with_config(config).await.expect("client");
        for _ in 0..2 {
            let guard = client.lock("warm").await.expect("lock");
            guard.release().await.expect("release");
        }
        // Held, so that each acquire below queues its owner id.
        let holder = client.lock("owed").await.expect("holder");
        let state = client.state().clone();
        let keys = state.keys_of(&fairlock_core::LockName::new("owed").expect("name"));
        let owner_id = state.new_owner_id(30_000);
        let unanswered = Arc::new(AtomicBool::new(false));
        let acquire = || {
            queue_on_socket_or_fred(
                state.clone(),
                keys.clone(),
                owner_id.clone(),
                unanswered.clone(),
            )
        };
        // The cancel script loaded: a socket call that finds it missing
        // goes through fred.
        state
            .cancel(&keys, &state.new_owner_id(30_000), false)
            .await;
        // Lifted by hand once both calls and the cancel are on their way.
        server
            .cmd_ok(&["CLIENT", "PAUSE", "30000", "WRITE"])
            .expect("CLIENT PAUSE");
        let first = acquire().await;
        assert!(matches!(first, Err(Error::Timeout { .. })), "{first:?}");
        assert!(
            unanswered.load(Ordering::SeqCst),
            "its reply is owed on the socket"
        );
        let first_held = held_connections(&server);
        // The socket owes a reply: this one goes through fred, and is held
        // by the pause too before the cancel is sent (before, a 100 ms
        // sleep stood for this).
        let second = tokio::spawn(acquire());
        wait_until("the call through fred held by the pause", || {
            !held_connections(&server).is_subset(&first_held)
        })
        .await;
        let written_after = state.redis.written_after_socket();
        let cancel = {
            let (state, keys, owner_id) = (state.clone(), keys.clone(), owner_id.clone());
            let after_socket = unanswered.load(Ordering::SeqCst);
            tokio::spawn(async move { state.cancel(&keys, &owner_id, after_socket).await })
        };
        // Its first call is written behind the socket's owed reply.
        wait_until("the cancel written behind the owed call", || {
            state.redis.written_after_socket() > written_after
        })
        .await;
        server
            .cmd_ok(&["CLIENT", "UNPAUSE"])
            .expect("CLIENT UNPAUSE");
        cancel.await.expect("cancel");
        let _ = second.await.expect("task");
        let queued = server
            .cmd_ok(&["ZSCORE", keys.queue(), &owner_id])
            .expect("ZSCORE");
        assert_eq!(
            queued.as_str(),
            None,
            "the cancel ran after the call through fred too: nothing left queued"
        );
        holder.release().await.expect("release");
    }

    /// Runs one acquire call for `owner_id` as a waiter's call goes: on
    /// the script socket if it owes no reply, `unanswered` set while it
    /// sits there.
    async fn queue_on_socket_or_fred(
        state: std::sync::Arc<crate::state::ClientState>,
        keys: std::sync::Arc<fairlock_core::LockKeys>,
        owner_id: String,
        unanswered: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> crate::Result<()> {
        let call = fairlock_core::Acquire {
            owner_id: &owner_id,
            mode: fairlock_core::AcquireMode::Wait,
            timings: &state.timings,
            channel_prefix: &state.channel_prefix(&keys),
            rejoin: None,
        };
        state
            .run_direct(&keys, &call, &unanswered)
            .await
            .map(|_| ())
    }
}
