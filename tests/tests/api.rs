//! The API surface against a real server: errors that keep their source,
//! binary-safe fenced values and lock names, the validating config
//! builder, and `try_lock_with`'s wait timeout.

use std::time::Duration;

use fairlock::{Error, FencedOp, FencedScript, LockOptions, Reply};
use fairlock_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_error_keeps_the_redis_clients_error_as_its_source() {
    let server = server();
    let client = client(&server).await;
    let guard = client.lock("api:errors").await.expect("lock");
    // Not Lua: SCRIPT LOAD refuses it with a plain ERR, which no variant of
    // its own covers.
    let broken = FencedScript::new("this is not lua (");
    let error = client
        .fenced_eval(
            &broken,
            "{api:e}:fence",
            &["{api:e}:x"],
            guard.token(),
            &[] as &[&str],
        )
        .await
        .expect_err("a script that does not compile fails");
    let Error::Redis { operation, source } = &error else {
        panic!("expected Error::Redis, got {error:?}");
    };
    assert_eq!(operation, "SCRIPT LOAD");
    assert!(
        source.details().contains("compiling"),
        "Redis's own message is kept: {source:?}"
    );
    let chained = std::error::Error::source(&error).expect("Error::Redis has a source");
    let fred = chained
        .downcast_ref::<fairlock::RedisError>()
        .expect("the source is the Redis client's error, not a string");
    assert_eq!(fred, source);
    assert!(
        error.to_string().contains("then retry"),
        "the message says what to do: {error}"
    );
    guard.release().await.expect("release");
}

