//! Deadlines, leases, tickets and tokens come from the server's clock
//! (`TIME` inside the scripts), never from the client's.
//!
//! The server runs under libfaketime with its wall clock ten days ahead of
//! this test process's (`RedisServerBuilder::clock_offset`); the client
//! runs on the real clock. Every check below compares a value fairlock
//! wrote with the server's `TIME` read just before and after, with a
//! minute of slack: a value taken from the client's clock would be ten
//! days off and fail it. No check measures elapsed wall-clock time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fairlock::{ClientConfig, LockClient, LockGuard, LockOptions};
use fairlock_testkit::ServerKind;
use fairlock_tests::*;
use tokio::sync::mpsc;

/// How far the server's clock runs ahead of the test's.
const OFFSET_SECS: i64 = 10 * 86_400;
/// How far a value may be from the server's clock it should follow: room
/// for a slow machine, and ten thousand times less than the offset.
const SLACK_MS: i64 = 60_000;
/// Short heartbeats and waiter timeout: a deadline written from the wrong
/// clock makes a waiter dead at the next heartbeat.
const HEARTBEAT: Duration = Duration::from_millis(100);
const WAITER_TIMEOUT: Duration = Duration::from_secs(2);
/// Every lease asked for: long enough that its PTTL, read a moment later,
/// is within [`SLACK_MS`] of it.
const LEASE: Duration = Duration::from_secs(3600);

/// The server's `TIME`, in microseconds.
fn server_us(server: &RedisServer) -> i64 {
    let time = server.cmd_ok(&["TIME"]).expect("TIME");
    let parts = time.as_array().expect("TIME answers two numbers");
    let field = |i: usize| -> i64 {
        parts[i]
            .as_str()
            .and_then(|text| text.parse().ok())
            .expect("TIME answers digits")
    };
    field(0) * 1_000_000 + field(1)
}

/// The test process's clock, in microseconds.
fn client_us() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(since_epoch.as_micros()).expect("microseconds fit in i64")
}

/// Asserts that `value` (in `unit`s of a µs) is within [`SLACK_MS`] of the
/// server's clock between `before` and `after` (µs) plus `plus` µs.
fn assert_follows_server_clock(
    what: &str,
    value: i64,
    unit: i64,
    before: i64,
    after: i64,
    plus: i64,
) {
    let value_us = value * unit;
    let slack_us = SLACK_MS * 1000;
    assert!(
        value_us >= before + plus - slack_us && value_us <= after + plus + slack_us,
        "{what} is {value_us} µs: not within a minute of the server's clock \
         ({before}..{after} µs, plus {plus} µs) but {:.3} days off it, and {:.3} \
         days off the test's clock",
        (value_us - plus - after) as f64 / 86_400e6,
        (value_us - plus - client_us()) as f64 / 86_400e6,
    );
}

/// Starts a server whose clock runs [`OFFSET_SECS`] ahead, and checks it
/// does (assertion 1: the setup worked). On valkey-server, if it cannot
/// run under libfaketime, says so with [`skip`] and returns `None`; on
/// redis-server that fails the test.
fn skewed_server(test: &str) -> Option<RedisServer> {
    let kind = ServerKind::from_env().expect("FAIRLOCK_TEST_SERVER names a server");
    let refuse = |why: String| {
        if kind == ServerKind::Valkey {
            skip(test, &why);
            None
        } else {
            panic!("{why}")
        }
    };
    let server = match RedisServer::builder().clock_offset(OFFSET_SECS).start() {
        Ok(server) => server,
        Err(error) => {
            return refuse(format!(
                "the server does not start under libfaketime: {error}"
            ))
        }
    };
    let skew_ms = (server_us(&server) - client_us()) / 1000;
    if (skew_ms - OFFSET_SECS * 1000).abs() > SLACK_MS {
        return refuse(format!(
            "libfaketime did not shift the server's clock: TIME is {skew_ms} ms ahead of \
             the test's clock, asked {} ms",
            OFFSET_SECS * 1000
        ));
    }
    Some(server)
}

/// A client with short heartbeats and waiter timeout.
async fn skew_client(server: &RedisServer) -> LockClient {
    let config = ClientConfig::builder(server.url())
        .connect_timeout(Duration::from_secs(3))
        .command_timeout(Duration::from_secs(3))
        .heartbeat_interval(HEARTBEAT)
        .waiter_timeout(WAITER_TIMEOUT)
        .build()
        .expect("valid timings");
    LockClient::with_config(config)
        .await
        .expect("connects to the skewed server")
}

fn lease() -> LockOptions {
    LockOptions::new().lease(LEASE)
}

