//! RedLock mode over independent primaries started by the test kit
//! (`IndependentPrimaries`): mutual exclusion and increasing fencing tokens
//! while a minority dies, a clear error when a majority is gone, the
//! delayed-restart rule, and waiters woken by the release itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::redlock::{RedLock, RedLockConfig, RedLockOptions};
use fairlock::{Error, PrimaryFailureKind};
use fairlock_testkit::{IndependentPrimaries, RedisServer, Resp};
use fairlock_tests::{redlock_config, redlock_connect};

/// A hang guard for calls that must return on their own.
const HANG: Duration = Duration::from_secs(20);

fn primaries(n: usize) -> IndependentPrimaries {
    IndependentPrimaries::start(n).expect("start independent primaries")
}

/// Short timings; the delayed-restart rule off (tests that restart a
/// primary turn it on).
fn config(primaries: &IndependentPrimaries) -> RedLockConfig {
    redlock_config(primaries.urls())
}

/// Invariant: with 5 primaries and 2 of them SIGKILLed half way through, no
/// two tasks (over 3 clients) are ever inside the critical section at once,
/// a non-atomic read-modify-write counter loses no update, and the fencing
/// tokens, in critical-section order, strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_minority_mid_run_never_gives_two_holders() {
    const CLIENTS: usize = 3;
    const TASKS: usize = 3;
    const ROUNDS: usize = 12;
    let mut servers = primaries(5);
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(redlock_connect(config(&servers)).await);
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let counter = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::<u64>::new()));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..TASKS {
            let client = client.clone();
            let (inside, overlaps, counter, tokens) = (
                Arc::clone(&inside),
                Arc::clone(&overlaps),
                Arc::clone(&counter),
                Arc::clone(&tokens),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = client
                        .lock_with("stock", RedLockOptions::new().wait_timeout(HANG))
                        .await
                        .expect("lock with a majority alive");
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokens.lock().expect("tokens").push(guard.token().value());
                    // Non-atomic read-modify-write across an await.
                    let read = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    counter.store(read + 1, Ordering::SeqCst);
                    assert!(!guard.is_lost(), "the critical section fits the lease");
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release on a majority");
                }
            }));
        }
    }
    // Half way, kill a minority (2 of 5).
    let total = CLIENTS * TASKS * ROUNDS;
    let deadline = Instant::now() + HANG;
    while tokens.lock().expect("tokens").len() < total / 2 {
        assert!(Instant::now() < deadline, "no progress before the kill");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    servers.kill(&[1, 3]);
    assert_eq!(servers.running(), 3);
    for task in tasks {
        tokio::time::timeout(HANG * 3, task)
            .await
            .expect("the run finishes after the kill")
            .expect("task");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(counter.load(Ordering::SeqCst), total, "lost update");
    let tokens = tokens.lock().expect("tokens").clone();
    assert_eq!(tokens.len(), total);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens strictly increase in grant order: {tokens:?}"
    );
}

/// Invariant: with a majority (2 of 3) killed, every operation returns
/// `Error::NoQuorum` naming the dead primaries, nothing waits on them, and
/// a holder's lease-lost signal fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_majority_fails_with_no_quorum_and_nothing_hangs() {
    let mut servers = primaries(3);
    let redlock = redlock_connect(config(&servers)).await;
    let held = redlock.lock("report").await.expect("lock");
    assert!(held.validity() > Duration::ZERO);
    servers.kill(&[0, 2]);

    let failed = |error: Error| match error {
        Error::NoQuorum {
            answered,
            needed,
            primaries,
            failures,
            ..
        } => {
            assert_eq!((answered, needed, primaries), (1, 2, 3));
            let dead: Vec<usize> = failures.iter().map(|f| f.index).collect();
            assert_eq!(dead, vec![0, 2], "{failures:?}");
            assert!(failures.iter().all(|f| matches!(
                f.kind,
                PrimaryFailureKind::Disconnected | PrimaryFailureKind::Timeout
            )));
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    };
    let attempt = tokio::time::timeout(HANG, redlock.try_lock("other"))
        .await
        .expect("try_lock does not hang");
    failed(attempt.expect_err("no majority"));
    let attempt = tokio::time::timeout(HANG, redlock.lock("report"))
        .await
        .expect("lock does not hang");
    failed(attempt.expect_err("no majority"));
    let message = tokio::time::timeout(HANG, redlock.lock("x"))
        .await
        .expect("no hang")
        .expect_err("no majority")
        .to_string();
    assert!(message.contains("only 1 of 3 primaries"), "{message}");

    // The watchdog (renewing every second) cannot renew on a majority.
    tokio::time::timeout(HANG, held.lost())
        .await
        .expect("the lease-lost signal fires");
    assert!(held.is_lost());
    assert_eq!(held.validity(), Duration::ZERO);
    let release = tokio::time::timeout(HANG, held.release())
        .await
        .expect("release does not hang");
    assert!(
        matches!(release, Err(Error::NoQuorum { .. })),
        "{release:?}"
    );

    // A new client cannot start without a majority either.
    let connecting = tokio::time::timeout(HANG, RedLock::with_config(config(&servers)))
        .await
        .expect("connect does not hang");
    assert!(matches!(connecting, Err(Error::NoQuorum { .. })));
}

