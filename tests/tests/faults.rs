//! Faults: dead holders and waiters, lost pub/sub messages, a flushed
//! script cache, a restarted Redis, and the cost of waiting.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fairlock::{LockClient, LockOptions};
use fairlock_core::{Acquire, AcquireMode, AcquireReply, KeyPrefix, LockKeys, LockName, Timings};
use fairlock_tests::*;

const CHILD_URL: &str = "FAIRLOCK_TEST_CHILD_URL";
const LONG: Duration = Duration::from_secs(20);

/// Not a test of its own: the holder process that `holder_killed_with_sigkill_frees_the_lock`
/// starts and kills. It takes the lock and then hangs.
#[tokio::test]
#[ignore = "run as a child process by holder_killed_with_sigkill_frees_the_lock"]
async fn holder_child() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    let mut config = fairlock::ClientConfig::new(url);
    config.watchdog_lease = Duration::from_secs(2);
    let client = LockClient::with_config(config)
        .await
        .expect("child connects");
    let guard = client.lock("killed").await.expect("child locks");
    println!("LOCKED {} {}", guard.owner_id(), guard.token());
    // Killed long before this; the bound keeps a stray child from lingering.
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// A holder process killed with SIGKILL never releases; the lock frees
/// when its (watchdog-kept, no longer renewed) lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_killed_with_sigkill_frees_the_lock() {
    let server = server();
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "holder_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_URL, server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the holder process");
    let stdout = child.stdout.take().expect("child stdout");
    let (child_id, child_token) = tokio::task::spawn_blocking(move || {
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("child output");
            // libtest prints "test holder_child ... " before it on the same line.
            if let Some((_, rest)) = line.split_once("LOCKED ") {
                let (id, token) = rest.split_once(' ').expect("id and token");
                return (id.to_owned(), token.parse::<u64>().expect("token"));
            }
        }
        panic!("the holder process exited without locking");
    })
    .await
    .expect("reader");

    let client = client(&server).await;
    let state = client.inspect("killed").await.expect("inspect");
    assert_eq!(state.owner.as_deref(), Some(child_id.as_str()));
    assert!(
        state.owner_pttl_ms > 0 && state.owner_pttl_ms <= 2_000,
        "{state:?}"
    );
    child.kill().expect("SIGKILL the holder");
    child.wait().expect("reap");

    let guard = client
        .lock_with("killed", LockOptions::new().wait_timeout(LONG))
        .await
        .expect("the lock frees when the dead holder's lease runs out");
    assert!(guard.token().value() > child_token);
    guard.release().await.expect("release");
}

/// A holder whose client is shut down (connections closed, watchdog gone)
/// without releasing: the lock frees within its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_whose_client_is_gone_frees_the_lock() {
    let server = server();
    let doomed = client(&server).await;
    let guard = doomed
        .lock_with(
            "abandoned",
            LockOptions::new().lease(Duration::from_millis(500)),
        )
        .await
        .expect("lock");
    let token = guard.token();
    std::mem::forget(guard);
    doomed.shutdown().await;

    let client = client(&server).await;
    let guard = client
        .lock_with("abandoned", LockOptions::new().wait_timeout(LONG))
        .await
        .expect("granted after the abandoned lease");
    assert!(guard.token() > token);
}