/// Asserts the holder's key expires in about [`LEASE`]: set with a
/// relative `PX` of the lease, so on the server's clock. An expiry at an
/// instant computed on the client's clock would be ten days in the
/// server's past (the key gone, -2).
fn assert_lease_is_what_was_asked(server: &RedisServer, name: &str) {
    let left = pttl(server, keys(name).owner());
    let asked = i64::try_from(LEASE.as_millis()).expect("lease in ms");
    assert!(
        left <= asked && left > asked - SLACK_MS,
        "the holder's PTTL is {left} ms, asked {asked} ms"
    );
}

/// The queue's entries with their tickets, oldest first.
fn queue_with_tickets(server: &RedisServer, name: &str) -> Vec<(String, i64)> {
    let reply = server
        .cmd_ok(&["ZRANGE", keys(name).queue(), "0", "-1", "WITHSCORES"])
        .expect("ZRANGE");
    let items = reply.as_array().expect("ZRANGE answers an array");
    items
        .chunks(2)
        .map(|pair| {
            let owner_id = pair[0].as_str().expect("owner id").to_owned();
            let ticket = pair[1]
                .as_str()
                .and_then(|score| score.parse::<f64>().ok())
                .expect("a numeric ticket");
            (owner_id, ticket as i64)
        })
        .collect()
}

/// The client tag inside an owner id (`<nonce>.<tag>.<lease ms>`): the
/// member of the `alive` zset.
fn tag_of(owner_id: &str) -> &str {
    owner_id.split('.').nth(1).expect("owner id has a tag")
}

/// The heartbeat deadline of process `tag` on lock `name`, in ms.
fn alive_deadline(server: &RedisServer, name: &str, tag: &str) -> i64 {
    let score = server
        .cmd_ok(&["ZSCORE", keys(name).alive(), tag])
        .expect("ZSCORE");
    score
        .as_str()
        .and_then(|score| score.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("process {tag} has no deadline: {score:?}")) as i64
}

/// Assertion 1 on its own: the server's `TIME` is ten days ahead of the
/// test's `SystemTime`, so the tests below tell the clocks apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_clock_runs_ten_days_ahead_of_the_tests() {
    let test = "the_servers_clock_runs_ten_days_ahead_of_the_tests";
    let Some(server) = skewed_server(test) else {
        return;
    };
    let skew_days = (server_us(&server) - client_us()) as f64 / 86_400e6;
    assert!((skew_days - 10.0).abs() < 0.01, "{skew_days} days");
}

/// Assertion 2: every time a script writes follows the server's clock.
///
/// * The holder's fencing token, the waiter's queue ticket and the
///   waiter's token are drawn from `TIME` in µs (`next_seq` in
///   includes/common.lua, `fast_draw` in fast_paths/draw.lua): each is
///   within a minute of the server's `TIME` around the call. A number
///   drawn from the client's clock would be ten days below it. A draw is
///   the clock or one above the lock's counter, whichever is higher, so
///   the test deletes the counter before the waiter queues and before the
///   handoff (a lost counter is a fault the protocol survives, the clock
///   being its floor): each number is then the clock itself, and a clock
///   ten days behind would also make the waiter's token lower than the
///   holder's.
/// * The waiter's liveness deadline in `alive` is the server's `TIME` in
///   ms plus the waiter timeout: one written from the client's clock
///   would be ten days in the server's past.
/// * Both leases (the holder's, set by acquire, and the waiter's, set by
///   the handoff in release) have a PTTL of what was asked: an expiry at
///   a client-clock instant would have removed the key at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_tickets_and_tokens_follow_the_servers_clock() {
    let test = "deadlines_tickets_and_tokens_follow_the_servers_clock";
    let Some(server) = skewed_server(test) else {
        return;
    };
    let (holders, waiters) = (skew_client(&server).await, skew_client(&server).await);
    let name = "clock";

    let before = server_us(&server);
    let holder = holders.lock_with(name, lease()).await.expect("holder");
    let after = server_us(&server);
    let holder_token = i64::try_from(holder.token().value()).expect("token fits i64");
    assert_follows_server_clock("the holder's token", holder_token, 1, before, after, 0);
    assert_lease_is_what_was_asked(&server, name);

    server.cmd_ok(&["DEL", keys(name).seq()]).expect("DEL seq");
    let before = server_us(&server);
    let waiting = {
        let waiters = waiters.clone();
        tokio::spawn(async move { waiters.lock_with(name, lease()).await })
    };
    wait_for_queue_len(&holders, name, 1).await;
    let after = server_us(&server);
    let queue = queue_with_tickets(&server, name);
    let [(owner_id, ticket)] = queue.as_slice() else {
        panic!("one waiter queued, found {queue:?}");
    };
    assert_follows_server_clock("the waiter's ticket", *ticket, 1, before, after, 0);
    let timeout_us = i64::try_from(WAITER_TIMEOUT.as_micros()).expect("timeout in µs");
    // A heartbeat may have moved the deadline on since the enqueue: read
    // the server's clock again after the deadline.
    let deadline = alive_deadline(&server, name, tag_of(owner_id));
    let now = server_us(&server);
    assert_follows_server_clock(
        "the waiter's liveness deadline",
        deadline,
        1000,
        before,
        now,
        timeout_us,
    );

    server.cmd_ok(&["DEL", keys(name).seq()]).expect("DEL seq");
    let before = server_us(&server);
    holder.release().await.expect("release");
    let guard = granted(waiting, "the waiter").await;
    let after = server_us(&server);
    assert_eq!(guard.owner_id(), owner_id);
    assert_eq!(guard.ticket(), Some(*ticket as u64));
    let token = i64::try_from(guard.token().value()).expect("token fits i64");
    assert!(token > holder_token, "{token} after {holder_token}");
    assert_follows_server_clock("the waiter's token", token, 1, before, after, 0);
    assert_lease_is_what_was_asked(&server, name);
    guard.release().await.expect("release");
}

