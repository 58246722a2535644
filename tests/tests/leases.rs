//! Lease safety: watchdog, lease-lost signal, extend, release_all,
//! force_release, fencing tokens and the fenced-write helper.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fairlock::{Error, FencedOp, FencedScript, LockClient, LockOptions, Reply};
use fairlock_tests::*;

const LONG: Duration = Duration::from_secs(20);

async fn evalsha_during(server: &RedisServer, window: Duration) -> u64 {
    server.cmd(&["CONFIG", "RESETSTAT"]).expect("reset");
    tokio::time::sleep(window).await;
    calls(server, "evalsha")
}

/// The watchdog renews a held lock past its lease and stops exactly when
/// the guard is released or dropped: no renewal work remains afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_renews_until_release_and_then_stops() {
    let server = server();
    let client = client(&server).await; // watchdog lease 3 s, renewed every 1 s
    let guard = client.lock("watched").await.expect("lock");
    assert_eq!(client.stats().watched_leases, 1);
    let renewals = evalsha_during(&server, Duration::from_millis(3_500)).await;
    assert!(renewals >= 3, "{renewals} renewals in 3.5 s");
    assert!(
        guard.is_held().await.expect("is_held"),
        "held past its 3 s lease"
    );
    assert!(!guard.is_lost());
    guard.release().await.expect("release");
    assert_eq!(client.stats().watched_leases, 0);
    assert_eq!(
        evalsha_during(&server, Duration::from_millis(2_500)).await,
        0,
        "work after release"
    );

    let dropped = client.lock("watched").await.expect("lock again");
    assert_eq!(client.stats().watched_leases, 1);
    drop(dropped);
    // The release runs in the background; the client forgets the hold
    // once its reply is in, which may come after another call's reply.
    for _ in 0..1000 {
        let stats = client.stats();
        if client
            .inspect("watched")
            .await
            .expect("inspect")
            .owner
            .is_none()
            && stats.held == 0
            && stats.watched_leases == 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(client.stats().watched_leases, 0);
    assert_eq!(client.stats().held, 0);
    assert_eq!(
        evalsha_during(&server, Duration::from_millis(2_500)).await,
        0,
        "work after drop"
    );
}

/// When a renewal finds the lock taken, the lost signal fires; the
/// critical section selecting on it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_fires_when_the_lock_is_taken_away() {
    let server = server();
    let client = client(&server).await;
    let admin = fairlock_tests::client(&server).await;
    let guard = client.lock("taken").await.expect("lock");
    let waiter = {
        let admin = admin.clone();
        tokio::spawn(async move {
            admin
                .lock_with("taken", LockOptions::new().wait_timeout(LONG))
                .await
                .map(|g| g.token())
        })
    };
    while client.inspect("taken").await.expect("inspect").queue_len == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        admin.force_release("taken").await.expect("force"),
        "it was held"
    );
    let next = waiter
        .await
        .expect("task")
        .expect("force_release grants the next waiter");
    assert!(next > guard.token());

    let work = async {
        tokio::time::sleep(LONG).await;
        "finished"
    };
    let outcome = tokio::select! {
        done = work => done,
        _ = guard.lost() => "aborted",
    };
    assert_eq!(outcome, "aborted");
    assert!(guard.is_lost());
    assert!(!guard.is_held().await.expect("is_held"));
    assert_eq!(client.stats().watched_leases, 0, "the watchdog let go");
    assert!(matches!(
        guard.extend(Duration::from_secs(5)).await,
        Err(Error::NotOwner { .. })
    ));
    assert!(matches!(guard.release().await, Err(Error::NotOwner { .. })));
}