/// The delayed-restart rule. A holds on the majority {0, 1} while 2 is
/// down; 1 restarts without persistence (forgetting A's vote) and 2 comes
/// back. B must not acquire through {1, 2} before the restart delay has
/// passed: it gets `NoQuorum` naming 1 and 2 as restarted recently. A
/// client with the rule turned off shows the hazard the rule prevents: it
/// does acquire through {1, 2} while A's lease is still valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_restarted_without_persistence_does_not_vote_before_the_restart_delay() {
    const DELAY: Duration = Duration::from_secs(4);
    let mut servers = primaries(3);
    let mut ruled = config(&servers);
    ruled.restart_delay = DELAY;
    // The rule requires the restart delay to cover the longest lease.
    ruled.max_lease = DELAY;
    let lease = RedLockOptions::new().lease(DELAY);
    // Fresh servers are "recently restarted" too: wait until they are old.
    let a = redlock_connect(ruled.clone()).await;
    let deadline = Instant::now() + HANG;
    let held = loop {
        match a.try_lock_with("ledger", lease).await {
            Ok(Some(guard)) => break guard,
            Err(Error::NoQuorum { failures, .. }) => assert!(failures
                .iter()
                .all(|f| matches!(f.kind, PrimaryFailureKind::RestartedRecently { .. }))),
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "the servers never grew old enough"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    held.release().await.expect("release");

    servers.kill(&[2]);
    let held = a
        .try_lock_with("ledger", lease)
        .await
        .expect("lock on {0, 1}")
        .expect("free");
    servers.restart(1).expect("restart 1 empty");
    servers.restart(2).expect("restart 2 empty");
    let b = redlock_connect(ruled).await;
    let refused = b
        .try_lock_with("ledger", lease)
        .await
        .expect_err("the restarted primaries must not vote");
    match refused {
        Error::NoQuorum { failures, .. } => {
            let young: Vec<usize> = failures
                .iter()
                .filter(|f| matches!(f.kind, PrimaryFailureKind::RestartedRecently { .. }))
                .map(|f| f.index)
                .collect();
            assert_eq!(young, vec![1, 2], "{failures:?}");
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    // A waiting lock fails the same way instead of waiting.
    let waiting = tokio::time::timeout(HANG, b.lock_with("ledger", lease))
        .await
        .expect("no hang");
    assert!(
        matches!(waiting, Err(Error::NoQuorum { .. })),
        "{waiting:?}"
    );
    assert!(!held.is_lost(), "A's lease is still valid throughout");

    // Without the rule, {1, 2} vote and make a second holder while A's
    // lease is valid: the hazard. Its token is still above A's (the clock
    // floor of the counters lost in the restarts).
    let unruled = redlock_connect(config(&servers)).await;
    let second = unruled
        .try_lock_with("ledger", lease)
        .await
        .expect("without the rule the young primaries vote")
        .expect("granted through {1, 2}");
    assert!(!held.is_lost(), "two holders at once without the rule");
    assert!(second.token() > held.token());
}

/// Invariant: waiters are woken by releases, not by leases running out.
/// Every holder takes a 10-minute lease; 4 waiters on 2 clients are each
/// granted after the previous holder's release, within the hang guard, so
/// no one waited for a lease to end. While they all wait, each makes at
/// most the two attempts of joining the wait (no polling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_releases_before_any_lease_ends() {
    const WAITERS_PER_CLIENT: usize = 2;
    let servers = primaries(3);
    // Leases of 10 minutes: a waiter that waited for one to end would
    // outlast the hang guard below by far (no clock is read).
    let long = || {
        let mut config = config(&servers);
        config.max_lease = Duration::from_secs(600);
        config
    };
    let holder_client = redlock_connect(long()).await;
    let lease = RedLockOptions::new().lease(Duration::from_secs(600));
    let first = holder_client.lock_with("wake", lease).await.expect("lock");
    let first_token = first.token();

    // Connected first: connecting asks each server its run_id (one script
    // call per primary), which is not a waiter's attempt.
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(redlock_connect(long()).await);
    }
    let attempts_before = evalsha_calls(&servers);
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for client in &clients {
        for _ in 0..WAITERS_PER_CLIENT {
            let (client, granted) = (client.clone(), Arc::clone(&granted));
            waiters.push(tokio::spawn(async move {
                let guard = client
                    .lock_with("wake", lease.wait_timeout(Duration::from_secs(60)))
                    .await
                    .expect("the waiter is granted");
                granted.lock().expect("granted").push(guard.token());
                tokio::time::sleep(Duration::from_millis(20)).await;
                guard.release().await.expect("release");
            }));
        }
    }
    // Every waiter's client has subscribed on every primary.
    let deadline = Instant::now() + HANG;
    while !servers.servers().iter().all(|s| {
        s.cmd(&["PUBSUB", "NUMSUB", "fairlock:redlock:{wake}:released"])
            .ok()
            .and_then(|r| r.as_array().and_then(|a| a.get(1)).and_then(|n| n.as_int()))
            == Some(2)
    }) {
        assert!(Instant::now() < deadline, "the waiters never subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        granted.lock().expect("granted").is_empty(),
        "granted while held"
    );
    let waiting = 2 * WAITERS_PER_CLIENT as u64;
    let attempts: Vec<u64> = evalsha_calls(&servers)
        .iter()
        .zip(&attempts_before)
        .map(|(after, before)| after - before)
        .collect();
    assert!(
        attempts.iter().all(|&n| n <= 2 * waiting),
        "polling: {attempts:?} script calls per primary for {waiting} waiters"
    );

    first.release().await.expect("release");
    for waiter in waiters {
        tokio::time::timeout(HANG, waiter)
            .await
            .expect("each waiter is woken by a release")
            .expect("waiter task");
    }
    let granted = granted.lock().expect("granted").clone();
    assert_eq!(granted.len(), 2 * WAITERS_PER_CLIENT);
    let mut previous = first_token;
    for token in granted {
        assert!(token > previous, "tokens increase in grant order");
        previous = token;
    }
}

/// `evalsha` calls on each primary.
fn evalsha_calls(servers: &IndependentPrimaries) -> Vec<u64> {
    servers
        .servers()
        .iter()
        .map(|s| {
            s.commandstats()
                .expect("commandstats")
                .get("evalsha")
                .copied()
                .unwrap_or(0)
        })
        .collect()
}

/// Bad input gets a typed error before any primary is touched; a release
/// after the lease ran out is `NotOwner`; try_lock on a held lock is `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_ownership() {
    let servers = primaries(3);
    let urls = servers.urls();
    let two = RedLock::connect(urls[..2].to_vec()).await;
    assert!(matches!(two, Err(Error::InvalidOptions(_))), "{two:?}");
    let twice = RedLock::connect([urls[0].clone(), urls[1].clone(), urls[0].clone()]).await;
    assert!(matches!(twice, Err(Error::InvalidOptions(_))), "{twice:?}");
    let mut short_delay = config(&servers);
    short_delay.restart_delay = Duration::from_secs(10);
    let short_delay = RedLock::with_config(short_delay).await;
    assert!(
        matches!(&short_delay, Err(Error::InvalidOptions(m)) if m.contains("restart delay")),
        "{short_delay:?}"
    );

    let redlock = redlock_connect(config(&servers)).await;
    let before = evalsha_calls(&servers);
    assert!(matches!(redlock.lock("").await, Err(Error::InvalidName(_))));
    let too_long = RedLockOptions::new().lease(Duration::from_secs(3600));
    assert!(matches!(
        redlock.lock_with("x", too_long).await,
        Err(Error::InvalidOptions(_))
    ));
    assert_eq!(evalsha_calls(&servers), before, "nothing reached a primary");

    let short = redlock
        .lock_with(
            "brief",
            RedLockOptions::new().lease(Duration::from_millis(1_500)),
        )
        .await
        .expect("lock");
    assert!(redlock.try_lock("brief").await.expect("answers").is_none());
    tokio::time::timeout(HANG, short.lost())
        .await
        .expect("a fixed lease ends");
    // The validity ends a little before the keys expire (the drift
    // allowance); wait until they have.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = short.release().await;
    assert!(matches!(late, Err(Error::NotOwner { .. })), "{late:?}");
    let next = redlock.try_lock("brief").await.expect("answers");
    assert!(next.is_some(), "free after the lease ran out");
    drop(next);

    // A lease used up by the time the majority is won (one primary kept
    // busy by a long script) is refused, and its votes are given back.
    let mut refused = None;
    for _ in 0..5 {
        let busy_url = servers.servers()[0].addr();
        let busy = tokio::task::spawn_blocking(move || {
            let spin = "local t = redis.call('TIME'); local s = t[1] * 1000000 + t[2]; \
                        repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] > s + 250000";
            fairlock_testkit::cmd_at(&busy_url, &["EVAL", spin, "0"])
        });
        tokio::time::sleep(Duration::from_millis(60)).await;
        let attempt = redlock
            .try_lock_with(
                "slow",
                RedLockOptions::new().lease(Duration::from_millis(20)),
            )
            .await;
        busy.await.expect("busy script").expect("busy script ran");
        if let Err(error) = attempt {
            refused = Some(error);
            break;
        }
    }
    let refused = refused.expect("a lease used up while winning is refused");
    assert!(matches!(refused, Error::InvalidOptions(_)), "{refused:?}");
    assert!(refused.to_string().contains("too short"), "{refused}");
    let keys: Vec<bool> = servers
        .servers()
        .iter()
        .map(|s| {
            s.cmd(&["EXISTS", "fairlock:redlock:{slow}:owner"])
                .expect("EXISTS")
                .as_int()
                == Some(0)
        })
        .collect();
    assert_eq!(keys, vec![true; 3], "votes given back");
}

/// A client starts with a minority down and picks that primary up when it
/// is back; a waiting `lock` future dropped mid-wait leaves neither a key
/// nor a subscription; a dropped guard releases on every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_down_at_start_is_picked_up_and_cancelled_waits_leave_nothing() {
    let mut servers = primaries(3);
    servers.kill(&[2]);
    let redlock = redlock_connect(config(&servers)).await;
    assert_eq!(redlock.connected(), 2);
    let held = redlock.lock("late").await.expect("lock on 2 of 3");
    servers.restart(2).expect("restart primary 2");
    let deadline = Instant::now() + HANG;
    while redlock.connected() < 3 {
        assert!(Instant::now() < deadline, "primary 2 never reconnected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let other = redlock_connect(config(&servers)).await;
    let waiting = tokio::time::timeout(Duration::from_millis(500), other.lock("late")).await;
    assert!(waiting.is_err(), "still waiting when dropped");
    let channel = "fairlock:redlock:{late}:released";
    let owner_key = "fairlock:redlock:{late}:owner";
    let settled = |servers: &IndependentPrimaries, owner: Option<&str>| {
        servers.servers().iter().all(|s| {
            let subscribers = s
                .cmd(&["PUBSUB", "NUMSUB", channel])
                .ok()
                .and_then(|r| r.as_array().and_then(|a| a.get(1)).and_then(|n| n.as_int()));
            let key = s.cmd(&["GET", owner_key]).expect("GET owner");
            subscribers == Some(0) && key.as_str() == owner
        })
    };
    let deadline = Instant::now() + HANG;
    while !settled(&servers, Some(held.owner_id())) {
        assert!(
            Instant::now() < deadline,
            "a cancelled wait left a key or a subscription"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    drop(held);
    let deadline = Instant::now() + HANG;
    while !settled(&servers, None) {
        assert!(
            Instant::now() < deadline,
            "a dropped guard was not released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(other.try_lock("late").await.expect("answers").is_some());
}

/// A watchdog renewal round that a majority does not confirm is tried
/// again while the lease is still valid: with one primary of three dead, a
/// second one that stalls (CLIENT PAUSE) through a renewal round does not
/// cost the lease, since nobody else can hold a majority before the
/// validity ends. Before, the first unconfirmed round fired the lost
/// signal and stopped the watchdog while the keys were still on a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_renewal_round_is_tried_again_within_the_validity() {
    let mut servers = primaries(3);
    let mut config = config(&servers);
    config.call_timeout = Duration::from_millis(300);
    config.watchdog_lease = Duration::from_secs(6);
    let client = redlock_connect(config).await;
    let guard = tokio::time::timeout(HANG, client.lock("stall"))
        .await
        .expect("no hang")
        .expect("lock");
    servers.kill(&[2]);
    // The first renewal round runs 2 s after the grant (lease 6 s): a 3 s
    // pause outlasts it and its 300 ms call timeouts, and ends well within
    // the grant's validity (about 5.9 s).
    servers.servers()[1]
        .cmd_ok(&["CLIENT", "PAUSE", "3000"])
        .expect("pause a second primary");
    tokio::time::sleep(Duration::from_millis(7_000)).await;
    assert!(
        !guard.is_lost(),
        "the lease outlived a stalled renewal round (validity {:?})",
        guard.validity()
    );
    tokio::time::timeout(HANG, guard.release())
        .await
        .expect("no hang")
        .expect("release");
}

/// The owner id a primary's vote on RedLock lock `name` holds, if any.
fn vote_on(server: &RedisServer, name: &str) -> Option<Vec<u8>> {
    let key = format!("fairlock:redlock:{{{name}}}:owner");
    match server.cmd_ok(&["GET", &key]) {
        Ok(Resp::Bulk(value)) => value,
        other => panic!("GET answered {other:?}"),
    }
}

/// Lets `server`'s default user run the vote script only: a primary that
/// votes and refuses every release (ACL first-argument rule).
fn refuse_releases(server: &RedisServer) {
    let acquire_only = format!("+evalsha|{}", fairlock_core::REDLOCK_ACQUIRE.sha1());
    server
        .cmd_ok(&[
            "ACL",
            "SETUSER",
            "default",
            "-evalsha",
            "-eval",
            &acquire_only,
        ])
        .expect("run the acquire script only");
}

/// Lets `server` run every script again, then waits (bounded: 15 s, far
/// past the retries' 2 s longest pause, far short of the tests' 60 s
/// leases) until its vote on `name` is gone; fails with `stayed` if not.
async fn vote_released_once_scripts_run(server: &RedisServer, name: &str, stayed: &str) {
    server
        .cmd_ok(&["ACL", "SETUSER", "default", "+@all"])
        .expect("allow scripts again");
    let deadline = Instant::now() + Duration::from_secs(15);
    while vote_on(server, name).is_some() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(vote_on(server, name), None, "{stayed}");
}

/// A release that a primary refuses or does not get (here: its user may
/// no longer run scripts) is sent there again until that primary answers,
/// within the lease: the vote there does not stay for the rest of a long
/// lease, splitting other callers' votes. Before, the release ran once
/// and the key stayed on that primary for its 60 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_missed_a_primary_is_sent_there_again() {
    let servers = primaries(3);
    let client = redlock_connect(config(&servers)).await;
    let options = RedLockOptions::new().lease(Duration::from_secs(60));
    let guard = tokio::time::timeout(HANG, client.lock_with("missed", options))
        .await
        .expect("no hang")
        .expect("lock");
    for server in servers.servers() {
        assert!(
            vote_on(server, "missed").is_some(),
            "the vote on {}",
            server.addr()
        );
    }
    let refusing = &servers.servers()[2];
    refusing
        .cmd_ok(&["ACL", "SETUSER", "default", "-evalsha", "-eval"])
        .expect("refuse scripts");
    tokio::time::timeout(HANG, guard.release())
        .await
        .expect("no hang")
        .expect("released on a majority");
    assert!(
        vote_on(refusing, "missed").is_some(),
        "the release ran on the refusing primary"
    );
    vote_released_once_scripts_run(
        refusing,
        "missed",
        "the vote stayed on the primary the release missed",
    )
    .await;
    client.close().await;
}

/// The vote an acquire gave back without reaching its primary is sent
/// there again once the acquire has ended without a guard. One primary
/// lost the holder's key (as in a restart) and votes for a caller, whose
/// try is refused by the other two; that primary runs the acquire script
/// but refuses the release script, so the try's give-back misses it. Once
/// it runs scripts again, the caller's vote there is deleted within the
/// retries' backoff, not left for the 60 s lease. (While an acquire goes
/// on, its give-backs are not retried: its next attempt votes under the
/// same owner id, `quorum.rs::LeftVotes`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_that_missed_a_primary_is_sent_again_once_the_acquire_ends() {
    let servers = primaries(3);
    let holder = redlock_connect(config(&servers)).await;
    let caller = redlock_connect(config(&servers)).await;
    let options = RedLockOptions::new().lease(Duration::from_secs(60));
    let guard = tokio::time::timeout(HANG, holder.lock_with("left", options))
        .await
        .expect("no hang")
        .expect("lock");
    let voting = &servers.servers()[0];
    let held = vote_on(voting, "left").expect("the holder's vote");
    voting
        .cmd_ok(&["DEL", "fairlock:redlock:{left}:owner"])
        .expect("the holder's key lost");
    refuse_releases(voting);
    let tried = tokio::time::timeout(HANG, caller.try_lock_with("left", options))
        .await
        .expect("no hang")
        .expect("a try answered by every primary");
    assert!(tried.is_none(), "the holder keeps a majority");
    let left = vote_on(voting, "left").expect("the caller's vote, its give-back refused");
    assert_ne!(left, held, "the primary voted for the caller");
    vote_released_once_scripts_run(
        voting,
        "left",
        "the vote stayed on the primary the give-back missed",
    )
    .await;
    guard.release().await.expect("release");
    caller.close().await;
    holder.close().await;
}

/// An acquire dropped half way (its caller's timeout) gives its votes
/// back in the background, and a primary that give-back did not reach
/// gets it again: here one primary runs the acquire script but refuses the
/// release script, and another is paused so that the attempt is still
/// waiting for its vote when the caller gives up. Once the refusing
/// primary runs scripts again, the dropped acquire's vote there is deleted
/// within the retries' backoff, not left for the 60 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquires_votes_are_given_back_where_first_missed() {
    let servers = primaries(3);
    // The paused primary's vote is waited for far longer than the caller
    // waits: the attempt is surely under way when it is dropped.
    let mut config = config(&servers);
    config.call_timeout = Duration::from_secs(3);
    config.watchdog_lease = Duration::from_secs(30);
    let caller = redlock_connect(config).await;
    let refusing = &servers.servers()[0];
    refuse_releases(refusing);
    servers.servers()[2]
        .cmd_ok(&["CLIENT", "PAUSE", "3500"])
        .expect("pause a primary");
    let options = RedLockOptions::new().lease(Duration::from_secs(60));
    let acquire = caller.lock_with("dropped", options);
    let dropped = tokio::time::timeout(Duration::from_millis(500), acquire).await;
    assert!(
        dropped.is_err(),
        "the attempt waited for the paused primary"
    );
    assert!(
        vote_on(refusing, "dropped").is_some(),
        "the refusing primary voted for the dropped acquire"
    );
    vote_released_once_scripts_run(
        refusing,
        "dropped",
        "the dropped acquire's vote stayed on the primary its give-back missed",
    )
    .await;
    caller.close().await;
}

/// A grant's validity is `lease - elapsed - drift` from when the grant
/// returns (RedLock's rule, and what the README and `validity()` say): the
/// keys were set no earlier than the attempt's start, so the lock is held
/// until `start + lease - drift`. A primary paused 700 ms makes the
/// attempt slow. Checked as an inequality on the test's own clock
/// readings (no timing assumed): validity read + time since before the
/// call >= lease - drift. Before, the deadline was `start + (lease -
/// elapsed - drift)`, taking the attempt's time off twice: a grant that
/// took over half its lease came back already expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_grants_validity_counts_its_time_once() {
    let servers = primaries(3);
    let config = config(&servers);
    let lease = Duration::from_secs(2);
    let drift = lease.mul_f64(config.drift_factor) + config.drift_floor;
    let client = redlock_connect(config).await;
    servers.servers()[2]
        .cmd_ok(&["CLIENT", "PAUSE", "700"])
        .expect("pause a primary");
    let before = Instant::now();
    let guard = tokio::time::timeout(
        HANG,
        client.lock_with("slow", RedLockOptions::new().lease(lease)),
    )
    .await
    .expect("no hang")
    .expect("a majority within the lease");
    let validity = guard.validity();
    let since = before.elapsed();
    assert!(
        validity + since >= lease - drift,
        "validity {validity:?} after {since:?}: the grant's time was taken off twice (lease {lease:?}, drift {drift:?})"
    );
    guard.release().await.expect("release");
    client.close().await;
}

/// Waiters on many locks are not held up behind one another by a primary
/// that stalls (CLIENT PAUSE: connected, answering nothing): each lock's
/// first waiter subscribes to its release notices on every primary, which
/// costs that primary's call timeouts, and those subscriptions used to go
/// one at a time through one client-wide gate, outside the wait timeout.
/// Eighty waiters with a 1 s wait timeout each then took up to 80 x 2 call
/// timeouts to come back; now they subscribe side by side within their
/// wait timeouts, and every one ends within the hang guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_primary_does_not_hold_up_the_waiters_of_other_locks() {
    const LOCKS: usize = 80;
    let servers = primaries(3);
    // The test's usual 900 ms call timeout: a live primary answering late
    // under 80 waiters must not cost a vote. The old one-at-a-time
    // subscriptions then take 80 x 1.8 s, far past the hang guard.
    let config = config(&servers);
    let holder = redlock_connect(config.clone()).await;
    let waiting = Arc::new(redlock_connect(config).await);
    let mut guards = Vec::new();
    for i in 0..LOCKS {
        guards.push(
            tokio::time::timeout(HANG, holder.lock(&format!("stalled-{i}")))
                .await
                .expect("no hang")
                .expect("lock"),
        );
    }
    servers.servers()[2]
        .cmd_ok(&["CLIENT", "PAUSE", "30000"])
        .expect("stall a primary");
    let mut tasks = Vec::new();
    for i in 0..LOCKS {
        let waiting = Arc::clone(&waiting);
        tasks.push(tokio::spawn(async move {
            let options = RedLockOptions::new().wait_timeout(Duration::from_secs(1));
            waiting
                .lock_with(&format!("stalled-{i}"), options)
                .await
                .map(drop)
        }));
    }
    let all = async {
        for task in tasks {
            let outcome = task.await.expect("task");
            assert!(
                matches!(outcome, Err(Error::WaitTimeout { .. })),
                "{outcome:?}"
            );
        }
    };
    tokio::time::timeout(HANG, all)
        .await
        .expect("every waiter ended within its wait timeout, not one after another");
    // The paused primary stays paused (CLIENT UNPAUSE would wait behind
    // the pause too); the kit kills it when the test ends.
    drop(guards);
}

