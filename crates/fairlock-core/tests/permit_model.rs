//! Model check of the permit scripts (issue 13): random sequences of
//! acquires (wait and try, shared and exclusive, with different permit
//! counts), releases, cancels, heartbeats, resends, process deaths and
//! lease expiry run through the real scripts on a real redis-server, and
//! every reply and the resulting holders, queue and limit are compared with
//! a small in-memory model of one permit set.
//!
//! The model states the rule of `includes/permits.lua` in plain Rust:
//! grants go from the head of the queue while the head fits (shared: no
//! exclusive holder and fewer holders than the limit; exclusive: nobody
//! holds) and stop at the first live waiter that does not; dead waiters
//! passed on the way are dropped; a newcomer is granted only if nobody is
//! queued. So the semaphore (all shared) and the read-write lock (readers
//! shared, writers exclusive) are checked by one model. Tokens are drawn
//! from the server clock, so the model only checks that each new grant's
//! token is above every earlier one and that a holder asking again gets
//! its own token back.
//!
//! Time is deterministic without sleeping: leases and heartbeat deadlines
//! are a minute long; a death plants a deadline in the past
//! (`ZADD alive 1 <tag>`) and an expiry a lease deadline of 1
//! (`ZADD holders XX 1 <owner id>`).
//!
//! A release that ran is remembered (owner ids are reused across steps
//! here, so a later release by the same owner id that does not hold is
//! the resend case): it answers released and changes nothing.
//!
//! `FAIRLOCK_MODEL_CASES` sets the number of cases (default 300).

mod support;

use std::collections::{BTreeMap, BTreeSet};

use fairlock_core::{
    AcquireMode, AcquireReply, CancelReply, KeyPrefix, LockKeys, LockName, PermitAcquire,
    PermitCancel, PermitFamily, PermitHeartbeat, PermitOwnerId, PermitRelease, PermitReleaseReply,
    PermitRequest, Purged, ScriptCall, Timings, MAX_PERMITS,
};
use fairlock_testkit::{RedisServer, Resp};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use support::{commands_run_inside, load_scripts, run_script};

const TIMINGS: Timings = match Timings::new(60_000, 300_000, 900_000) {
    Ok(timings) => timings,
    Err(_) => panic!("valid timings"),
};
const LEASE_MS: u64 = 60_000;
/// How long a release is remembered: as long as a lease, so no record
/// expires within a case.
const REMEMBER_MS: u64 = 60_000;
const MEMBERS: usize = 6;
const PROCESSES: usize = 3;
const CHANNEL_PREFIX: &str = "model:notify:";

fn cases() -> u32 {
    std::env::var("FAIRLOCK_MODEL_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300)
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Acquire(usize, bool),
    Release(usize),
    Cancel(usize),
    /// A heartbeat of a process probing one member, or two (the second
    /// given and another).
    Heartbeat(usize, usize, Option<usize>),
    Kill(usize),
    Expire(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..MEMBERS, any::<bool>()).prop_map(|(m, try_)| Op::Acquire(m, try_)),
        3 => (0..MEMBERS).prop_map(Op::Release),
        1 => (0..MEMBERS).prop_map(Op::Cancel),
        1 => (0..PROCESSES, 0..MEMBERS, proptest::option::of(0..MEMBERS))
            .prop_map(|(p, m, n)| Op::Heartbeat(p, m, n)),
        1 => (0..PROCESSES).prop_map(Op::Kill),
        1 => (0..MEMBERS).prop_map(Op::Expire),
    ]
}

fn request() -> impl Strategy<Value = PermitRequest> {
    prop_oneof![
        1 => Just(PermitRequest::Exclusive),
        3 => (1u32..=3).prop_map(PermitRequest::Shared),
    ]
}

fn process_of(who: usize) -> usize {
    who % PROCESSES
}

fn tag(process: usize) -> String {
    format!("{:016x}", process + 1)
}

/// The model of one permit set.
struct Model {
    requests: Vec<PermitRequest>,
    holders: BTreeMap<usize, u64>,
    queue: Vec<usize>,
    alive: [bool; PROCESSES],
    limit: Option<u32>,
    /// The newest token seen.
    last_token: u64,
    /// Owner ids whose release ran: the set remembers them (longer than a
    /// case lasts), and their release run again answers released.
    released: BTreeSet<usize>,
}