/// A fixed lease is not renewed: its lost signal fires when it runs out,
/// unless `extend` moved it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_leases_expire_unless_extended() {
    let server = server();
    let client = client(&server).await;
    let short = client
        .lock_with(
            "fixed",
            LockOptions::new().lease(Duration::from_millis(300)),
        )
        .await
        .expect("lock");
    assert_eq!(
        client.stats().watched_leases,
        0,
        "no watchdog for a fixed lease"
    );
    tokio::time::timeout(LONG, short.lost())
        .await
        .expect("lost fires at expiry");
    // The local deadline is conservative (counted from before the call was
    // sent), so Redis may hold the key a few ms longer; it must then expire.
    let mut held = true;
    for _ in 0..100 {
        held = short.is_held().await.expect("is_held");
        if !held {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!held, "the fixed lease expired in Redis too");

    let extended = client
        .lock_with(
            "fixed",
            LockOptions::new().lease(Duration::from_millis(1_500)),
        )
        .await
        .expect("lock");
    extended
        .extend(Duration::from_secs(30))
        .await
        .expect("extend");
    // Past the first lease.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(!extended.is_lost());
    assert!(extended.is_held().await.expect("is_held"));
    let state = client.inspect("fixed").await.expect("inspect");
    assert!(state.owner_pttl_ms > 20_000, "{state:?}");
    extended.release().await.expect("release");
}

/// A release that comes after its fixed lease ran out is refused, and the
/// lock, free by then, goes to the next waiter in that same call rather
/// than staying free until a heartbeat finds it (heartbeats here are 10 s
/// apart, so only the release can have made the waiter the owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_lease_ran_out_still_hands_the_lock_on() {
    let server = server();
    let mut config = fast_config(&server);
    config.heartbeat_interval = Duration::from_secs(10);
    config.waiter_timeout = Duration::from_secs(30);
    let holder = LockClient::with_config(config.clone())
        .await
        .expect("client");
    let other = LockClient::with_config(config).await.expect("client");
    let late = holder
        .lock_with("late", LockOptions::new().lease(Duration::from_secs(1)))
        .await
        .expect("lock");
    let waiting = tokio::spawn({
        let other = other.clone();
        async move { other.lock("late").await }
    });
    wait_for_queue_len(&holder, "late", 1).await;
    wait_for_owner(&server, "late", false).await;

    assert!(matches!(late.release().await, Err(Error::NotOwner { .. })));
    let owner = owner_in_redis(&server, "late");
    assert!(
        owner.is_some(),
        "the refused release left the free lock to the next heartbeat"
    );
    let guard = granted(waiting, "the waiter behind the expired holder").await;
    assert_eq!(
        owner.as_deref().and_then(|o| o.split(' ').next()),
        Some(guard.owner_id())
    );
    guard.release().await.expect("release");
}

/// release_all frees every lock the client holds and hands each on; the
/// guards become inert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_all_frees_everything_and_hands_on() {
    let server = server();
    let client = client(&server).await;
    let other = fairlock_tests::client(&server).await;
    let a = client.lock("all:a").await.expect("a");
    let b = client
        .lock_with("all:b", LockOptions::new().lease(Duration::from_secs(60)))
        .await
        .expect("b");
    let c = client.lock("all:c").await.expect("c");
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move {
            other
                .lock_with("all:b", LockOptions::new().wait_timeout(LONG))
                .await
                .map(|g| g.token())
        })
    };
    while client.inspect("all:b").await.expect("inspect").queue_len == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(client.release_all().await.expect("release_all"), 3);
    assert!(waiter.await.expect("task").expect("handed on") > b.token());
    assert_eq!(client.stats().held, 0);
    assert_eq!(client.stats().watched_leases, 0);
    for name in ["all:a", "all:c"] {
        assert!(
            client.inspect(name).await.expect("inspect").owner.is_none(),
            "{name}"
        );
    }
    // The guards are inert: releasing them changes nothing and succeeds.
    a.release().await.expect("inert release");
    drop(c);
    drop(b);
    assert_eq!(client.stats().held, 0);
}