/// Every byte value, none of it UTF-8 as a whole.
fn binary_value() -> Vec<u8> {
    let mut value: Vec<u8> = (0..=255u8).rev().collect();
    value.extend_from_slice(b"\xff\xfe\x00\xc3(");
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_values_pass_through_the_fenced_api_unchanged() {
    let server = server();
    let client = client(&server).await;
    let guard = client.lock("api:binary-values").await.expect("lock");
    let (fence, value_key, hash_key) = ("{api:b}:fence", "{api:b}:value", "{api:b}:hash");
    let value = binary_value();
    assert!(std::str::from_utf8(&value).is_err());

    client
        .fenced_write(fence, value_key, guard.token(), FencedOp::set(&value))
        .await
        .expect("fenced SET of a binary value");
    let read = client
        .fenced_write(fence, value_key, guard.token(), FencedOp::Get)
        .await
        .expect("fenced GET");
    assert_eq!(read, Reply::Bytes(value.clone()), "no byte replaced");
    assert_eq!(read.as_bytes(), Some(&value[..]));
    // Redis itself holds the exact bytes.
    assert_eq!(
        server.cmd(&["GET", value_key]).expect("GET"),
        Resp::Bulk(Some(value.clone()))
    );

    let field = b"\x80field";
    client
        .fenced_write(
            fence,
            hash_key,
            guard.token(),
            FencedOp::hset(field, &value),
        )
        .await
        .expect("fenced HSET with a binary field and value");
    let read = client
        .fenced_write(fence, hash_key, guard.token(), FencedOp::hget(field))
        .await
        .expect("fenced HGET");
    assert_eq!(read, Reply::Bytes(value.clone()));

    // A fenced script gets binary arguments and returns binary values as is.
    let echo = FencedScript::new("return ARGV[1]");
    let echoed = client
        .fenced_eval(&echo, fence, &[] as &[&str], guard.token(), &[&value])
        .await
        .expect("fenced script");
    assert_eq!(echoed, Reply::Bytes(value.clone()));
    // Text stays text.
    let echoed = client
        .fenced_eval(&echo, fence, &[] as &[&str], guard.token(), &["plain ü"])
        .await
        .expect("fenced script");
    assert_eq!(echoed, Reply::Str("plain ü".to_owned()));
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_lock_names_are_locks_of_their_own() {
    let server = server();
    let client = client(&server).await;
    // Both render as "job\u{FFFD}" for people; they are different locks.
    let (ff, fe) = (b"job\xff".as_slice(), b"job\xfe".as_slice());
    let guard = client.lock(ff).await.expect("a binary name locks");
    assert_eq!(guard.lock_name().as_bytes(), ff);
    assert_eq!(guard.name(), "job\u{fffd}");
    let other = client
        .try_lock(fe)
        .await
        .expect("try_lock")
        .expect("a different binary name is a different lock");
    // Nor is the text that spells the escape the same lock.
    let text = client
        .try_lock("job%FF")
        .await
        .expect("try_lock")
        .expect("the text of an escape is another name");
    assert!(client.try_lock(ff.to_vec()).await.expect("try").is_none());

    // The keys in Redis are text, escaped, in one hash tag per name.
    for owner in [
        "fairlock:{job%FF}:owner",
        "fairlock:{job%FE}:owner",
        "fairlock:{job%25FF}:owner",
    ] {
        assert_eq!(
            server.cmd(&["EXISTS", owner]).expect("EXISTS"),
            Resp::Int(1),
            "{owner}"
        );
    }
    let state = client.inspect(ff).await.expect("inspect by bytes");
    assert_eq!(state.owner.as_deref(), Some(guard.owner_id()));
    // A checked LockName is a name wherever one is taken.
    let by_name = client.inspect(guard.lock_name()).await.expect("inspect");
    assert_eq!(by_name.token, guard.token().value());

    // Re-entry is keyed by the exact bytes too.
    let owner = client.owner();
    let outer = owner.lock(b"acct\x80".to_vec()).await.expect("owner lock");
    assert_eq!(owner.hold_count(b"acct\x80"), 1);
    assert_eq!(owner.hold_count(b"acct\x81"), 0);
    let inner = owner.lock(b"acct\x80").await.expect("re-enter");
    assert_eq!(inner.token(), outer.token());

    for guard in [guard, other, text, inner, outer] {
        guard.release().await.expect("release");
    }
    assert_eq!(client.inspect(ff).await.expect("inspect").owner, None);
    assert!(matches!(
        client.lock(b"").await,
        Err(Error::InvalidName(fairlock::NameError::Empty))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_builder_checks_every_value_before_any_connection() {
    use fairlock::{ClientConfig, EvictionCheck, LockClient};
    // Nothing listens on port 1: a refused value never got that far.
    let builder = || ClientConfig::builder("redis://127.0.0.1:1");
    let refused = [
        (
            "zero connect timeout",
            builder().connect_timeout(Duration::ZERO).build(),
        ),
        (
            "zero command timeout",
            builder().command_timeout(Duration::ZERO).build(),
        ),
        (
            "zero heartbeat",
            builder().heartbeat_interval(Duration::ZERO).build(),
        ),
        (
            "zero watchdog lease",
            builder().watchdog_lease(Duration::ZERO).build(),
        ),
        (
            "waiter TTL shorter than the heartbeat",
            builder()
                .heartbeat_interval(Duration::from_secs(2))
                .waiter_timeout(Duration::from_secs(1))
                .build(),
        ),
        (
            "waiter TTL equal to the heartbeat",
            builder()
                .heartbeat_interval(Duration::from_secs(1))
                .waiter_timeout(Duration::from_secs(1))
                .build(),
        ),
        (
            // Accepted before: a heartbeat call slower than 10 ms cost
            // every live waiter of the process its place.
            "waiter TTL just over the heartbeat",
            builder()
                .heartbeat_interval(Duration::from_millis(4_990))
                .waiter_timeout(Duration::from_secs(5))
                .build(),
        ),
        (
            "waiter TTL under twice the heartbeat",
            builder()
                .heartbeat_interval(Duration::from_millis(2_600))
                .waiter_timeout(Duration::from_secs(5))
                .build(),
        ),
        (
            "a lease of days (a unit mistake)",
            builder()
                .watchdog_lease(Duration::from_secs(90_000))
                .build(),
        ),
        (
            "zero replicas",
            builder()
                .replica_acks(0, Duration::from_millis(100))
                .build(),
        ),
        (
            "zero replica timeout",
            builder().replica_acks(1, Duration::ZERO).build(),
        ),
        (
            // WAIT blocks its connection: a release, heartbeat or renewal
            // queued behind it would time out, and a grant that is not
            // acknowledged could not even be given back.
            "a replica timeout of the whole command timeout",
            builder()
                .command_timeout(Duration::from_secs(1))
                .replica_acks(1, Duration::from_secs(3))
                .build(),
        ),
        (
            "a replica timeout longer than the waiter timeout allows",
            builder()
                .waiter_timeout(Duration::from_secs(1))
                .heartbeat_interval(Duration::from_millis(100))
                .replica_acks(1, Duration::from_secs(2))
                .build(),
        ),
    ];
    for (what, result) in refused {
        match result {
            Err(Error::InvalidOptions(message)) => {
                assert!(!message.is_empty(), "{what}");
            }
            other => panic!("{what}: expected InvalidOptions, got {other:?}"),
        }
    }
    assert!(matches!(
        builder().prefix("a{b").build(),
        Err(Error::InvalidName(fairlock::NameError::PrefixHasBraces(_)))
    ));

    // A valid configuration connects, and its values are the ones used.
    let server = server();
    let config = ClientConfig::builder(server.url())
        .prefix("built:")
        .heartbeat_interval(Duration::from_millis(100))
        .waiter_timeout(Duration::from_secs(1))
        .watchdog_lease(Duration::from_secs(3))
        .eviction_check(EvictionCheck::Off)
        .build()
        .expect("valid configuration");
    assert_eq!(config.waiter_timeout, Duration::from_secs(1));
    let client = LockClient::with_config(config).await.expect("connect");
    let guard = client.lock("built").await.expect("lock");
    assert_eq!(
        server
            .cmd(&["EXISTS", "built:{built}:owner"])
            .expect("EXISTS"),
        Resp::Int(1),
        "the built prefix names the keys"
    );
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_with_waits_up_to_its_wait_timeout_in_the_queue() {
    let server = server();
    let clients = clients(&server, 3).await;
    let (holder, trier, waiter) = (&clients[0], &clients[1], &clients[2]);
    let name = "api:try-wait";
    let held = holder.lock(name).await.expect("lock");

    // Without a wait timeout, or with a zero one, try never queues.
    assert!(trier.try_lock(name).await.expect("try").is_none());
    let zero = LockOptions::new().wait_timeout(Duration::ZERO);
    assert!(trier
        .try_lock_with(name, zero)
        .await
        .expect("try")
        .is_none());
    assert_eq!(trier.inspect(name).await.expect("inspect").queue_len, 0);

    // With one, it waits in the queue, and gives up with Ok(None) (not an
    // error), leaving the queue.
    let short = LockOptions::new().wait_timeout(Duration::from_millis(300));
    assert!(trier
        .try_lock_with(name, short)
        .await
        .expect("try")
        .is_none());
    assert_eq!(trier.stats().waiters, 0);
    assert_eq!(trier.inspect(name).await.expect("inspect").queue_len, 0);

    // It waits fairly: behind a waiter already queued, and it gets the
    // lock once that waiter is done.
    let first = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock(name).await.expect("first waiter") })
    };
    wait_for_queue_len(trier, name, 1).await;
    let second = {
        let trier = trier.clone();
        let long = LockOptions::new().wait_timeout(Duration::from_secs(30));
        tokio::spawn(async move { trier.try_lock_with(name, long).await })
    };
    wait_for_queue_len(trier, name, 2).await;
    held.release().await.expect("release");
    // If the try overtook the earlier waiter, that waiter would wait for
    // the try's unreleased guard: bounded, so the test fails, not hangs.
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("FIFO: the earlier waiter is granted first")
        .expect("join");
    let first_token = first.token();
    first.release().await.expect("release");
    let second = second
        .await
        .expect("join")
        .expect("try_lock_with")
        .expect("granted within its wait timeout");
    assert!(
        second.token() > first_token,
        "granted after the earlier waiter"
    );

    // A Lock handle's try_lock honours the handle's wait timeout too.
    let handle = waiter
        .handle(name)
        .expect("handle")
        .with_options(LockOptions::new().wait_timeout(Duration::from_millis(200)));
    assert!(handle.try_lock().await.expect("try").is_none());
    second.release().await.expect("release");
    let again = handle.try_lock().await.expect("try").expect("free now");
    again.release().await.expect("release");
}

/// `shutdown()` ends every task waiting in the client's queues with
/// `Error::Closed`: a waiting `lock()` (no wait timeout) and a waiting
/// semaphore `acquire()`, and their queue entries are gone when it
/// returns, as is that of an acquire dropped just before (a Ctrl-C).
/// Once the heartbeat and the grant connection are stopped nothing else
/// could ever wake them, so before this a service that shut its client
/// down on SIGTERM kept those tasks forever; and the entries stayed queued
/// until the process's liveness ran out, holding up the next waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_the_waiting_tasks_with_closed() {
    let server = server();
    let holder = client(&server).await;
    let doomed = fairlock_tests::client(&server).await;
    let lock = holder.lock("api:shutdown").await.expect("lock");
    let semaphore = holder.semaphore("api:shutdown-sem", 1).expect("semaphore");
    let permit = semaphore.acquire().await.expect("permit");

    let waiting_lock = spawn_lock(&doomed, "api:shutdown");
    let dropped = spawn_lock(&doomed, "api:shutdown");
    let waiting_permit = {
        let semaphore = doomed.semaphore("api:shutdown-sem", 1).expect("semaphore");
        tokio::spawn(async move { semaphore.acquire().await.map(drop) })
    };
    wait_for_queue_len(&doomed, "api:shutdown", 1).await;
    for _ in 0..200 {
        if doomed.stats().waiters == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(doomed.stats().waiters, 3, "the three tasks wait");
    wait_for_queue_len(&doomed, "api:shutdown", 2).await;

    dropped.abort();
    doomed.shutdown().await;
    let queued = holder.inspect("api:shutdown").await.expect("inspect");
    assert_eq!(queued.queue_len, 0, "the lock's queue entries are gone");
    let permit_queue = permit_keys("api:shutdown-sem", fairlock_core::PermitFamily::Semaphore);
    assert_eq!(
        zcard(&server, permit_queue.queue()),
        0,
        "the semaphore's queue entry is gone"
    );
    let lock_result = within("the waiting lock() after shutdown", waiting_lock)
        .await
        .expect("task");
    assert!(
        matches!(lock_result, Err(Error::Closed)),
        "{:?}",
        lock_result.map(|g| g.token())
    );
    let permit_result = within("the waiting acquire() after shutdown", waiting_permit)
        .await
        .expect("task");
    assert!(
        matches!(permit_result, Err(Error::Closed)),
        "{permit_result:?}"
    );

    // The holder's side goes on: its locks release and the next waiter
    // (none alive here) is skipped once the dead process's deadline passes.
    lock.release().await.expect("release");
    permit.release().await.expect("release permit");
}

/// A grant that reaches a waiting task just before `shutdown()` (here the
/// release that wakes it runs in the same process, and the task has not
/// run yet when the client closes) does not become a guard of a closed
/// client, whose lock nobody could release or renew: the task ends with
/// `Error::Closed` and the lock goes on. Before, the task got `Ok` and the
/// lock stayed held for its whole 30 s lease.
#[tokio::test]
async fn a_grant_that_races_shutdown_is_passed_on() {
    let server = server();
    let client = client(&server).await;
    let mut config = fast_config(&server);
    config.watchdog_lease = std::time::Duration::from_secs(30);
    let doomed = fairlock::LockClient::with_config(config)
        .await
        .expect("client");
    let holder = doomed.lock("api:race").await.expect("lock");
    // The waiter task runs only while this task drives its LocalSet: the
    // release's reply hands it the grant (the release then yields, but not
    // to the LocalSet), and `shutdown()` closes the client before its
    // first wait, in which the task runs.
    let waiters = tokio::task::LocalSet::new();
    let waiter = {
        let doomed = doomed.clone();
        waiters.spawn_local(async move { doomed.lock("api:race").await })
    };
    waiters
        .run_until(wait_for_queue_len(&client, "api:race", 1))
        .await;
    holder.release().await.expect("release");
    waiters.run_until(doomed.shutdown()).await;
    let outcome = waiters
        .run_until(within("the raced waiter", waiter))
        .await
        .expect("task");
    assert!(
        matches!(outcome, Err(Error::Closed)),
        "{:?}",
        outcome.map(|guard| guard.token())
    );
    let next = within("the lock after the shutdown", client.lock("api:race"))
        .await
        .expect("lock");
    next.release().await.expect("release");
}

/// A guard dropped just before `shutdown()` is still released: its
/// release (a task of its own) is waited for, and not refused because
/// the client closed meanwhile. Before, on a one-thread runtime the
/// release task first ran after the close, failed with `Closed`, and the
/// lock stayed held for its whole lease with no watchdog left.
#[tokio::test]
async fn a_guard_dropped_before_shutdown_is_released() {
    let server = server();
    let mut config = fast_config(&server);
    config.watchdog_lease = std::time::Duration::from_secs(30);
    let doomed = fairlock::LockClient::with_config(config)
        .await
        .expect("client");
    let lock = doomed.lock("api:dropped").await.expect("lock");
    let permit = doomed
        .semaphore("api:dropped-permits", 2)
        .expect("semaphore")
        .acquire()
        .await
        .expect("permit");
    let kept = doomed.lock("api:kept").await.expect("lock");
    drop(lock);
    drop(permit);
    doomed.shutdown().await;
    // A guard released once the client is shut down: refused at once.
    let late = within("a release after shutdown", kept.release()).await;
    assert!(matches!(late, Err(Error::Closed)), "{late:?}");
    assert_eq!(
        owner_in_redis(&server, "api:dropped"),
        None,
        "the dropped guard's lock was released"
    );
    let holders = permit_keys(
        "api:dropped-permits",
        fairlock_core::PermitFamily::Semaphore,
    );
    assert_eq!(
        zcard(&server, holders.owner()),
        0,
        "the dropped permit was released"
    );
}

/// A grant waiting for its replicas' acknowledgement (`WAIT`) when the
/// client shuts down is given back before the connections close: the
/// next holder need not wait out its lease. Before, the shutdown quit the
/// connections under the `WAIT`, and the give-back after it was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_awaiting_acknowledgement_at_shutdown_is_given_back() {
    let server = server();
    let mut config = fast_config(&server);
    config.watchdog_lease = std::time::Duration::from_secs(30);
    config.waiter_timeout = std::time::Duration::from_secs(5);
    // No replica exists: every WAIT runs its whole second.
    config.replica_acks = Some(fairlock::ReplicaAcks::new(
        1,
        std::time::Duration::from_secs(1),
    ));
    let doomed = fairlock::LockClient::with_config(config)
        .await
        .expect("client");
    let acquire = spawn_lock(&doomed, "api:unacked");
    // Granted in Redis, and the acquire is in its WAIT.
    within("the grant", async {
        while server
            .cmd(&["GET", keys("api:unacked").owner()])
            .expect("GET owner")
            .as_str()
            .is_none()
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    doomed.shutdown().await;
    let owner = server
        .cmd(&["GET", keys("api:unacked").owner()])
        .expect("GET owner");
    assert_eq!(
        owner.as_str(),
        None,
        "the unacknowledged grant was given back"
    );
    let ended = within("the acquire", acquire).await.expect("task");
    assert!(ended.is_err(), "{:?}", ended.map(|guard| guard.token()));
}

/// A guard dropped together with its client (the end of a task's scope:
/// the guard drops first, then the last handle) is still released: the
/// connections close only after the release. Once, the closing task
/// could run first and the release was refused, leaving the lock held for
/// its whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_with_its_client_is_released() {
    const SCOPES: usize = 20;
    let server = server();
    let mut config = fast_config(&server);
    config.watchdog_lease = std::time::Duration::from_secs(60);
    for scope in 0..SCOPES {
        let config = config.clone();
        tokio::spawn(async move {
            let client = fairlock::LockClient::with_config(config)
                .await
                .expect("client");
            let _guard = client
                .lock(format!("api:scope-{scope}"))
                .await
                .expect("lock");
        })
        .await
        .expect("scope");
    }
    for scope in 0..SCOPES {
        wait_for_owner(&server, &format!("api:scope-{scope}"), false).await;
    }
}

/// `stats()` tells a task that waits for its first answer from one that
/// has a place in the queue: while Redis holds the acquire (`CLIENT
/// PAUSE`) the task counts as waiting but not queued, once answered as
/// both, and as neither once granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_tell_waiting_from_queued() {
    let server = server();
    let holder = client(&server).await;
    let waiter = client(&server).await;
    let name = "api:stats";
    let guard = holder.lock(name).await.expect("lock");
    // Scripts loaded on the waiter's connections before Redis is paused.
    assert!(waiter.try_lock(name).await.expect("try").is_none());
    // Paused until the check below is done (ended by hand), however slow
    // the machine, within the command timeout.
    server
        .cmd_ok(&["CLIENT", "PAUSE", "30000", "WRITE"])
        .expect("pause");
    let task = spawn_lock(&waiter, name);
    for _ in 0..500 {
        if waiter.stats().waiters == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held_up = waiter.stats();
    server.cmd_ok(&["CLIENT", "UNPAUSE"]).expect("unpause");
    assert_eq!(
        (held_up.waiters, held_up.queued),
        (1, 0),
        "while its acquire is held in Redis"
    );
    for _ in 0..400 {
        if waiter.stats().queued == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answered = waiter.stats();
    assert_eq!((answered.waiters, answered.queued), (1, 1), "once queued");
    guard.release().await.expect("release");
    let granted = task.await.expect("task").expect("granted");
    let done = waiter.stats();
    assert_eq!((done.waiters, done.queued, done.held), (0, 0, 1));
    granted.release().await.expect("release");
}