/// A dead waiter (no heartbeats) at the head of the queue is skipped once
/// its waiter timeout passes; the next live waiter gets the lock directly.
/// If the handoff reaches it before that, nobody listens on its process's
/// channel, so it is passed over at once instead of holding the lock for
/// its whole lease (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiter_at_the_head_is_skipped() {
    let server = server();
    let client = client(&server).await;
    let dead_timings = Timings::new(300, 20_000, 600_000).expect("timings");
    let dead = |owner_id: &'static str| Acquire {
        owner_id,
        mode: AcquireMode::Wait,
        timings: &dead_timings,
        channel_prefix: "test:nobody:",
        rejoin: None,
    };

    for (name, hold) in [
        ("dead-skipped", Duration::from_millis(600)),
        ("dead-granted", Duration::ZERO),
    ] {
        let holder = client.lock(name).await.expect("holder");
        assert!(matches!(
            raw(
                &server,
                name,
                &dead("dead0000000000000000000000000000.0000000000000000.60000")
            ),
            AcquireReply::Queued { .. }
        ));
        let live = {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .lock_with(name, LockOptions::new().wait_timeout(LONG))
                    .await
                    .map(|g| g.token())
            })
        };
        wait_for_queue_len(&client, name, 2).await;
        tokio::time::sleep(hold).await;
        let holder_token = holder.token();
        holder.release().await.expect("release");
        let token = live
            .await
            .expect("task")
            .expect("the live waiter is granted");
        assert!(token > holder_token, "{name}");
        let state = client.inspect(name).await.expect("inspect");
        assert_eq!(state.queue_len, 0, "{name}: the dead waiter is gone");
    }
}

/// Pub/sub is at-most-once: kill the subscriber connections while waiters
/// wait. Every waiter is still granted (heartbeats re-deliver grants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_killed_pubsub_connections() {
    const PER_CLIENT: usize = 10;
    let server = server();
    let clients = clients(&server, 2).await;
    let holder = clients[0].lock("notify").await.expect("holder");
    let granted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..PER_CLIENT {
            let client = client.clone();
            let granted = Arc::clone(&granted);
            tasks.push(tokio::spawn(async move {
                let guard = client
                    .lock_with("notify", LockOptions::new().wait_timeout(LONG))
                    .await
                    .expect("granted despite lost messages");
                granted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                guard.release().await.expect("release");
            }));
        }
    }
    wait_for_queue_len(&clients[0], "notify", (2 * PER_CLIENT) as u64).await;
    fairlock_tests::wait_for_subscribed_connections(&server, 2).await;
    let killed = server
        .cmd(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .expect("CLIENT KILL");
    assert_eq!(
        killed.as_int(),
        Some(2),
        "one subscriber connection per client"
    );
    holder.release().await.expect("release");
    // Kill them again while the queue drains.
    tokio::time::sleep(Duration::from_millis(20)).await;
    server
        .cmd(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .expect("CLIENT KILL");
    for task in tasks {
        task.await.expect("waiter task");
    }
    assert_eq!(granted.load(Ordering::SeqCst), 2 * PER_CLIENT);
}

/// A pub/sub connection that goes silent without closing (a network cut
/// that sends no FIN or RST) is noticed by its keep-alive PING (sent after
/// a silent heartbeat interval, unanswered for the command timeout) and
/// opened again; the process's waiters are
/// granted afterwards as before. Without the keep-alive the client would
/// sit on the dead connection and never subscribe again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_pubsub_connection_is_noticed_and_opened_again() {
    let server = server();
    let proxy = fairlock_tests::silent_proxy::SilentProxy::start(server.port()).await;
    let config = fairlock::ClientConfig::builder(proxy.url())
        .heartbeat_interval(Duration::from_millis(100))
        .command_timeout(Duration::from_secs(2))
        .build()
        .expect("config");
    let waiting = within("connect", LockClient::with_config(config))
        .await
        .expect("connects through the proxy");
    assert_eq!(proxy.subscribed_connections(), 1, "one subscription");
    proxy.silence_subscribers();
    within("a new subscription", async {
        while proxy.subscribed_connections() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let other = client(&server).await;
    for round in 0..3 {
        let holder = other.lock("silent").await.expect("holder");
        let waiter = spawn_lock(&waiting, "silent");
        wait_for_queue_len(&other, "silent", 1).await;
        // Waits a few heartbeat intervals: the waiter's heartbeats (and
        // their script loads) go through the proxy too.
        tokio::time::sleep(Duration::from_millis(400)).await;
        holder.release().await.expect("release");
        let guard = granted(waiter, "the waiter behind the silenced connection").await;
        assert_eq!(guard.name(), "silent", "round {round}");
        guard.release().await.expect("release");
    }
    // At least once: a stall of this loaded machine longer than the
    // command timeout may make the new connection look silent too.
    assert!(
        proxy.subscribed_connections() >= 2,
        "opened again: {}",
        proxy.subscribed_connections()
    );
}

/// SCRIPT FLUSH between operations: EVALSHA meets NOSCRIPT, the client
/// loads the script and retries transparently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_script_cache_is_reloaded() {
    let server = server();
    let client = client(&server).await;
    for round in 0..3 {
        server.cmd(&["SCRIPT", "FLUSH"]).expect("flush");
        let guard = client.lock("flushed").await.expect("lock after flush");
        server.cmd(&["SCRIPT", "FLUSH"]).expect("flush");
        let waiter = {
            let client = client.clone();
            tokio::spawn(async move { client.lock("flushed").await.map(|g| g.token()) })
        };
        wait_for_queue_len(&client, "flushed", 1).await;
        server.cmd(&["SCRIPT", "FLUSH"]).expect("flush");
        guard.release().await.expect("release after flush");
        let token = waiter.await.expect("task").expect("waiter after flush");
        assert!(token.value() > 0, "round {round}");
    }
    assert!(calls(&server, "script|load") >= 6, "scripts were reloaded");
}

/// Restarting Redis (no persistence) loses every lock and queue: the
/// holder's lease-lost signal fires, and waiters re-register through their
/// heartbeat and are all granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_fires_lease_lost_and_waiters_recover() {
    let mut server = server();
    let client = client(&server).await;
    let holder = client.lock("restart").await.expect("holder");
    let mut waiters = Vec::new();
    for _ in 0..5 {
        let client = client.clone();
        waiters.push(tokio::spawn(async move {
            let guard = client
                .lock_with("restart", LockOptions::new().wait_timeout(LONG))
                .await
                .expect("granted after the restart");
            guard.release().await.expect("release after the restart");
        }));
    }
    wait_for_queue_len(&client, "restart", 5).await;
    server.restart().expect("restart redis");
    tokio::time::timeout(LONG, holder.lost())
        .await
        .expect("the holder learns its lease is lost");
    assert!(holder.is_lost());
    assert!(!holder.is_held().await.expect("is_held"));
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
}