/// After `release_all` a guard no longer protects anything: its lost
/// signal fires and `is_lost` says so (the signal once never resolved: the
/// released grant's past deadline woke it again and again, a thread spun),
/// and a `with_lock` body under it is stopped with `LeaseLost` rather
/// than finishing under a lock handed to the next holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_all_stops_what_its_guards_protected() {
    let server = server();
    let client = client(&server).await;
    let fixed = client
        .lock_with(
            "inert:fixed",
            LockOptions::new().lease(Duration::from_millis(300)),
        )
        .await
        .expect("fixed");
    let watched = client.lock("inert:watched").await.expect("watched");
    let scoped = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .with_lock("inert:scoped", LockOptions::new(), |_held| async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                })
                .await
        })
    };
    while client.stats().held < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(client.release_all().await.expect("release_all"), 3);
    within("the fixed guard's lost signal", fixed.lost()).await;
    within("the watched guard's lost signal", watched.lost()).await;
    assert!(fixed.is_lost() && watched.is_lost());
    let stopped = within("the scoped body", scoped).await.expect("task");
    assert!(
        matches!(stopped, Err(Error::LeaseLost { .. })),
        "{stopped:?}"
    );
    // Still inert: releasing changes nothing and succeeds.
    fixed.release().await.expect("inert release");
    watched.release().await.expect("inert release");
}

/// The fencing scenario: a holder paused past its fixed lease (no
/// watchdog) writes after a newer holder did; its write is refused and
/// the resource keeps the newer value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_stale_write_is_rejected() {
    let server = server();
    let paused_client = client(&server).await;
    let client = fairlock_tests::client(&server).await;
    let fence = "{stock:1}:fence";
    let value = "{stock:1}:value";
    let counter = "{stock:1}:count";
    let hash = "{stock:1}:order";

    let paused = paused_client
        .lock_with(
            "stock:1",
            LockOptions::new().lease(Duration::from_millis(300)),
        )
        .await
        .expect("first holder");
    paused_client
        .fenced_write(fence, value, paused.token(), FencedOp::set("first"))
        .await
        .expect("a fresh token writes");
    tokio::time::sleep(Duration::from_millis(600)).await; // the "GC pause"

    let newer = client
        .lock("stock:1")
        .await
        .expect("the lease ran out, a newer holder gets it");
    assert!(newer.token() > paused.token());
    client
        .fenced_write(fence, value, newer.token(), FencedOp::set("second"))
        .await
        .expect("newer write");
    client
        .fenced_write(fence, counter, newer.token(), FencedOp::IncrBy(5))
        .await
        .expect("newer incr");

    for op in [
        FencedOp::Get,
        FencedOp::hget("f"),
        FencedOp::set("stale"),
        FencedOp::IncrBy(100),
        FencedOp::hset("f", "stale"),
    ] {
        let target = match op {
            FencedOp::Set(_) | FencedOp::Get => value,
            FencedOp::IncrBy(_) => counter,
            FencedOp::HSet(..) | FencedOp::HGet(_) => hash,
        };
        let refused = paused_client
            .fenced_write(fence, target, paused.token(), op)
            .await;
        match refused {
            Err(Error::StaleToken { token, newest }) => {
                assert_eq!(token, paused.token().value());
                assert_eq!(newest, newer.token().value());
            }
            other => panic!("stale write not refused: {other:?}"),
        }
    }
    let script = FencedScript::new("return redis.call('SET', KEYS[1], ARGV[1])");
    let refused = paused_client
        .fenced_eval(&script, fence, &[value], paused.token(), &["stale-script"])
        .await;
    assert!(
        matches!(refused, Err(Error::StaleToken { .. })),
        "{refused:?}"
    );

    assert_eq!(
        server.cmd(&["GET", value]).expect("GET").as_str(),
        Some("second")
    );
    assert_eq!(
        server.cmd(&["GET", counter]).expect("GET").as_str(),
        Some("5")
    );
    assert_eq!(
        server.cmd(&["EXISTS", hash]).expect("EXISTS").as_int(),
        Some(0)
    );

    let read = client
        .fenced_write(fence, value, newer.token(), FencedOp::Get)
        .await
        .expect("the current holder reads");
    assert_eq!(read, Reply::Str("second".into()));

    // The current holder's user script runs, seeing its own KEYS and ARGV.
    let applied = client
        .fenced_eval(&script, fence, &[value], newer.token(), &["third"])
        .await
        .expect("fresh script");
    assert_eq!(applied, Reply::Str("OK".into()));
    assert_eq!(
        server.cmd(&["GET", value]).expect("GET").as_str(),
        Some("third")
    );
    assert!(matches!(
        paused.release().await,
        Err(Error::NotOwner { .. })
    ));
    newer.release().await.expect("release");
}