impl Model {
    fn fits(&self, who: usize) -> bool {
        let count = self.holders.len();
        if count == 0 {
            return true;
        }
        let PermitRequest::Shared(own) = self.requests[who] else {
            return false;
        };
        if count == 1 {
            let only = *self.holders.keys().next().expect("one holder");
            if self.requests[only] == PermitRequest::Exclusive {
                return false;
            }
        }
        count < self.limit.unwrap_or(own) as usize
    }

    /// The owner ids granted from the head, in order, and the dead dropped.
    fn grant_waiting(&mut self) -> (Vec<usize>, u64) {
        let (mut granted, mut dropped) = (Vec::new(), 0);
        while let Some(&head) = self.queue.first() {
            if !self.alive[process_of(head)] {
                self.queue.remove(0);
                dropped += 1;
            } else if self.fits(head) {
                self.queue.remove(0);
                self.holders.insert(head, 0);
                granted.push(head);
            } else {
                break;
            }
        }
        (granted, dropped)
    }
}

struct Case<'a> {
    server: &'a RedisServer,
    keys: LockKeys,
    owner_ids: Vec<String>,
    model: Model,
}

fn check(cond: bool, what: String) -> Result<(), TestCaseError> {
    if cond {
        Ok(())
    } else {
        Err(TestCaseError::fail(what))
    }
}