/// Waiting costs Redis nothing per waiter: 100 blocked waiters on 2
/// clients for 3 s. Bound on EVALSHA calls in the window:
///   heartbeats: 2 clients x (3 s / 100 ms + 2) = 64
///   watchdog renewals of the holder: 3 s / 1 s + 1 = 4
///   re-checks of the first waiter (holder's lease, >= 2 s left): 2
/// = 70, plus slack (the assertion allows 3 x intervals + 10, about 100 on
/// a slow machine), at most one call per waiter, while polling
/// even once a second would take 300. Also: one subscriber connection per
/// client, not per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_waiters_do_not_spin() {
    const WAITERS: usize = 100;
    let server = server();
    let clients = [
        fairlock_tests::patient_client(&server).await,
        fairlock_tests::patient_client(&server).await,
    ];
    let holder = clients[0].lock("spin").await.expect("holder");
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = clients[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let guard = client.lock("spin").await.expect("waiter");
            guard.release().await.expect("release");
        }));
    }
    wait_for_queue_len(&clients[0], "spin", WAITERS as u64).await;
    let (evalsha, intervals) = script_calls_over(&server, Duration::from_secs(3)).await;
    let stats = server.commandstats().expect("stats");
    eprintln!("{WAITERS} waiters, {intervals} intervals: {evalsha} EVALSHA calls");
    // Per 100 ms interval: one heartbeat per client for the lock (2) and
    // one watchdog check by the holder's client (1): about 90 in 3 s,
    // whatever the number of waiters (the window is timed, as a loaded
    // machine sleeps longer). One call per waiter per interval would be
    // 3,000.
    assert!(
        evalsha <= 3 * intervals + 10,
        "{evalsha} script calls for {WAITERS} waiters in {intervals} intervals: {stats:?}"
    );

    // One pub/sub subscription per client (one may be reopening).
    fairlock_tests::wait_for_subscribed_connections(&server, 2).await;

    holder.release().await.expect("release");
    for task in tasks {
        task.await.expect("task");
    }
}