/// A fenced write to a key of the wrong type is a typed error and changes
/// nothing, fence included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_write_refuses_wrong_types_untouched() {
    let server = server();
    let client: LockClient = client(&server).await;
    server.cmd(&["HSET", "{r}:target", "a", "1"]).expect("hset");
    let before = dump(&server);
    let result = client
        .fenced_write(
            "{r}:fence",
            "{r}:target",
            fairlock::FencingToken::new(7, "0123456789abcdef0123456789abcdef").expect("token"),
            FencedOp::IncrBy(1),
        )
        .await;
    assert!(matches!(result, Err(Error::WrongType(_))), "{result:?}");
    assert_eq!(dump(&server), before);
}

/// A force-released holder's own release is refused, typed: the admin's
/// eviction is not mistaken for a resend of the holder's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_force_release_is_refused() {
    let server = server();
    let client = client(&server).await;
    let guard = client.lock("evicted").await.expect("lock");
    assert!(client.force_release("evicted").await.expect("force"));
    let refused = guard.release().await;
    assert!(
        matches!(refused, Err(Error::NotOwner { .. })),
        "{refused:?}"
    );
}

/// A fixed lease handed on after a long wait starts at the grant, not at
/// the call that queued: the new holder is not told it lost the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_on_fixed_lease_is_not_reported_lost() {
    let server = server();
    let client = client(&server).await;
    let holder = client.lock("handed").await.expect("holder");
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock_with("handed", LockOptions::new().lease(Duration::from_secs(2)))
                .await
        })
    };
    wait_for_queue_len(&client, "handed", 1).await;
    // Waits longer than the lease (2 s, room for a loaded machine to
    // release within it once granted).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    holder.release().await.expect("release");
    let guard = waiter.await.expect("task").expect("granted");
    assert!(!guard.is_lost(), "a fresh grant is not lost");
    guard.release().await.expect("released within its lease");
}

/// `extend` on a watchdog-kept lock sets the lease the watchdog then keeps:
/// a shorter one is renewed before it runs out (at a third of it, like any
/// watchdog lease) and a longer one is not cut back to the watchdog lease.
/// Before, the watchdog renewed at a third of the configured lease
/// whatever `extend` had set, so a short extend let the key expire (another
/// client took the lock while the guard still held it) and a long one was
/// shortened at the next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_sets_the_lease_the_watchdog_keeps() {
    let server = server();
    let rival = fairlock_tests::client(&server).await;

    // Watchdog lease 30 s (renewed after 10 s), 100 ms rounds; a 3 s
    // extend is renewed after 1 s, with 2 s to spare for a loaded machine.
    let config = fairlock::ClientConfig::builder(server.url())
        .heartbeat_interval(Duration::from_millis(100))
        .waiter_timeout(Duration::from_secs(1))
        .watchdog_lease(Duration::from_secs(30))
        .build()
        .expect("config");
    let slow_watchdog = LockClient::with_config(config).await.expect("connect");
    let short = slow_watchdog.lock("extend-short").await.expect("lock");
    short.extend(Duration::from_secs(3)).await.expect("extend");
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    assert!(!short.is_lost(), "the short extend was renewed");
    assert!(
        rival.try_lock("extend-short").await.expect("try").is_none(),
        "nobody else got the lock"
    );

    // Watchdog lease 3 s: a renewal is due after 1 s.
    let client = client(&server).await;
    let long = client.lock("extend-long").await.expect("lock");
    long.extend(Duration::from_secs(60)).await.expect("extend");
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let ttl = server
        .cmd_ok(&["PTTL", keys("extend-long").owner()])
        .expect("PTTL")
        .as_int()
        .expect("int");
    assert!(ttl > 3_000, "the 60 s lease was kept, PTTL {ttl} ms");
    short.release().await.expect("release");
    long.release().await.expect("release");
}