impl Case<'_> {
    fn call<C: ScriptCall>(&self, call: &C) -> Result<C::Output, TestCaseError> {
        let keys: Vec<&str> = self.keys.all().iter().map(String::as_str).collect();
        let reply = run_script(self.server, C::SCRIPT, &keys, &call.args())
            .map_err(|e| TestCaseError::fail(format!("{}: {e}", C::SCRIPT.name())))?;
        C::decode(reply).map_err(|e| TestCaseError::fail(e.to_string()))
    }

    fn who(&self, owner_id: &str) -> usize {
        self.owner_ids
            .iter()
            .position(|m| m == owner_id)
            .expect("an owner id of the case")
    }

    /// Binds the tokens of grants made by this step (in grant order) and
    /// checks they increase.
    fn bind_new_grants(&mut self, granted: &[usize]) -> Result<(), TestCaseError> {
        for &who in granted {
            let token = self
                .server
                .cmd(&["HGET", &self.keys.all()[4], &self.owner_ids[who]])
                .expect("HGET")
                .as_str()
                .and_then(|t| t.parse::<u64>().ok())
                .ok_or_else(|| TestCaseError::fail(format!("no token for {who}")))?;
            check(
                token > self.model.last_token,
                format!("token {token} of {who} not above {}", self.model.last_token),
            )?;
            self.model.last_token = token;
            self.model.holders.insert(who, token);
        }
        Ok(())
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Acquire(who, try_) => self.acquire(who, try_),
            Op::Release(who) => {
                let reply = self.call(&PermitRelease {
                    owner_id: &self.owner_ids[who],
                    timings: &TIMINGS,
                    channel_prefix: CHANNEL_PREFIX,
                    remember_ms: REMEMBER_MS,
                })?;
                if !self.model.holders.contains_key(&who) && self.model.released.contains(&who) {
                    // A resend of a release that ran: released, nothing
                    // handed on, nothing changed.
                    return check(
                        reply
                            == PermitReleaseReply::Released {
                                granted: Vec::new(),
                                purged: Purged {
                                    dropped: 0,
                                    more: false,
                                },
                            },
                        format!("release by {who} again: {reply:?}"),
                    );
                }
                if self.model.holders.remove(&who).is_none() {
                    // Refused, but permits that ran out go on as at a
                    // heartbeat (unless the caller itself waits).
                    let (granted, dropped) = if self.model.queue.contains(&who) {
                        (Vec::new(), 0)
                    } else {
                        self.model.grant_waiting()
                    };
                    check(
                        matches!(reply, PermitReleaseReply::NotHolder { purged } if purged.dropped == dropped),
                        format!("release by non-holder {who} (dropped {dropped}): {reply:?}"),
                    )?;
                    return self.bind_new_grants(&granted);
                }
                self.model.released.insert(who);
                let (granted, dropped) = self.model.grant_waiting();
                let PermitReleaseReply::Released {
                    granted: got,
                    purged,
                } = reply
                else {
                    return check(false, format!("release by {who} refused"));
                };
                let got_who: Vec<usize> = got.iter().map(|g| self.who(&g.owner_id)).collect();
                check(
                    got_who == granted,
                    format!("release granted {got_who:?}, model {granted:?}"),
                )?;
                check(purged.dropped == dropped, format!("dropped {purged:?}"))?;
                self.bind_new_grants(&granted)?;
                for grant in got {
                    let who = self.who(&grant.owner_id);
                    check(
                        self.model.holders.get(&who) == Some(&grant.token),
                        format!("reply token of {who}"),
                    )?;
                }
                Ok(())
            }
            Op::Cancel(who) => {
                let reply = self.call(&PermitCancel {
                    owner_id: &self.owner_ids[who],
                    timings: &TIMINGS,
                    channel_prefix: CHANNEL_PREFIX,
                })?;
                let was_queued = if let Some(at) = self.model.queue.iter().position(|&w| w == who) {
                    self.model.queue.remove(at);
                    true
                } else {
                    false
                };
                let was_owner = self.model.holders.remove(&who).is_some();
                let (granted, dropped) = self.model.grant_waiting();
                check(
                    reply
                        == CancelReply {
                            was_queued,
                            was_owner,
                            purged: Purged {
                                dropped,
                                more: false,
                            },
                        },
                    format!("cancel {who}: {reply:?}"),
                )?;
                self.bind_new_grants(&granted)
            }
            Op::Heartbeat(process, first, second) => {
                let mut probes = vec![first];
                probes.extend(second.filter(|&m| m != first));
                let ids: Vec<&str> = probes.iter().map(|&m| self.owner_ids[m].as_str()).collect();
                let reply = self.call(&PermitHeartbeat {
                    tag: &tag(process),
                    probes: &ids,
                    timings: &TIMINGS,
                    channel_prefix: CHANNEL_PREFIX,
                })?;
                let queued: Vec<bool> = probes
                    .iter()
                    .map(|m| self.model.queue.contains(m))
                    .collect();
                // A probe granted while the call was on its way keeps its
                // process alive too.
                let holds: Vec<bool> = probes
                    .iter()
                    .zip(&queued)
                    .map(|(m, &queued)| !queued && self.model.holders.contains_key(m))
                    .collect();
                if queued.iter().chain(&holds).any(|&flag| flag) {
                    self.model.alive[process] = true;
                }
                let (granted, dropped) = self.model.grant_waiting();
                let flags_agree = (0..probes.len())
                    .all(|i| reply.queued.get(i) == queued[i] && reply.holds.get(i) == holds[i])
                    && !reply.queued.get(probes.len())
                    && !reply.holds.get(probes.len());
                check(
                    flags_agree && reply.purged.dropped == dropped,
                    format!("heartbeat {process}/{probes:?}: {reply:?}, model queued {queued:?} holds {holds:?}"),
                )?;
                self.bind_new_grants(&granted)
            }
            Op::Kill(process) => {
                self.server
                    .cmd(&["ZADD", self.keys.alive(), "1", &tag(process)])
                    .expect("ZADD");
                self.model.alive[process] = false;
                Ok(())
            }
            Op::Expire(who) => {
                self.server
                    .cmd(&["ZADD", self.keys.owner(), "XX", "1", &self.owner_ids[who]])
                    .expect("ZADD");
                self.model.holders.remove(&who);
                Ok(())
            }
        }
    }

    fn acquire(&mut self, who: usize, try_: bool) -> Result<(), TestCaseError> {
        let reply = self.call(&PermitAcquire {
            owner_id: &self.owner_ids[who],
            mode: if try_ {
                AcquireMode::Try
            } else {
                AcquireMode::Wait
            },
            timings: &TIMINGS,
            channel_prefix: CHANNEL_PREFIX,
            rejoin: None,
        })?;
        let model = &mut self.model;
        if let Some(&token) = model.holders.get(&who) {
            return check(
                reply
                    == AcquireReply::Granted {
                        token,
                        purged: Purged::default(),
                    },
                format!("holder {who} asking again: {reply:?}"),
            );
        }
        if let PermitRequest::Shared(permits) = model.requests[who] {
            model.limit = Some(permits);
        }
        let was_queued = model.queue.contains(&who);
        let (granted, dropped) = model.grant_waiting();
        let purged = Purged {
            dropped,
            more: false,
        };
        self.bind_new_grants(&granted)?;
        let model = &mut self.model;
        if was_queued {
            if granted.contains(&who) {
                let token = model.holders[&who];
                return check(
                    reply == AcquireReply::Granted { token, purged },
                    format!("queued {who} granted: {reply:?}"),
                );
            }
            if let Some(at) = model.queue.iter().position(|&w| w == who) {
                model.alive[process_of(who)] = true;
                return match reply {
                    AcquireReply::Queued {
                        position,
                        purged: p,
                        ..
                    } => check(
                        position == at as u64 && p == purged,
                        format!("queued {who} keeps place {at}: {reply:?}"),
                    ),
                    other => check(false, format!("queued {who}: {other:?}")),
                };
            }
        }
        if model.queue.is_empty() && model.fits(who) {
            return match reply {
                AcquireReply::Granted { purged: p, .. } if p == purged => {
                    self.model.holders.insert(who, 0);
                    self.bind_new_grants(&[who])
                }
                other => check(false, format!("{who} should be granted: {other:?}")),
            };
        }
        if try_ {
            return check(
                reply == AcquireReply::Busy { purged },
                format!("try {who}: {reply:?}"),
            );
        }
        let position = model.queue.len() as u64;
        model.queue.push(who);
        model.alive[process_of(who)] = true;
        match reply {
            AcquireReply::Queued {
                position: p,
                purged: got,
                ..
            } => check(
                p == position && got == purged,
                format!("{who} joins at {position}: {reply:?}"),
            ),
            other => check(false, format!("{who} should queue: {other:?}")),
        }
    }

    /// Redis holds what the model holds.
    fn compare(&self) -> Result<(), TestCaseError> {
        let owner_ids = |resp: Resp| -> Vec<usize> {
            resp.as_array()
                .expect("array")
                .iter()
                .map(|m| self.who(m.as_str().expect("owner id")))
                .collect()
        };
        let mut holders = owner_ids(
            self.server
                .cmd(&["ZRANGEBYSCORE", self.keys.owner(), "2", "+inf"])
                .expect("holders"),
        );
        holders.sort();
        let model_holders: Vec<usize> = self.model.holders.keys().copied().collect();
        check(
            holders == model_holders,
            format!("holders {holders:?}, model {model_holders:?}"),
        )?;
        let queue = owner_ids(
            self.server
                .cmd(&["ZRANGE", self.keys.queue(), "0", "-1"])
                .expect("queue"),
        );
        check(
            queue == self.model.queue,
            format!("queue {queue:?}, model {:?}", self.model.queue),
        )?;
        let limit = self
            .server
            .cmd(&["HGET", &self.keys.all()[4], "limit"])
            .expect("limit")
            .as_str()
            .and_then(|l| l.parse::<u32>().ok());
        check(
            limit == self.model.limit,
            format!("limit {limit:?}, model {:?}", self.model.limit),
        )
    }
}