/// A long queue drains at one release per waiter. A heartbeat whose probe
/// (the oldest waiter here) had just been granted used to make every
/// waiter of the lock re-run its acquire script: one script per waiter per
/// heartbeat for as long as the queue drained, so draining took time
/// quadratic in its length (2,000 waiters in one process: 61 s, now 1.4 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_queue_costs_no_rechecks() {
    const WAITERS: usize = 1_000;
    let server = server();
    let client = fairlock_tests::patient_client(&server).await;
    let holder = client.lock("drain").await.expect("holder");
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let guard = client.lock("drain").await.expect("waiter");
            // Long enough for several heartbeats to run during the drain.
            tokio::time::sleep(Duration::from_millis(1)).await;
            guard.release().await.expect("release");
        }));
    }
    wait_for_queue_len(&client, "drain", WAITERS as u64).await;
    server.cmd(&["CONFIG", "RESETSTAT"]).expect("reset stats");
    holder.release().await.expect("release");
    for task in tasks {
        task.await.expect("task");
    }
    // One release per waiter, plus the heartbeat and watchdog rounds of
    // the drain; a recheck round alone would add another WAITERS.
    let evalsha = calls(&server, "evalsha");
    eprintln!("{evalsha} script calls to drain {WAITERS} waiters");
    assert!(
        evalsha < WAITERS as u64 + WAITERS as u64 / 2,
        "{evalsha} script calls to drain {WAITERS} waiters"
    );
}