/// `extend_by_owner_id` on a holder of this very process moves that
/// holder's own lease clock too: before, Redis had the longer lease but the
/// guard's lost signal still fired at the old local deadline (a `with_lock`
/// body would have been stopped while its lock was held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_by_owner_id_moves_a_local_holders_deadline() {
    let server = server();
    let client = client(&server).await;
    let guard = client
        .lock_with(
            "by-id",
            LockOptions::new().lease(Duration::from_millis(1_000)),
        )
        .await
        .expect("lock");
    client
        .extend_by_owner_id("by-id", guard.owner_id(), Duration::from_secs(30))
        .await
        .expect("extend by owner id");
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(
        guard.is_held().await.expect("is_held"),
        "Redis has the lease"
    );
    assert!(!guard.is_lost(), "the guard counts the extended lease");
    guard.release().await.expect("release");
}

/// An `extend` that fails without an answer (here: Redis paused past the
/// command timeout, so the call times out and may still run once the pause
/// ends) may have set its shorter lease: the guard's lost signal fires by
/// that lease's end, not at the longer lease it had. Before, a failed
/// extend left the local deadline where it was, and a holder whose extend
/// to 2 s ran after its timeout counted on its 60 s lease while Redis let
/// the lock go after 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_that_timed_out_may_have_shortened_the_lease() {
    let server = server();
    let mut config = fast_config(&server);
    config.command_timeout = Duration::from_millis(500);
    let client = LockClient::with_config(config).await.expect("connect");
    let guard = client
        .lock_with(
            "extend-timed-out",
            LockOptions::new().lease(Duration::from_secs(60)),
        )
        .await
        .expect("lock");
    server
        .cmd_ok(&["CLIENT", "PAUSE", "1500"])
        .expect("pause Redis");
    let extended = guard.extend(Duration::from_secs(2)).await;
    assert!(
        matches!(extended, Err(Error::Timeout { .. })),
        "the extend was answered: {extended:?}"
    );
    within("the lost signal of the shorter lease", guard.lost()).await;
    assert!(guard.is_lost());
    drop(guard);
}

/// A forced release that reaches a process before its waiting task has
/// taken the grant it revokes (both messages sit in the socket while the
/// process is busy: here its one runtime thread is blocked) still fires the
/// lost signal: the task's guard comes back lost. Before, the revocation
/// found no held lock and was dropped, and the task held a lock that an
/// administrator had given away (two holders until the next watchdog check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_before_the_grant_is_taken_marks_the_guard_lost() {
    let server = server();
    let holder_client = client(&server).await;
    let holder = holder_client.lock("revoked-early").await.expect("holder");
    // The waiter's process sends no heartbeat while blocked: a waiter
    // timeout well above the few calls the test makes meanwhile.
    let mut config = fast_config(&server);
    config.waiter_timeout = Duration::from_secs(10);
    let waiter = StalledWaiter::queue(config, "revoked-early", LockOptions::new());
    holder.release().await.expect("release");
    assert!(
        holder_client
            .force_release("revoked-early")
            .await
            .expect("force release"),
        "the waiter was granted, then evicted"
    );
    // Both messages in the blocked process's socket before it reads:
    // Redis has written out what the forced release published, and the
    // subscriber's kernel has acknowledged it (once, in CI, the revocation
    // came after the task had taken the grant, where the held lock's own
    // check handles it; a PING and a 300 ms pause stood for this before).
    wait_for_subscribers_to_have_everything(&server).await;
    let (lost, _) = waiter.take_grant().await;
    assert!(
        lost,
        "the guard of a force-released grant is not marked lost"
    );
}

/// A forced release names the grant it revoked (its token): a revocation
/// of an earlier grant of an owner id (one that queued again since, under
/// the same id) does not mark that owner id's next, valid grant lost.
/// Here the stale revocation is published by hand, before the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_of_an_earlier_grant_does_not_mark_the_next_lost() {
    let server = server();
    let holder_client = client(&server).await;
    let waiter_client = client(&server).await;
    let holder = holder_client.lock("revoked-stale").await.expect("holder");
    let waiter = spawn_lock(&waiter_client, "revoked-stale");
    wait_for_queue_len(&holder_client, "revoked-stale", 1).await;
    let lock_keys = keys("revoked-stale");
    let queued = server
        .cmd_ok(&["ZRANGE", lock_keys.queue(), "0", "0"])
        .expect("ZRANGE");
    let owner_id = queued
        .as_array()
        .and_then(|ids| ids.first())
        .and_then(|id| id.as_str())
        .expect("the waiter's owner id")
        .to_owned();
    let tag = fairlock_core::OwnerId::tag_of(&owner_id).expect("a tag");
    let stale = format!("{owner_id} revoked:1 {}", lock_keys.owner());
    server
        .cmd_ok(&["PUBLISH", &format!("fairlock:notify:{tag}"), &stale])
        .expect("PUBLISH");
    // The stale revocation is read before the grant's message.
    tokio::time::sleep(Duration::from_millis(100)).await;
    holder.release().await.expect("release");
    let guard = granted(waiter, "the waiter").await;
    assert!(
        !guard.is_lost(),
        "a stale revocation marked a valid grant lost"
    );
    assert_eq!(
        waiter_client.stats().held,
        1,
        "the grant is tracked (renewed, released by release_all)"
    );
    guard.release().await.expect("release");
}