/// The audit's finding: the check that no primary is listed twice compared
/// URL text, so one server under two URLs (`a` and `a/0`, `localhost` and
/// `127.0.0.1`, two db numbers) counted twice and a "majority" could be one
/// server. Each such list is refused with `InvalidOptions` naming both URLs
/// (by host and port before connecting, by the server's `run_id` once it
/// answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_listed_under_two_urls_is_refused() {
    let a = RedisServer::start().expect("start a");
    let b = RedisServer::start().expect("start b");
    let a_url = a.url();
    let cases = [
        (a_url.clone(), format!("{a_url}/0")),
        (format!("redis://localhost:{}", a.port()), a_url.clone()),
        (format!("{a_url}/1"), format!("{a_url}/2")),
    ];
    let mut wrong = Vec::new();
    for (first, second) in cases {
        let urls = vec![first.clone(), b.url(), second.clone()];
        match RedLock::with_config(redlock_config(urls.clone())).await {
            Err(Error::InvalidOptions(message))
                if message.contains(&first) && message.contains(&second) => {}
            Ok(redlock) => {
                wrong.push(format!(
                    "{urls:?} connected with {} primaries: one server counted twice",
                    redlock.connected()
                ));
                redlock.close().await;
            }
            other => wrong.push(format!(
                "{urls:?}: expected InvalidOptions naming both URLs, got {other:?}"
            )),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Forwards `127.0.0.1:port` to `127.0.0.1:target` until aborted; counts the
/// connections it accepted, and those that have ended since.
async fn forward(
    port: u16,
    target: u16,
) -> (
    tokio::task::JoinHandle<()>,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the alias port");
    let accepted = Arc::new(AtomicUsize::new(0));
    let ended = Arc::new(AtomicUsize::new(0));
    let (counter, ends) = (Arc::clone(&accepted), Arc::clone(&ended));
    let task = tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let ends = Arc::clone(&ends);
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
                ends.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (task, accepted, ended)
}

/// A primary down at connect is checked when it first answers: here the
/// third URL is a port nobody listens on at connect, which later forwards
/// to primary 0. It must not vote: with primary 1 killed, `try_lock` is
/// `NoQuorum` naming the alias as the same server as primary 0, not a grant
/// by primary 0 alone (the audit's probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_primary_that_is_another_listed_server_does_not_vote() {
    let mut servers = primaries(2);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut urls = servers.urls();
    urls.push(format!("redis://127.0.0.1:{port}"));
    let redlock = redlock_connect(redlock_config(urls)).await;
    assert_eq!(redlock.connected(), 2);
    let asked_primary_1 = || script_calls_on(&servers.servers()[1]);
    let asked_before = asked_primary_1();

    let (forwarder, accepted, ended) = forward(port, servers.servers()[0].port()).await;
    // The reconnect task connects the alias, reads its run_id, asks the
    // other primaries theirs (primary 1 among them), and refuses the
    // alias: it records it as primary 0's server, then closes the
    // connection. Wait (bounded) for both, not for a fixed 3 s, which a
    // loaded machine could overrun and leave the alias merely
    // disconnected when try_lock ran. (A connect that failed closes its
    // connection too, but asks no other primary.)
    let deadline = Instant::now() + HANG;
    while accepted.load(Ordering::SeqCst) == 0
        || ended.load(Ordering::SeqCst) == 0
        || asked_primary_1() == asked_before
    {
        assert!(
            Instant::now() < deadline,
            "the client never identified the alias (connections {} accepted, {} ended)",
            accepted.load(Ordering::SeqCst),
            ended.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    servers.kill(&[1]);
    let attempt = tokio::time::timeout(HANG, redlock.try_lock("probe"))
        .await
        .expect("try_lock does not hang");
    match attempt {
        Err(Error::NoQuorum {
            answered, failures, ..
        }) => {
            assert_eq!(answered, 1, "{failures:?}");
            let alias = failures.iter().find(|f| f.index == 2);
            assert!(
                matches!(alias, Some(f) if matches!(&f.kind, PrimaryFailureKind::Failed(m) if m.contains(&servers.urls()[0]))),
                "the alias is named as primary 0's server: {failures:?}"
            );
        }
        Ok(Some(guard)) => panic!(
            "granted by one server (primary 0 and its alias): token {}",
            guard.token().value()
        ),
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    assert_eq!(
        redlock.connected(),
        1,
        "the alias of primary 0 is not counted"
    );
    forwarder.abort();
}

/// Subscribers of `channel` on `server` (`PUBSUB NUMSUB`).
fn numsub(server: &RedisServer, channel: &str) -> i64 {
    server
        .cmd(&["PUBSUB", "NUMSUB", channel])
        .ok()
        .and_then(|r| r.as_array().and_then(|a| a.get(1)).and_then(|n| n.as_int()))
        .unwrap_or(0)
}

/// Script calls (`EVALSHA` and `EVAL`) `server` has run so far.
fn script_calls_on(server: &RedisServer) -> u64 {
    let stats = server.commandstats().expect("commandstats");
    ["evalsha", "eval"]
        .iter()
        .map(|command| stats.get(*command).copied().unwrap_or(0))
        .sum()
}

/// [`script_calls_on`] each primary.
fn script_calls(servers: &IndependentPrimaries) -> Vec<u64> {
    servers.servers().iter().map(script_calls_on).collect()
}

/// Connections each server has accepted so far.
fn connections_received(servers: &IndependentPrimaries) -> Vec<String> {
    servers
        .servers()
        .iter()
        .map(|s| {
            s.info("stats")
                .expect("INFO stats")
                .get("total_connections_received")
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

/// A primary URL that does not parse used to be accepted: the client
/// connected with the 2 good primaries and retried the bad one forever,
/// leaving no fault tolerance. It is refused with `InvalidOptions` naming
/// the entry (its password redacted) before any primary is contacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_url_that_does_not_parse_is_refused_before_any_primary_is_contacted() {
    let servers = primaries(2);
    let [a, c] = [servers.urls()[0].clone(), servers.urls()[1].clone()];
    let before = connections_received(&servers);
    for (bad, named) in [
        ("not a url at all", "not a url at all"),
        // fred reads an unknown scheme as a single server.
        ("http://127.0.0.1:6379", "http://127.0.0.1:6379"),
        (
            "redis://user:secret@127.0.0.1:notaport",
            "redis://user:***@127.0.0.1:notaport",
        ),
    ] {
        match RedLock::with_config(redlock_config(vec![bad.to_owned(), a.clone(), c.clone()])).await
        {
            Err(Error::InvalidOptions(message)) => {
                assert!(message.contains(named), "names the entry: {message}");
                assert!(!message.contains("secret"), "redacted: {message}");
            }
            Ok(redlock) => panic!(
                "[{bad:?}, a, c] connected with {} of 3 primaries",
                redlock.connected()
            ),
            Err(other) => panic!("expected InvalidOptions, got {other:?}"),
        }
    }
    assert_eq!(
        connections_received(&servers),
        before,
        "no primary was contacted"
    );
}

/// A drift allowance as long as the lease leaves no validity whatever the
/// primaries answer. It used to be taken: every attempt voted on every
/// primary, raised the fence counter, gave the votes back with a release
/// notice and then failed with "lease too short". It is refused before any
/// primary is touched: in the config (the watchdog lease) and per call (a
/// fixed lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drift_allowance_that_uses_up_the_lease_is_refused_before_any_primary_is_touched() {
    let servers = primaries(3);
    let mut whole = config(&servers);
    whole.drift_floor = whole.watchdog_lease;
    match whole.validate() {
        Err(Error::InvalidOptions(message)) => assert!(message.contains("drift"), "{message}"),
        other => panic!("a drift floor as long as the watchdog lease was taken: {other:?}"),
    }
    let mut floor = config(&servers);
    floor.drift_floor = Duration::from_millis(50);
    let redlock = redlock_connect(floor).await;
    let before = evalsha_calls(&servers);
    for attempt in 0..2 {
        let short = RedLockOptions::new().lease(Duration::from_millis(40));
        let refused = if attempt == 0 {
            redlock.lock_with("drifting", short).await.map(|_| ())
        } else {
            redlock.try_lock_with("drifting", short).await.map(|_| ())
        };
        match refused {
            Err(Error::InvalidOptions(message)) => assert!(message.contains("drift"), "{message}"),
            other => panic!("a 40 ms lease under a 50 ms drift floor: {other:?}"),
        }
    }
    assert_eq!(evalsha_calls(&servers), before, "nothing reached a primary");
    for server in servers.servers() {
        let seq = server
            .cmd(&["EXISTS", "fairlock:redlock:{drifting}:seq"])
            .expect("EXISTS");
        assert_eq!(seq.as_int(), Some(0), "no fence counter was made");
    }
    redlock.close().await;
}

/// A woken waiter's random pause before it tries (the wake jitter) ends at
/// its wait timeout and at `close()`: with a long jitter a `lock_with`
/// overran its wait timeout by up to the jitter, and `close()` waited it
/// out, because the pause raced neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiters_jitter_ends_at_its_wait_timeout_and_at_close() {
    let servers = primaries(3);
    let holder = redlock_connect(config(&servers)).await;
    let mut long = config(&servers);
    long.wake_jitter = Duration::from_secs(3600);
    let waiters = redlock_connect(long).await;
    let lease = RedLockOptions::new().lease(Duration::from_secs(30));
    for ends in ["wait timeout", "close"] {
        let held = holder.lock_with("jitter", lease).await.expect("lock");
        let wait = match ends {
            "wait timeout" => lease.wait_timeout(Duration::from_secs(2)),
            _ => lease,
        };
        let before = script_calls(&servers);
        let waiter = {
            let waiters = waiters.clone();
            tokio::spawn(async move { waiters.lock_with("jitter", wait).await.map(|_| ()) })
        };
        // Subscribed and waiting for the lease, 30 s away: subscribed on
        // every primary, and past the attempt that follows the subscribing
        // (two attempts on each primary). Before, a 500 ms sleep stood for
        // this; a waiter slower than that took the lock once released.
        let deadline = Instant::now() + HANG;
        while !servers.servers().iter().zip(&before).all(|(s, &calls)| {
            numsub(s, "fairlock:redlock:{jitter}:released") == 1 && script_calls_on(s) >= calls + 2
        }) {
            assert!(Instant::now() < deadline, "the waiter never waited");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        held.release().await.expect("release");
        if ends == "close" {
            // The release notice is in the waiter's process (before, a
            // 200 ms sleep): it is woken and sits out its jitter.
            for server in servers.servers() {
                fairlock_tests::wait_for_subscribers_to_have_everything(server).await;
            }
            waiters.close().await;
        }
        let ended = tokio::time::timeout(HANG, waiter)
            .await
            .unwrap_or_else(|_| panic!("the woken waiter sat out its jitter past its {ends}"))
            .expect("task");
        match ends {
            "wait timeout" => {
                assert!(matches!(ended, Err(Error::WaitTimeout { .. })), "{ended:?}")
            }
            _ => assert!(matches!(ended, Err(Error::Closed)), "{ended:?}"),
        }
    }
    holder.close().await;
}