fn run_case(
    server: &RedisServer,
    requests: &[PermitRequest],
    ops: &[Op],
) -> Result<(), TestCaseError> {
    server.cmd(&["FLUSHALL"]).expect("FLUSHALL");
    let keys = LockKeys::permits(
        &KeyPrefix::default(),
        &LockName::new("model").expect("name"),
        PermitFamily::Semaphore,
    );
    let owner_ids = (0..MEMBERS)
        .map(|who| {
            PermitOwnerId::new(
                &format!("{:032x}", who + 1),
                &tag(process_of(who)),
                LEASE_MS,
                requests[who],
            )
            .expect("owner id")
            .as_str()
            .to_owned()
        })
        .collect();
    let mut case = Case {
        server,
        keys,
        owner_ids,
        model: Model {
            requests: requests.to_vec(),
            holders: BTreeMap::new(),
            queue: Vec::new(),
            alive: [false; PROCESSES],
            limit: None,
            last_token: 0,
            released: BTreeSet::new(),
        },
    };
    for (i, &op) in ops.iter().enumerate() {
        case.step(op)
            .and_then(|()| case.compare())
            .map_err(|e| TestCaseError::fail(format!("step {i} {op:?}: {e}")))?;
    }
    Ok(())
}

#[test]
fn permit_scripts_follow_the_model() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        proptest::collection::vec(request(), MEMBERS),
        proptest::collection::vec(op(), 1..40),
    );
    let result = runner.run(&strategy, |(requests, ops)| {
        run_case(&server, &requests, &ops)
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// Runs one permit script call on `keys`.
fn call_on<C: ScriptCall>(server: &RedisServer, keys: &LockKeys, call: &C) -> C::Output {
    let all: Vec<&str> = keys.all().iter().map(String::as_str).collect();
    let reply = run_script(server, C::SCRIPT, &all, &call.args())
        .unwrap_or_else(|error| panic!("{}: {error}", C::SCRIPT.name()));
    C::decode(reply).expect("a reply the call type reads")
}

/// A waiting permit acquire by `owner_id`.
fn acquire_on(server: &RedisServer, keys: &LockKeys, owner_id: &str) -> AcquireReply {
    call_on(
        server,
        keys,
        &PermitAcquire {
            owner_id,
            mode: AcquireMode::Wait,
            timings: &TIMINGS,
            channel_prefix: CHANNEL_PREFIX,
            rejoin: None,
        },
    )
}

/// A permit release by `owner_id`, remembered `remember_ms`.
fn release_on(
    server: &RedisServer,
    keys: &LockKeys,
    owner_id: &str,
    remember_ms: u64,
) -> PermitReleaseReply {
    call_on(
        server,
        keys,
        &PermitRelease {
            owner_id,
            timings: &TIMINGS,
            channel_prefix: CHANNEL_PREFIX,
            remember_ms,
        },
    )
}

/// What a permit set holds: holders and queue with their scores, the grants
/// hash, the counter, and the members of `alive` in name order (their
/// scores are deadlines a resend may move, as a lock's resend rewrites
/// `freed`, and a moved deadline can change their order by score).
fn permit_set_state(server: &RedisServer, keys: &LockKeys) -> Vec<String> {
    let [holders, queue, alive, seq, grants] = keys.all();
    let mut state: Vec<String> = [
        server.cmd(&["ZRANGE", holders, "0", "-1", "WITHSCORES"]),
        server.cmd(&["ZRANGE", queue, "0", "-1", "WITHSCORES"]),
        server.cmd(&["GET", seq]),
        server.cmd(&["HGETALL", grants]),
    ]
    .into_iter()
    .map(|resp| format!("{:?}", resp.expect("read")))
    .collect();
    let alive = server.cmd(&["ZRANGE", alive, "0", "-1"]).expect("read");
    let mut members: Vec<&str> = alive
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(Resp::as_str)
        .collect();
    members.sort_unstable();
    state.push(members.join(","));
    state
}

/// A permit release can reach Redis twice: fred and fairlock's own call
/// layer send a call again when its connection dropped after it was
/// written but before its reply came. The second run must answer
/// released, as the first did, and change nothing: not hand the permit on
/// again, not touch the holder it went to. Before the fix the second run
/// answered `{0}` (NotHolder), which the client turns into
/// `Error::NotOwner` and a lost lease.
#[test]
fn a_permit_release_run_twice_answers_released_and_changes_nothing() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let keys = LockKeys::permits(
        &KeyPrefix::default(),
        &LockName::new("resent").expect("name"),
        PermitFamily::Semaphore,
    );
    let owner = |who: usize| {
        PermitOwnerId::new(
            &format!("{:032x}", who + 1),
            &tag(who),
            LEASE_MS,
            PermitRequest::Shared(1),
        )
        .expect("owner id")
        .as_str()
        .to_owned()
    };
    let (first, second) = (owner(0), owner(1));
    let acquire = |owner_id: &str| acquire_on(&server, &keys, owner_id);
    let release = |owner_id: &str| release_on(&server, &keys, owner_id, REMEMBER_MS);
    let nothing_more = PermitReleaseReply::Released {
        granted: Vec::new(),
        purged: Purged {
            dropped: 0,
            more: false,
        },
    };

    assert!(matches!(acquire(&first), AcquireReply::Granted { .. }));
    assert!(matches!(acquire(&second), AcquireReply::Queued { .. }));
    let handed_on = release(&first);
    let PermitReleaseReply::Released { granted, .. } = &handed_on else {
        panic!("the holder's release: {handed_on:?}");
    };
    assert_eq!(granted.len(), 1, "the permit goes to the waiter");
    assert_eq!(granted[0].owner_id, second);
    let state = permit_set_state(&server, &keys);
    assert_eq!(release(&first), nothing_more, "the same release run again");
    assert_eq!(
        permit_set_state(&server, &keys),
        state,
        "the release run again changed the permit set"
    );

    // The last holder's release, run twice, leaves the set free.
    assert_eq!(release(&second), nothing_more);
    let state = permit_set_state(&server, &keys);
    assert_eq!(release(&second), nothing_more, "the last release run again");
    assert_eq!(permit_set_state(&server, &keys), state);

    // An owner id that never held is still refused.
    assert_eq!(
        release(&owner(2)),
        PermitReleaseReply::NotHolder {
            purged: Purged::default()
        }
    );
}

/// Commands Redis ran since `CONFIG RESETSTAT`, those inside scripts
/// counted and the script calls themselves not.
fn commands_run(server: &RedisServer) -> u64 {
    commands_run_inside(server).values().sum()
}

/// What a permit release costs in Redis commands (run inside the script),
/// in four cases: the first release on a fresh set; the next one soon
/// after (the last release is still remembered, and alive lives long
/// enough); one after the remembered releases expired (they are pruned,
/// alive's TTL is extended), as under a steady stream of releases; and a
/// release that hands the permit to a waiter of another process.
#[test]
fn commands_per_permit_release() {
    const REMEMBER_MS: u64 = 1_000;
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let keys = LockKeys::permits(
        &KeyPrefix::default(),
        &LockName::new("cost").expect("name"),
        PermitFamily::Semaphore,
    );
    let owner = |n: usize| {
        PermitOwnerId::new(
            &format!("{:032x}", n + 1),
            &tag(n % PROCESSES),
            LEASE_MS,
            PermitRequest::Shared(1),
        )
        .expect("owner id")
        .as_str()
        .to_owned()
    };
    let acquire = |owner_id: &str| acquire_on(&server, &keys, owner_id);
    let release = |owner_id: &str| release_on(&server, &keys, owner_id, REMEMBER_MS);
    let measured = |owner_id: &str| {
        server.cmd(&["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
        let reply = release(owner_id);
        let commands = commands_run(&server);
        (reply, commands)
    };
    // Loads the script, so no SCRIPT LOAD is counted.
    acquire(&owner(9));
    release(&owner(9));
    server.cmd(&["FLUSHALL"]).expect("FLUSHALL");

    let mut costs = Vec::new();
    acquire(&owner(0));
    costs.push(("fresh", measured(&owner(0))));
    acquire(&owner(1));
    costs.push(("remembered", measured(&owner(1))));
    std::thread::sleep(std::time::Duration::from_millis(REMEMBER_MS + 100));
    acquire(&owner(2));
    costs.push(("pruning", measured(&owner(2))));
    let alive = server
        .cmd(&["ZRANGE", keys.alive(), "0", "-1"])
        .expect("ZRANGE");
    assert_eq!(
        format!("{alive:?}"),
        format!(
            "{:?}",
            Resp::Array(Some(vec![Resp::Bulk(Some(owner(2).into_bytes()))]))
        ),
        "the expired records were removed, the new one kept"
    );
    acquire(&owner(3));
    acquire(&owner(4));
    costs.push(("handoff", measured(&owner(3))));
    eprintln!("commands per permit release: {costs:?}");
    for (case, (reply, _)) in &costs {
        assert!(
            matches!(reply, PermitReleaseReply::Released { .. }),
            "{case}: {reply:?}"
        );
    }
    let counts: Vec<(&str, u64)> = costs.iter().map(|(case, (_, n))| (*case, *n)).collect();
    assert_eq!(
        counts,
        [
            ("fresh", 12),
            ("remembered", 11),
            ("pruning", 13),
            ("handoff", 21)
        ],
        "commands per permit release; update permit_release.lua's header"
    );
}

#[test]
fn a_foreign_key_fails_a_permit_script_and_changes_nothing() {
    let server = RedisServer::start().expect("redis-server");
    let keys = LockKeys::permits(
        &KeyPrefix::default(),
        &LockName::new("foreign").expect("name"),
        PermitFamily::ReadWrite,
    );
    let owner_id = PermitOwnerId::new(&"a".repeat(32), &tag(0), LEASE_MS, PermitRequest::Exclusive)
        .expect("owner id");
    for (i, key) in keys.all().iter().enumerate() {
        if i == 3 {
            continue; // seq: repaired by next_seq, as for a lock
        }
        server.cmd(&["FLUSHALL"]).expect("FLUSHALL");
        server.cmd(&["SET", key, "not fairlock's"]).expect("SET");
        let all: Vec<&str> = keys.all().iter().map(String::as_str).collect();
        let call = PermitAcquire {
            owner_id: owner_id.as_str(),
            mode: AcquireMode::Wait,
            timings: &TIMINGS,
            channel_prefix: CHANNEL_PREFIX,
            rejoin: None,
        };
        let error = run_script(&server, PermitAcquire::SCRIPT, &all, &call.args())
            .expect_err("a foreign key type fails the call");
        assert!(
            error.starts_with("WRONGTYPE") && error.contains(key.as_str()),
            "{error}"
        );
        let left = server.cmd(&["DBSIZE"]).expect("DBSIZE").as_int();
        assert_eq!(left, Some(1), "only the foreign key is left ({key})");
    }
}

/// A queued permit waiter asks again (a re-check: its grant message was
/// missed) once both holders' leases ran out. Its own acquire grants it and
/// then drops dead waiters until its scan ends, with a permit still free
/// for the live waiter behind them. The reply must say dead waiters are
/// left, so the client goes on purging at once instead of leaving that
/// waiter for the next heartbeat. Before the fix the grant reply was
/// `{1, token}` alone: dropped count and "more" were lost.
#[test]
fn a_permit_grant_that_leaves_dead_waiters_says_so() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let keys = LockKeys::permits(
        &KeyPrefix::default(),
        &LockName::new("purged").expect("name"),
        PermitFamily::Semaphore,
    );
    let [holders, queue, alive, _, _] = keys.all();
    let owner = |nonce: usize, process: usize| {
        PermitOwnerId::new(
            &format!("{:032x}", nonce + 1),
            &tag(process),
            LEASE_MS,
            PermitRequest::Shared(2),
        )
        .expect("owner id")
        .as_str()
        .to_owned()
    };
    let (first, second, caller) = (owner(0, 0), owner(1, 0), owner(2, 1));
    assert!(matches!(
        acquire_on(&server, &keys, &first),
        AcquireReply::Granted { .. }
    ));
    assert!(matches!(
        acquire_on(&server, &keys, &second),
        AcquireReply::Granted { .. }
    ));
    let AcquireReply::Queued { ticket, .. } = acquire_on(&server, &keys, &caller) else {
        panic!("both permits are held: the caller queues");
    };

    // Behind the caller: 127 waiters of a dead process (the caller and
    // they fill one call's scan of 128 entries), then a live waiter.
    let dead_process = 2;
    let scanned = 128;
    let mut entries = vec!["ZADD".to_owned(), queue.clone()];
    for i in 1..scanned {
        entries.push((ticket + i as u64).to_string());
        entries.push(owner(100 + i, dead_process));
    }
    let live = owner(999, 0);
    entries.push((ticket + scanned as u64).to_string());
    entries.push(live.clone());
    let entries: Vec<&str> = entries.iter().map(String::as_str).collect();
    server.cmd(&entries).expect("queue the crowd");
    server
        .cmd(&["ZADD", alive, "1", &tag(dead_process)])
        .expect("the dead process");
    // Both holders' leases run out.
    for holder in [&first, &second] {
        server
            .cmd(&["ZADD", holders, "XX", "1", holder])
            .expect("expire a holder");
    }

    let AcquireReply::Granted { purged, .. } = acquire_on(&server, &keys, &caller) else {
        panic!("the caller heads the queue and a permit is free");
    };
    assert_eq!(
        purged,
        Purged {
            dropped: scanned as u64 - 1,
            more: true
        },
        "the live waiter behind the dead ones still waits for a free permit"
    );
    let queued = server.cmd(&["ZRANGE", queue, "0", "-1"]).expect("queue");
    let queued: Vec<&str> = queued
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(Resp::as_str)
        .collect();
    assert_eq!(queued, [live.as_str()], "only the live waiter is left");
}

/// A rejoin (`PermitAcquire::rejoin`) on a read-write lock: a reader whose
/// entry was lost, with a ticket older than the writer now heading the
/// queue, is the head again; it fits beside the reader that holds, so it
/// is granted at once. A number from the future is not taken: that caller
/// queues at the back. (Before the fix the reader got a new ticket behind
/// the writer and waited for it.)
#[test]
fn a_reader_rejoining_ahead_of_a_waiting_writer_is_granted() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let keys = LockKeys::permits(
        &KeyPrefix::default(),
        &LockName::new("rejoin").expect("name"),
        PermitFamily::ReadWrite,
    );
    let queue = keys.queue().to_owned();
    let owner = |nonce: usize, request: PermitRequest| {
        PermitOwnerId::new(
            &format!("{:032x}", nonce + 1),
            &tag(nonce),
            LEASE_MS,
            request,
        )
        .expect("owner id")
        .as_str()
        .to_owned()
    };
    let read = PermitRequest::Shared(MAX_PERMITS);
    let reader = owner(0, read);
    let gone = owner(1, PermitRequest::Exclusive);
    let lost = owner(2, read);
    let writer = owner(3, PermitRequest::Exclusive);
    let forger = owner(4, read);
    let rejoin = |owner_id: &str, ticket: u64| {
        call_on(
            &server,
            &keys,
            &PermitAcquire {
                owner_id,
                mode: AcquireMode::Wait,
                timings: &TIMINGS,
                channel_prefix: CHANNEL_PREFIX,
                rejoin: Some(ticket),
            },
        )
    };
    let queued = |reply: AcquireReply| match reply {
        AcquireReply::Queued {
            ticket, position, ..
        } => (ticket, position),
        other => panic!("expected queued: {other:?}"),
    };
    // A reader holds; a writer, a reader and a writer queue behind it.
    assert!(matches!(
        acquire_on(&server, &keys, &reader),
        AcquireReply::Granted { .. }
    ));
    queued(acquire_on(&server, &keys, &gone));
    let (lost_ticket, _) = queued(acquire_on(&server, &keys, &lost));
    let (writer_ticket, _) = queued(acquire_on(&server, &keys, &writer));
    // The first writer's entry goes (so the second heads the queue) and
    // the reader's is lost.
    server.cmd(&["ZREM", &queue, &gone, &lost]).expect("ZREM");

    // The lost reader comes back with its old ticket: it heads the queue
    // and fits beside the holding reader.
    let back = rejoin(&lost, lost_ticket);
    assert!(matches!(back, AcquireReply::Granted { .. }), "{back:?}");
    let waiting = server.cmd(&["ZRANGE", &queue, "0", "-1"]).expect("queue");
    let waiting: Vec<&str> = waiting
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(Resp::as_str)
        .collect();
    assert_eq!(waiting, [writer.as_str()], "the writer still waits");

    // A ticket from the future is no place to take: behind the writer.
    let (ticket, position) = queued(rejoin(&forger, u64::MAX >> 2));
    assert_eq!(position, 1);
    assert!(ticket > writer_ticket);
}