/// A grant message on a process's channel that names another process's
/// owner id (only a program publishing by hand sends one: every grant
/// fairlock sends goes to the owner id's own process) is ignored. Before,
/// the process found no waiter for it and handed the grant back: it ran
/// the release for that owner id, freeing the other process's lock while
/// its holder still held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_message_naming_another_process_is_ignored() {
    let server = server();
    // Grants reach the bystander by pub/sub only (its heartbeat runs once
    // a minute): one it gets came on its channel, in publishing order.
    let bystander = pubsub_only_client(&server.url()).await;
    let holder_client = client(&server).await;
    let mine = bystander.lock("bystander-own").await.expect("lock");
    let tag = fairlock_core::OwnerId::tag_of(mine.owner_id())
        .expect("a tag")
        .to_owned();
    mine.release().await.expect("release");
    let holder = holder_client.lock("not-yours").await.expect("holder");
    // A lock the bystander waits for: its grant, published after the
    // foreign message on the same channel, shows that message was read.
    let gate = holder_client.lock("after").await.expect("gate");
    let follower = spawn_lock(&bystander, "after");
    wait_for_queue_len(&holder_client, "after", 1).await;
    let lock_keys = keys("not-yours");
    let foreign = format!(
        "{} {} {}",
        holder.owner_id(),
        holder.token().value(),
        lock_keys.owner()
    );
    server
        .cmd_ok(&["PUBLISH", &format!("fairlock:notify:{tag}"), &foreign])
        .expect("PUBLISH");
    // The foreign message has been acted on (or not) once the grant sent
    // after it is taken (before, a 300 ms sleep stood for this), and a
    // release handed back for it would have been sent before the
    // follower's own release.
    gate.release().await.expect("release");
    let followed = granted(follower, "the bystander's waiter").await;
    followed.release().await.expect("release");
    assert!(
        bystander
            .try_lock("not-yours")
            .await
            .expect("try_lock")
            .is_none(),
        "the lock is still held by its holder (lost: {})",
        holder.is_lost()
    );
    holder.release().await.expect("the holder still owns it");
}

/// A grant handed over from the queue to a process that then stalls (a
/// blocked runtime) for longer than the fixed lease the waiter asked for:
/// Redis ends that lease while the grant waits in the socket, unread. The
/// process must not take it for a whole lease from when the stalled task
/// took it: the server times in its ticket and token put the grant's
/// start long before, so it asks Redis, finds the grant gone and queues
/// again, and the guard it returns is a newer grant, not lost. Before a
/// fix of 2026-11-26 `is_lost()` answered false, with the key long gone
/// from Redis, until the watchdog's next check; from then until
/// 2026-11-28 the guard came back lost at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_taken_after_its_lease_ran_out_in_redis_is_asked_for_again() {
    const LEASE: Duration = Duration::from_millis(300);
    let server = server();
    let owner_key = keys("stalled-taker").owner().to_owned();
    let holder_client = client(&server).await;
    let holder = holder_client.lock("stalled-taker").await.expect("holder");
    // No heartbeat or watchdog check while the test runs: it would find
    // the grant gone and queue again, which is right but not this case.
    let mut config = fast_config(&server);
    config.heartbeat_interval = Duration::from_secs(30);
    config.waiter_timeout = Duration::from_secs(60);
    let waiter = StalledWaiter::queue(config, "stalled-taker", LockOptions::new().lease(LEASE));
    holder.release().await.expect("release");
    // The handoff made the waiter the owner with its 300 ms lease; wait
    // until Redis has ended it.
    let handed_on = server.cmd(&["GET", &owner_key]).expect("GET");
    assert!(
        handed_on.as_str().is_some(),
        "the release handed the lock to the waiter"
    );
    while server
        .cmd(&["EXISTS", &owner_key])
        .expect("EXISTS")
        .as_int()
        != Some(0)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let handed_on_token: u64 = handed_on
        .as_str()
        .and_then(|value| value.rsplit(' ').next())
        .and_then(|token| token.parse().ok())
        .expect("the owner value ends with the token");
    let (lost, token) = waiter.take_grant().await;
    assert!(
        !lost && token > handed_on_token,
        "a guard whose grant Redis ended before the process took it: lost {lost}, \
         token {token} (the ended grant's {handed_on_token})"
    );
}