/// A primary demoted to a replica without its connections closing (a
/// coordinated `FAILOVER`, an operator's `REPLICAOF`, a DNS name or
/// virtual IP moved to the new primary) answers every write `READONLY` on
/// the old connections. A client takes that answer as a sign that the
/// URL's server has moved: it connects again (once, whichever call saw it
/// first), which reaches the new primary, and sends the call again there;
/// its grant connection follows at its next keep-alive check. Lock, try,
/// release and a grant to another client's waiter all work on the new
/// primary, and that grant is heard there (the waiter keeps the lease it
/// asked for, not the waiter TTL the new primary gives a grant nobody
/// hears). Before, every lock call answered `ReadOnly` until the client
/// was restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_demoted_without_closing_connections_is_left_for_the_new_one() {
    let old = server();
    let new = server();
    let proxy = switch_proxy::SwitchProxy::start(old.port()).await;
    let mut config = fast_config(&old);
    config.url = proxy.url();
    let holder_client = LockClient::with_config(config.clone())
        .await
        .expect("connect");
    let waiter_client = LockClient::with_config(config).await.expect("connect");
    // Every connection of both clients is open on the old primary.
    for client in [&holder_client, &waiter_client] {
        let before = client.lock("moved").await.expect("lock on the primary");
        before.release().await.expect("release");
    }

    proxy.switch_to(new.port());
    old.cmd(&["REPLICAOF", "127.0.0.1", &new.port().to_string()])
        .expect("REPLICAOF");
    let guard = within("a lock after the demotion", holder_client.lock("moved"))
        .await
        .expect("a lock after the demotion is taken on the new primary");
    let keys = LockKeys::new(
        &KeyPrefix::default(),
        &LockName::new("moved").expect("name"),
    );
    assert_eq!(
        new.cmd(&["EXISTS", keys.owner()]).expect("EXISTS").as_int(),
        Some(1),
        "the lock is held on the new primary"
    );
    let lease = Duration::from_secs(30);
    let waiter = {
        let client = waiter_client.clone();
        tokio::spawn(async move {
            client
                .lock_with("moved", LockOptions::new().lease(lease))
                .await
        })
    };
    wait_for_queue_len(&holder_client, "moved", 1).await;
    // Both clients' grant connections have moved to the new primary.
    within("the grant connections to move", async {
        loop {
            let channels = new.cmd(&["PUBSUB", "CHANNELS"]).expect("PUBSUB CHANNELS");
            if channels.as_array().is_some_and(|c| c.len() == 2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    within("release", guard.release())
        .await
        .expect("release on the new primary");
    let next = within("the waiter's grant", waiter)
        .await
        .expect("task")
        .expect("the waiter is granted on the new primary");
    let pttl = new.cmd(&["PTTL", keys.owner()]).expect("PTTL").as_int();
    assert!(
        pttl.is_some_and(|ms| ms > 5_000),
        "the grant was heard: the waiter's own lease, not the waiter TTL ({pttl:?} ms left)"
    );
    next.release().await.expect("release");
    let tried = within("a try", holder_client.try_lock("moved"))
        .await
        .expect("a try on the new primary");
    assert!(tried.is_some(), "the lock is free on the new primary");
    holder_client.shutdown().await;
    waiter_client.shutdown().await;
}

/// A grant connection opened again on a replica (behind Sentinel: the old
/// primary a fail-over just demoted, which fred still names) hears grants
/// passed on by replication, while the primary counts no listener and
/// cuts each grant's lease to the waiter timeout: the waiter, told
/// nothing of it, would believe its own lease and lose the lock early. So
/// the connection must not subscribe on a replica; it waits for a
/// primary, and meanwhile the heartbeat finds the grant and sets the
/// waiter's own lease. Before, the waiter's lease in Redis was the 3 s
/// waiter timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_connection_opened_again_on_a_replica_does_not_subscribe_there() {
    let primary = server();
    let replica = online_replica_of(&primary).await;
    let (proxy, waiting_client) = client_behind_proxy(&primary, |config| {
        config.waiter_timeout = Duration::from_secs(3);
    })
    .await;
    let holder = client(&primary).await;
    let held = holder.lock("cut").await.expect("lock");
    let waiting = tokio::spawn({
        let client = waiting_client.clone();
        async move {
            client
                .lock_with("cut", LockOptions::new().lease(Duration::from_secs(60)))
                .await
        }
    });
    wait_for_queue_len(&holder, "cut", 1).await;

    // Only the grant connection is cut; it is opened again on the replica.
    proxy.switch_to(replica.port());
    proxy.cut_subscribers();
    within("the grant connection to try the replica", async {
        while proxy.subscribed_connections() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;

    held.release().await.expect("release");
    let guard = granted(waiting, "the waiter").await;
    let pttl = primary
        .cmd(&["PTTL", keys("cut").owner()])
        .expect("PTTL")
        .as_int()
        .expect("PTTL");
    assert!(
        pttl > 10_000,
        "the waiter's lease in Redis is {pttl} ms, not its own 60 s"
    );
    guard.release().await.expect("release");
    waiting_client.shutdown().await;
}

/// Every call is bounded by the command timeout, however many round trips
/// it takes. A script missing from the server (after `SCRIPT FLUSH` or a
/// restart) costs three: `EVALSHA` answered `NOSCRIPT`, `SCRIPT LOAD`,
/// `EVALSHA`; each was once given the whole command timeout, so with every
/// reply held back 0.9 s behind a 1 s command timeout a `try_lock` took
/// 2.7 s (and succeeded). Now it ends with `Error::Timeout` at the
/// command timeout and its 250 ms slack, before the second reply: the
/// outcome tells the two apart, with no clock read in the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_must_load_its_script_stays_within_the_command_timeout() {
    let server = server();
    let (proxy, client) = client_behind_proxy(&server, |config| {
        config.command_timeout = Duration::from_secs(1);
    })
    .await;
    server.cmd(&["SCRIPT", "FLUSH"]).expect("SCRIPT FLUSH");
    proxy.delay_replies(Duration::from_millis(900));
    let result = within("a try_lock behind slow replies", client.try_lock("slow")).await;
    assert!(
        matches!(result, Err(fairlock::Error::Timeout { .. })),
        "{:?}",
        result.map(|guard| guard.is_some())
    );
    proxy.delay_replies(Duration::ZERO);
    client.shutdown().await;
}

/// A call answered `READONLY` by a demoted server opens the connections
/// again, or waits for another call doing it, only until its own deadline
/// (the command timeout and its slack): a new server that accepts
/// connections and never answers must not hold the call longer. Before,
/// the call that reconnected waited up to a command timeout for each of
/// the two command connections, and the calls answered `READONLY` beside
/// it waited for that: about two command timeouts where one was due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_answered_readonly_ends_by_its_deadline_while_the_connections_reopen() {
    const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
    let old = server();
    let new = server();
    let (proxy, client) = client_behind_proxy(&old, |config| {
        config.command_timeout = COMMAND_TIMEOUT;
    })
    .await;
    let names = ["a", "b", "c"];
    for name in names {
        let guard = client.lock(name).await.expect("lock");
        guard.release().await.expect("release");
    }
    // Where the URL now leads: a server that accepts and never answers.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    proxy.switch_to(hole.local_addr().expect("addr").port());
    old.cmd(&["REPLICAOF", "127.0.0.1", &new.port().to_string()])
        .expect("REPLICAOF");
    // One burst: one call reconnects, the others wait for it.
    let calls: Vec<_> = names
        .into_iter()
        .map(|name| {
            let client = client.clone();
            tokio::spawn(async move { client.lock(name).await.map(|_| ()) })
        })
        .collect();
    // The deadline is 2.25 s; each extra command timeout is 2 s.
    let bound = COMMAND_TIMEOUT + COMMAND_TIMEOUT * 3 / 4;
    for call in calls {
        let ended = tokio::time::timeout(bound, call)
            .await
            .expect("the call ends by its deadline, not a command timeout per connection later")
            .expect("task");
        assert!(
            matches!(
                ended,
                Err(fairlock::Error::Timeout { .. } | fairlock::Error::ReadOnly(_))
            ),
            "{ended:?}"
        );
    }
    drop(hole);
}

/// A release that fails because Redis cannot be reached (the caller gets
/// the error) is tried again by the client once Redis answers (a cancel
/// for the holder's owner id with each heartbeat): a lock, or a
/// semaphore's permit, is not left held for the rest of a long lease by a
/// holder that already gave it back. Before, the other process waited out
/// its 15 s wait timeout for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_failed_in_an_outage_is_sent_again_when_redis_answers() {
    let (server, proxy, holder) = behind_a_proxy().await;
    let other = client(&server).await;
    let lease = LockOptions::new().lease(Duration::from_secs(60));
    let guard = holder.lock_with("outage", lease).await.expect("lock");
    let semaphore = |client: &LockClient, options| {
        client
            .semaphore("outage-set", 1)
            .expect("semaphore")
            .with_options(options)
    };
    let permit = semaphore(&holder, lease).acquire().await.expect("permit");
    let released = during_an_outage(&server, &proxy, async {
        (guard.release().await, permit.release().await)
    })
    .await;
    assert!(
        released.0.is_err() && released.1.is_err(),
        "the releases met the outage: {released:?}"
    );
    // The leases have most of their 60 s left; the other process gets the
    // lock and the permit only if the releases are sent again.
    let bounded = LockOptions::new().wait_timeout(Duration::from_secs(15));
    let taken = other.lock_with("outage", bounded).await;
    assert!(taken.is_ok(), "the lock stayed held: {:?}", taken.map(drop));
    let taken = semaphore(&other, bounded).acquire().await;
    assert!(
        taken.is_ok(),
        "the permit stayed held: {:?}",
        taken.map(drop)
    );
    holder.shutdown().await;
    other.shutdown().await;
}

/// A server, a proxy in front of it, and a client through the proxy with a
/// 1 s command timeout.
async fn behind_a_proxy() -> (RedisServer, switch_proxy::SwitchProxy, LockClient) {
    let server = server();
    let (proxy, client) = client_behind_proxy(&server, |config| {
        config.command_timeout = Duration::from_secs(1);
    })
    .await;
    (server, proxy, client)
}

/// Runs `call` while the proxy leads to a port nothing listens on (its
/// connections cut), and leads it back to `server` after.
async fn during_an_outage<T>(
    server: &RedisServer,
    proxy: &switch_proxy::SwitchProxy,
    call: impl std::future::Future<Output = T>,
) -> T {
    let dead_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    proxy.switch_to(dead_port);
    proxy.cut();
    let result = call.await;
    proxy.switch_to(server.port());
    result
}