/// Assertion 3: the lock works end to end across the skew. A holder on
/// one client, four waiters queued from another client in a known order;
/// the test waits until the server's clock has passed the first liveness
/// deadline it read (more than a waiter timeout on the server's clock, so
/// the waiters stayed alive only by their heartbeats' refreshed
/// deadlines), then checks none was dropped: the same entries, with the
/// same tickets, still queued, and each refreshed deadline within a
/// minute of the server's `TIME` plus the waiter timeout. Then each is
/// granted in ticket order with strictly increasing tokens and the lease
/// it asked for.
///
/// With a deadline written from the client's clock (ten days in the
/// server's past) the heartbeat script would find the waiters dead and
/// drop them from the queue at the first beat (they would queue again
/// with new entries, or be skipped at the handoff): the queue check and
/// the deadline check fail. The wait itself reads the server's clock, so
/// it ends whatever the skew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_across_the_skew_is_granted_in_ticket_order() {
    let test = "a_queue_across_the_skew_is_granted_in_ticket_order";
    let Some(server) = skewed_server(test) else {
        return;
    };
    let (holders, waiters) = (skew_client(&server).await, skew_client(&server).await);
    let name = "skewed-queue";
    const WAITERS: usize = 4;

    let holder = holders.lock_with(name, lease()).await.expect("holder");
    let mut last_token = holder.token().value();
    let (grants, mut granted_rx) = mpsc::unbounded_channel::<(usize, LockGuard)>();
    for i in 0..WAITERS {
        let (waiters, grants) = (waiters.clone(), grants.clone());
        tokio::spawn(async move {
            let guard = waiters.lock_with(name, lease()).await.expect("waiter");
            let _ = grants.send((i, guard));
        });
        wait_for_queue_len(&holders, name, i as u64 + 1).await;
    }
    let queued = queue_with_tickets(&server, name);
    assert_eq!(queued.len(), WAITERS, "{queued:?}");
    assert!(
        queued.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "tickets not increasing: {queued:?}"
    );
    let tag = tag_of(&queued[0].0).to_owned();
    assert!(queued.iter().all(|(owner_id, _)| tag_of(owner_id) == tag));

    // Wait, on the server's clock, past the first deadline read.
    let first_deadline = alive_deadline(&server, name, &tag);
    within("the server's clock to pass the first deadline", async {
        while server_us(&server) / 1000 <= first_deadline + 1 {
            tokio::time::sleep(HEARTBEAT).await;
        }
    })
    .await;
    let deadline = alive_deadline(&server, name, &tag);
    let now = server_us(&server);
    assert!(
        deadline > first_deadline,
        "the waiters' deadline went from {first_deadline} to {deadline} ms while the \
         server's clock passed the first: no heartbeat moved it on from the server's clock"
    );
    let timeout_us = i64::try_from(WAITER_TIMEOUT.as_micros()).expect("timeout in µs");
    // The refresh came at most a waiter timeout before `now`.
    assert_follows_server_clock(
        "the refreshed deadline",
        deadline,
        1000,
        now - timeout_us,
        now,
        timeout_us,
    );
    assert_eq!(
        queue_with_tickets(&server, name),
        queued,
        "a waiter was dropped or queued again across the skew"
    );

    holder.release().await.expect("release");
    for (expected, (owner_id, ticket)) in queued.iter().enumerate() {
        let (index, guard) = within("the next grant", granted_rx.recv())
            .await
            .expect("a grant");
        assert_eq!(index, expected, "granted out of order");
        assert_eq!(guard.owner_id(), owner_id);
        assert_eq!(guard.ticket(), Some(*ticket as u64));
        let token = guard.token().value();
        assert!(token > last_token, "token {token} after {last_token}");
        last_token = token;
        assert_lease_is_what_was_asked(&server, name);
        guard.release().await.expect("release");
    }
    assert!(granted_rx.try_recv().is_err(), "a grant too many");
}