/// While a lock's counter runs ahead of the server clock (after a
/// fail-over to a server whose clock is behind, or a clock stepped back),
/// the scripts draw each ticket and token as the last one plus one, so
/// `token - ticket` no longer measures the time from the enqueue to the
/// handoff. A waiter that waited longer than its lease then took its
/// fresh grant for one long over: `is_lost()` at once, though Redis had
/// given it a whole lease. Now such an estimate is checked in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_while_the_counter_runs_ahead_of_the_clock_is_not_lost() {
    let server = server();
    let client = client(&server).await;
    let lock_keys = keys("ahead");
    let holder = client.lock("ahead").await.expect("holder");
    let time = server.cmd_ok(&["TIME"]).expect("TIME");
    let parts: Vec<u64> = time
        .as_array()
        .expect("TIME answers two numbers")
        .iter()
        .map(|part| {
            part.as_str()
                .and_then(|p| p.parse().ok())
                .expect("a number")
        })
        .collect();
    let ahead = parts[0] * 1_000_000 + parts[1] + 600_000_000;
    server
        .cmd_ok(&["SET", lock_keys.seq(), &ahead.to_string(), "PX", "600000"])
        .expect("SET");
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock_with("ahead", LockOptions::new().lease(Duration::from_secs(1)))
                .await
        })
    };
    wait_for_queue_len(&client, "ahead", 1).await;
    // Longer than the waiter's lease.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    holder.release().await.expect("release");
    let guard = within("the handoff", waiter)
        .await
        .expect("task")
        .expect("granted");
    assert!(
        guard.token().value() > ahead,
        "the token was drawn from the counter"
    );
    assert!(!guard.is_lost(), "a fresh grant is not lost");
    guard.release().await.expect("the waiter still owns it");
}

/// A waiter in a process of its own (a current-thread runtime on a plain
/// thread) that queues for a lock and then blocks its only thread: what
/// Redis sends it meanwhile (a grant, a revocation) waits in its sockets,
/// unread, and no heartbeat or watchdog check runs.
struct StalledWaiter {
    unblock: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<(bool, u64)>,
}

impl StalledWaiter {
    /// Starts the waiter and returns once it is queued and blocked.
    fn queue(config: fairlock::ClientConfig, name: &'static str, options: LockOptions) -> Self {
        let (queued_tx, queued_rx) = std::sync::mpsc::channel::<()>();
        let (unblock, unblock_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let client = LockClient::with_config(config).await.expect("client");
                let task = {
                    let client = client.clone();
                    tokio::spawn(async move { client.lock_with(name, options).await })
                };
                while client.inspect(name).await.expect("inspect").queue_len < 1 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let _ = queued_tx.send(());
                // Blocks the runtime's only thread.
                let _ = unblock_rx.recv();
                let guard = task.await.expect("task").expect("granted");
                let taken = (guard.is_lost(), guard.token().value());
                drop(guard);
                client.shutdown().await;
                taken
            })
        });
        queued_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the waiter queued");
        Self { unblock, thread }
    }

    /// Unblocks the waiter: its task takes the grant, and the answer is
    /// whether that guard is lost the moment it is taken, and its token.
    async fn take_grant(self) -> (bool, u64) {
        self.unblock.send(()).expect("unblock");
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join().expect("waiter thread"))
            .await
            .expect("join")
    }
}

/// When renewals fail while Redis still keeps the key (every connection of
/// the holder's process cut, and its address now leading nowhere), the
/// lost signal fires once the lease has run out by the local clock, with
/// no answer from Redis to tell it so, and has fired by the time another
/// process can take the lock. The key's TTL in Redis is watched as it runs
/// down: it never rises, so no renewal got through. The local lease counts
/// from when a renewal was sent, and Redis expires a key only after its
/// full lease from when the renewal ran, so the signal cannot come late.
/// (Without a local deadline the holder would learn nothing until Redis
/// answered again: `lost()` would wait for ever and `is_lost()` stay
/// false while the other process holds the lock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_renewals_fire_the_lost_signal_when_the_lease_runs_out() {
    let server = server();
    let (proxy, holder_client) = client_behind_proxy(&server, |config| {
        config.command_timeout = Duration::from_millis(500);
    })
    .await;
    let other = client(&server).await;
    let name = "renewals-fail";
    let lock_keys = keys(name);
    let owner_key = lock_keys.owner();
    let guard = holder_client.lock(name).await.expect("lock");
    // Let one renewal through first: the lease the signal counts from is
    // then a renewed one, not the grant's.
    a_renewal_runs(&server, owner_key).await;

    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    proxy.switch_to(nowhere);
    proxy.cut();
    assert!(
        owner_in_redis(&server, name).is_some(),
        "Redis keeps the key"
    );
    assert!(!guard.is_lost(), "lost before its lease ran out");
    let lost = AtomicBool::new(false);
    let signal = async {
        guard.lost().await;
        lost.store(true, Ordering::SeqCst);
    };
    let watch = async {
        let mut last = pttl(&server, owner_key);
        loop {
            let now = pttl(&server, owner_key);
            assert!(
                now <= last,
                "the TTL rose from {last} to {now} ms: a renewal got through"
            );
            if now < 0 {
                break;
            }
            last = now;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let taken = other.try_lock(name).await.expect("try_lock");
        assert!(taken.is_some(), "the lock is free once its lease ran out");
        taken
    };
    let (_, taken) = within("the lease to run out", async {
        tokio::join!(signal, watch)
    })
    .await;
    assert!(lost.load(Ordering::SeqCst), "the lost signal fired");
    assert!(guard.is_lost());
    if let Some(taken) = taken {
        taken.release().await.expect("release");
    }
    let released = within("the lost guard's release", guard.release()).await;
    assert!(released.is_err(), "a lost guard released: {released:?}");
}

/// A guard the watchdog let run out by the local clock (each renewal's
/// reply slower than half the lease, so the next reply comes after the
/// lease counted from the previous renewal's send) is lost, and the
/// watchdog stops renewing it: Redis lets the lock go once the last
/// renewal's lease ends, though the guard is still alive. Before, the
/// replies that did come said "held" and the watchdog kept renewing the
/// lock for as long as the guard lived, its holder told to stop while
/// every other process stayed locked out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_lost_by_its_clock_is_no_longer_renewed() {
    let server = server();
    let (proxy, holder_client) = client_behind_proxy(&server, |config| {
        config.watchdog_lease = Duration::from_secs(2);
    })
    .await;
    let other = client(&server).await;
    let name = "lost-by-clock";
    let owner_key = keys(name).owner().to_owned();
    let guard = holder_client.lock(name).await.expect("lock");
    // One renewal through first: the renewal script is loaded.
    a_renewal_runs(&server, &owner_key).await;
    // Redis runs each renewal at once; its reply comes 1.4 s later.
    proxy.delay_replies(Duration::from_millis(1_400));
    within("the guard to be lost", guard.lost()).await;
    assert!(
        owner_in_redis(&server, name).is_some(),
        "Redis still holds the lock when the guard learns it is lost"
    );
    let taken = within("another process to get the lock", async {
        loop {
            if let Some(taken) = other.try_lock(name).await.expect("try_lock") {
                break taken;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(guard.is_lost());
    taken.release().await.expect("release");
    drop(guard);
}
