//! The fair semaphore (issue 13): at most `permits` holders under a swarm
//! that kills holders, grants in ticket order, a dead holder's permit back
//! only once its lease ran out, and a defined run-time permit change.
//! Every check is an invariant (counts, orders, server-time deadlines),
//! never a wall-clock timing.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fairlock::{LockOptions, Permit, Semaphore};
use fairlock_core::{LockKeys, PermitFamily};
use fairlock_tests::*;

fn sem_keys(name: &str) -> LockKeys {
    permit_keys(name, PermitFamily::Semaphore)
}

/// Server time in ms.
fn server_ms(server: &RedisServer) -> i64 {
    let time = server.cmd(&["TIME"]).expect("TIME");
    let parts = time.as_array().expect("array");
    let secs: i64 = parts[0].as_str().expect("secs").parse().expect("secs");
    let micros: i64 = parts[1].as_str().expect("us").parse().expect("us");
    secs * 1000 + micros / 1000
}

/// Waits (bounded) until `key` holds exactly `count` owner ids.
async fn wait_until_zcard_is(server: &RedisServer, key: &str, count: i64) {
    for _ in 0..4000 {
        if zcard(server, key) == count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{key} never came to {count} owner ids");
}

/// Waits (bounded) until `count` owner ids are queued on `name`.
async fn until_queued(server: &RedisServer, name: &str, count: i64) {
    wait_for_zcard(server, sem_keys(name).queue(), count).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_permits_holders_under_a_swarm_that_kills_holders() {
    const PERMITS: u32 = 3;
    let server = Arc::new(server());
    let name = "swarm";
    let active = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    // Redis's own view, polled throughout: the holders set never has more
    // owner ids than permits (expired ones not yet removed included).
    let poller = {
        let server = Arc::clone(&server);
        let stop = Arc::clone(&stop);
        let holders = sem_keys(name).owner().to_owned();
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(Ordering::SeqCst) {
                most = most.max(zcard(&server, &holders));
                std::thread::sleep(Duration::from_millis(2));
            }
            most
        })
    };

    let mut tasks = Vec::new();
    for worker in clients(&server, 4).await {
        for _ in 0..2 {
            let sem = worker.semaphore(name, PERMITS).expect("semaphore");
            let (active, most) = (Arc::clone(&active), Arc::clone(&most));
            tasks.push(tokio::spawn(async move {
                for _ in 0..12 {
                    let permit = sem.acquire().await.expect("acquire");
                    let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    active.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.expect("release");
                }
            }));
        }
    }
    // Holders that die holding: their process stops without a release, so
    // their permit can only come back through its 1 s lease.
    for victim in clients(&server, 3).await {
        let sem = victim.semaphore(name, PERMITS).expect("semaphore");
        let (active, most) = (Arc::clone(&active), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            let permit = sem
                .acquire_with(LockOptions::new().lease(Duration::from_secs(1)))
                .await
                .expect("victim acquire");
            // Counted only for the moment it works: after its death it
            // still holds in Redis, so `active` undercounts from then on,
            // which the Redis-side poller covers.
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            active.fetch_sub(1, Ordering::SeqCst);
            victim.shutdown().await;
            // The release on drop fails: the client is closed.
            drop(permit);
        }));
    }
    for task in tasks {
        within("the swarm", task).await.expect("task");
    }
    stop.store(true, Ordering::SeqCst);
    let most_in_redis = poller.join().expect("poller");
    assert!(
        most.load(Ordering::SeqCst) <= i64::from(PERMITS),
        "{} holders at once",
        most.load(Ordering::SeqCst)
    );
    assert!(
        most_in_redis <= i64::from(PERMITS),
        "Redis held {most_in_redis} permits at once"
    );
    assert!(most.load(Ordering::SeqCst) >= 2, "permits were shared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_follow_ticket_order() {
    let server = server();
    let client = client(&server).await;
    let others = clients(&server, 3).await;
    let name = "fifo";
    let sem = client.semaphore(name, 2).expect("semaphore");
    let first = sem.acquire().await.expect("first");
    let second = sem.acquire().await.expect("second");
    assert!(sem.try_acquire().await.expect("try").is_none(), "full");

    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..12usize {
        let sem: Semaphore = others[i % others.len()]
            .semaphore(name, 2)
            .expect("semaphore");
        let grants = Arc::clone(&grants);
        waiters.push(tokio::spawn(async move {
            let permit = sem.acquire().await.expect("acquire");
            grants
                .lock()
                .expect("grants")
                .push((permit.token().value(), permit.ticket().expect("it waited")));
            tokio::time::sleep(Duration::from_millis(2)).await;
            permit.release().await.expect("release");
        }));
        // Queue them one after another, so tickets are spread out.
        until_queued(&server, name, i as i64 + 1).await;
    }
    // No barging: a newcomer does not get a permit past the queue, even
    // once one is free.
    first.release().await.expect("release");
    assert!(sem.try_acquire().await.expect("try").is_none());
    second.release().await.expect("release");
    for waiter in waiters {
        within("a waiter", waiter).await.expect("waiter");
    }
    let mut grants = grants.lock().expect("grants").clone();
    grants.sort();
    let tickets: Vec<u64> = grants.iter().map(|&(_, ticket)| ticket).collect();
    let mut sorted = tickets.clone();
    sorted.sort();
    assert_eq!(tickets, sorted, "grant order (by token) is ticket order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_permit_returns_only_when_its_lease_ends() {
    let server = server();
    let doomed = client(&server).await;
    let survivor = client(&server).await;
    let name = "dead-holder";
    let keys = sem_keys(name);
    let sem = doomed.semaphore(name, 2).expect("semaphore");
    let a = sem.acquire().await.expect("a");
    let b = sem.acquire().await.expect("b");
    // Each permit has its own watchdog: both outlive their 3 s lease.
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    assert!(a.is_held().await.expect("a held") && !a.is_lost());
    assert!(b.is_held().await.expect("b held") && !b.is_lost());
    let owners = [a.owner_id().to_owned(), b.owner_id().to_owned()];

    // The holder's process stops without releasing.
    doomed.shutdown().await;
    std::mem::forget((a, b));
    let deadline = owners
        .iter()
        .map(|owner| {
            server
                .cmd(&["ZSCORE", keys.owner(), owner])
                .expect("ZSCORE")
                .as_str()
                .expect("still a holder")
                .parse::<i64>()
                .expect("deadline")
        })
        .min()
        .expect("two");
    let other = survivor.semaphore(name, 2).expect("semaphore");
    if server_ms(&server) < deadline {
        assert!(
            other.try_acquire().await.expect("try").is_none(),
            "no permit comes back while the dead holders' leases run"
        );
    }
    let permit = within("the returned permit", other.acquire())
        .await
        .expect("acquire");
    assert!(
        server_ms(&server) >= deadline,
        "the permit came back before the dead holder's lease ended"
    );
    permit.release().await.expect("release");
}

/// A holder releasing after its fixed lease ran out is refused, and the
/// permit, free by then, goes to the next waiter in that same call rather
/// than at the next heartbeat (10 s apart here, so only the release can
/// have granted it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_lease_ran_out_still_hands_the_permit_on() {
    let server = server();
    let mut config = fast_config(&server);
    config.heartbeat_interval = Duration::from_secs(10);
    config.waiter_timeout = Duration::from_secs(30);
    let holder = fairlock::LockClient::with_config(config.clone())
        .await
        .expect("client");
    let other = fairlock::LockClient::with_config(config)
        .await
        .expect("client");
    let name = "late";
    let keys = sem_keys(name);
    let late = holder
        .semaphore(name, 1)
        .expect("semaphore")
        .acquire_with(LockOptions::new().lease(Duration::from_secs(1)))
        .await
        .expect("acquire");
    let sem = other.semaphore(name, 1).expect("semaphore");
    let waiting = tokio::spawn(async move { sem.acquire().await });
    until_queued(&server, name, 1).await;
    let deadline: i64 = server
        .cmd(&["ZSCORE", keys.owner(), late.owner_id()])
        .expect("ZSCORE")
        .as_str()
        .expect("a holder")
        .parse()
        .expect("deadline");
    while server_ms(&server) <= deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let late_id = late.owner_id().to_owned();
    assert!(matches!(
        late.release().await,
        Err(fairlock::Error::NotOwner { .. })
    ));
    let holders = server
        .cmd(&["ZRANGE", keys.owner(), "0", "-1"])
        .expect("ZRANGE");
    let holders: Vec<&str> = holders
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|h| h.as_str())
        .collect();
    assert!(
        holders.len() == 1 && holders[0] != late_id,
        "the refused release left the permit to the next heartbeat: {holders:?}"
    );
    let permit = within("the waiter behind the expired holder", waiting)
        .await
        .expect("task")
        .expect("acquire");
    assert_eq!(holders, [permit.owner_id()]);
    permit.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_permits_at_run_time_is_defined() {
    let server = server();
    let client = client(&server).await;
    let other = fairlock_tests::client(&server).await;
    let name = "resize";
    let keys = sem_keys(name);
    let one = client.semaphore(name, 1).expect("semaphore");
    let held = one.acquire().await.expect("held");

    // A waiter under the old count of 1.
    let granted = Arc::new(AtomicUsize::new(0));
    let waiter = {
        let sem = other.semaphore(name, 1).expect("semaphore");
        let granted = Arc::clone(&granted);
        tokio::spawn(async move {
            let permit = sem.acquire().await.expect("acquire");
            granted.fetch_add(1, Ordering::SeqCst);
            permit
        })
    };
    until_queued(&server, name, 1).await;

    // Raising to 3 grants the queued waiter at once, then the caller.
    let three = one.clone().with_permits(3).expect("3");
    let raised = three.try_acquire().await.expect("try").expect("a permit");
    let waited: Permit = within("the queued waiter", waiter).await.expect("waiter");
    assert_eq!(granted.load(Ordering::SeqCst), 1);
    assert_eq!(zcard(&server, keys.owner()), 3);

    // Lowering to 1 revokes nobody; new grants wait until fewer than 1 hold.
    let lowered = one.clone().with_permits(1).expect("1");
    assert!(lowered.try_acquire().await.expect("try").is_none());
    for permit in [&held, &raised, &waited] {
        assert!(permit.is_held().await.expect("held"), "nobody is revoked");
    }
    let late = {
        let lowered = lowered.clone();
        tokio::spawn(async move { lowered.acquire().await.expect("late") })
    };
    until_queued(&server, name, 1).await;
    held.release().await.expect("release");
    raised.release().await.expect("release");
    // One holder is left and the count is 1: the release granted nobody.
    assert_eq!(zcard(&server, keys.queue()), 1, "still waiting");
    waited.release().await.expect("release");
    let late = within("the late waiter", late).await.expect("late");
    assert_eq!(zcard(&server, keys.owner()), 1);
    late.release().await.expect("release");

    assert!(client.semaphore(name, 0).is_err(), "0 permits is refused");
    assert!(client.semaphore("", 1).is_err(), "the name is checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_and_a_lock_of_one_name_are_independent() {
    let server = server();
    let client = client(&server).await;
    let guard = client.lock("shared-name").await.expect("lock");
    let sem = client.semaphore("shared-name", 1).expect("semaphore");
    let permit = sem.try_acquire().await.expect("try").expect("free");
    assert!(client
        .try_lock("shared-name")
        .await
        .expect("try lock")
        .is_none());
    permit.release().await.expect("release");
    guard.release().await.expect("release");
    // A timed-out wait leaves the queue.
    let held = sem.acquire().await.expect("held");
    let timeout = sem
        .acquire_with(LockOptions::new().wait_timeout(Duration::from_millis(200)))
        .await;
    assert!(matches!(timeout, Err(fairlock::Error::WaitTimeout { .. })));
    assert_eq!(zcard(&server, sem_keys("shared-name").queue()), 0);
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_whose_message_is_lost_still_arrive_with_their_own_lease() {
    let server = server();
    let holder = client(&server).await;
    let waiting = fairlock_tests::client(&server).await;
    let name = "lost-message";
    let sem = holder.semaphore(name, 1).expect("semaphore");
    let first = sem.acquire().await.expect("first");
    let mut waiters = Vec::new();
    for i in 0..3 {
        let sem = waiting.semaphore(name, 1).expect("semaphore");
        waiters.push(tokio::spawn(async move {
            let permit = sem.acquire().await.expect("acquire");
            // Past the 1 s lease an unheard grant gets: still held, so the
            // waiter set its own lease when it learned of the grant.
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            assert!(permit.is_held().await.expect("is_held"), "lease confirmed");
            assert!(!permit.is_lost());
            permit.release().await.expect("release");
        }));
        until_queued(&server, name, i + 1).await;
    }
    // The waiters' subscriber is cut just before each handoff, so grant
    // messages may reach nobody; the heartbeat's probe finds the grant.
    server
        .cmd(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .expect("CLIENT KILL");
    first.release().await.expect("release");
    for waiter in waiters {
        server
            .cmd(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .expect("CLIENT KILL");
        within("a waiter", waiter).await.expect("waiter");
    }
}

/// A permit handed on by a release in the waiter's own process while that
/// process's subscriber is down (its grant message reaches nobody, and the
/// script cut the lease to the waiter TTL) keeps the waiter's own lease:
/// the woken waiter sets it. It used to keep the 1 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unheard_permit_woken_in_process_keeps_the_waiters_own_lease() {
    let server = server();
    let client = client(&server).await;
    let name = "unheard";
    let sem = client.semaphore(name, 1).expect("semaphore");
    let first = sem.acquire().await.expect("first");
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move {
            sem.acquire_with(LockOptions::new().lease(Duration::from_secs(60)))
                .await
        })
    };
    until_queued(&server, name, 1).await;
    let cut_off = cut_off_subscribers(&server);
    first.release().await.expect("release");
    let permit = within("the permit woken in process", waiter)
        .await
        .expect("task")
        .expect("granted");
    let deadline = server
        .cmd(&["ZSCORE", sem_keys(name).owner(), permit.owner_id()])
        .expect("ZSCORE");
    let left = deadline
        .as_str()
        .and_then(|d| d.parse::<f64>().ok())
        .expect("a holder's deadline") as i64
        - server_ms(&server);
    drop(cut_off);
    // Above halfway between the 60 s asked and the waiter TTL this rules
    // out (5 s at most here): a loaded machine may take seconds from the
    // grant to this read.
    assert!(
        left > 32_500,
        "the unheard permit's lease is {left} ms, asked 60 s"
    );
    permit.release().await.expect("release");
}

/// Draining a long permit queue costs one release per waiter plus the
/// background rounds: a heartbeat whose probe (the oldest waiter) was
/// granted while the call was on its way must not make every waiter of
/// the process run acquire again. (It did: the heartbeat answered "probe
/// not queued", and the client rechecked all its waiters, round after
/// round, while the queue drained.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_permit_queue_costs_no_rechecks() {
    const WAITERS: usize = 1_000;
    let server = server();
    let client = client(&server).await;
    let semaphore = client.semaphore("drain", 1).expect("semaphore");
    let holder = semaphore.acquire().await.expect("holder");
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let semaphore = semaphore.clone();
        tasks.push(tokio::spawn(async move {
            let permit = semaphore.acquire().await.expect("waiter");
            // Long enough for several heartbeats to run during the drain.
            tokio::time::sleep(Duration::from_millis(1)).await;
            permit.release().await.expect("release");
        }));
    }
    until_queued(&server, "drain", WAITERS as i64).await;
    server.cmd(&["CONFIG", "RESETSTAT"]).expect("reset stats");
    holder.release().await.expect("release");
    for task in tasks {
        within("a waiter", task).await.expect("task");
    }
    let evalsha = calls(&server, "evalsha");
    eprintln!("{evalsha} script calls to drain {WAITERS} permit waiters");
    assert!(
        evalsha < WAITERS as u64 + WAITERS as u64 / 2,
        "{evalsha} script calls to drain {WAITERS} permit waiters"
    );
}

/// Dead waiters at the head of a permit queue, more than one call looks
/// at, are purged in bounded background calls after a release (as a
/// lock's are), and the live waiter behind them is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_permit_waiters_are_purged_in_bounded_steps() {
    const DEAD: usize = 2_000;
    let server = server();
    // Heartbeats far apart, so only the purge that follows a call can
    // clear the dead entries within the test's bound.
    let mut config = fast_config(&server);
    config.heartbeat_interval = Duration::from_secs(30);
    config.waiter_timeout = Duration::from_secs(60);
    let client = fairlock::LockClient::with_config(config)
        .await
        .expect("connect");
    let name = "crowd";
    let sem = client.semaphore(name, 1).expect("semaphore");
    let holder = sem.acquire().await.expect("holder");
    let keys = sem_keys(name);
    // One dead process, its deadline long past, with 2,000 entries.
    server
        .cmd(&["ZADD", keys.alive(), "1", "00000000000000dd"])
        .expect("dead process");
    for chunk in (0..DEAD).collect::<Vec<_>>().chunks(500) {
        let entries: Vec<String> = chunk
            .iter()
            .flat_map(|i| {
                [
                    (i + 1).to_string(),
                    fairlock_core::PermitOwnerId::new(
                        &format!("{i:032x}"),
                        "00000000000000dd",
                        30_000,
                        fairlock_core::PermitRequest::Shared(1),
                    )
                    .expect("owner id")
                    .as_str()
                    .to_owned(),
                ]
            })
            .collect();
        let mut cmd = vec!["ZADD", keys.queue()];
        cmd.extend(entries.iter().map(String::as_str));
        server.cmd(&cmd).expect("dead entries");
    }
    // The waiter's enqueue finds the dead entries first: it drops what one
    // call may look at (128), and its client purges the rest in bounded
    // background calls, leaving the waiter alone in the queue.
    server.cmd(&["CONFIG", "RESETSTAT"]).expect("reset");
    let live = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    wait_until_zcard_is(&server, keys.queue(), 1).await;
    let scripts = calls(&server, "evalsha");
    assert!(
        scripts >= (DEAD / 128) as u64,
        "{scripts} script calls purged {DEAD} dead entries"
    );
    holder.release().await.expect("release");
    let permit = within("the live waiter behind the dead ones", live)
        .await
        .expect("task")
        .expect("granted");
    assert_eq!(zcard(&server, keys.queue()), 0);
    permit.release().await.expect("release");
}

/// A release whose reply is lost with its connection (the proxy lets the
/// release through, drops its reply and closes the connection) is sent
/// again by fred or the client's call layer, and runs a second time. The
/// permit was given back by the first run, so the release must succeed
/// and no lease counts as lost. Before the fix the second run found no
/// permit: `release()` failed with `NotOwner` and
/// `fairlock_lease_lost_total` counted a loss that never happened.
/// Current-thread, for the recorder local to the test.
#[tokio::test]
async fn a_release_whose_reply_was_lost_is_sent_again_and_succeeds() {
    let metrics = local_metrics::LocalMetrics::install();
    let server = server();
    let (proxy, client) = client_behind_proxy(&server, |_| {}).await;
    let name = "resent";
    let sem = client.semaphore(name, 2).expect("semaphore");
    // Loads the release script: the marked command is then the release.
    sem.acquire()
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    let permit = sem.acquire().await.expect("acquire");

    proxy.drop_reply_to(<fairlock_core::PermitRelease as fairlock_core::ScriptCall>::SCRIPT.sha1());
    let released = within("the release", permit.release()).await;
    assert!(proxy.reply_dropped(), "the release's reply was not dropped");
    assert!(
        matches!(released, Ok(())),
        "the release sent again: {released:?}"
    );
    assert_eq!(
        zcard(&server, sem_keys(name).owner()),
        0,
        "the permit is back"
    );
    assert_eq!(
        metrics.total(fairlock_metrics::LEASE_LOST_TOTAL),
        0.0,
        "a lease counted lost"
    );
    client.shutdown().await;
}

/// Spawns a task that waits for a permit of `semaphore`, releases it as
/// soon as it is granted, and returns its owner id and fencing token.
fn spawn_permit_turn(semaphore: &Semaphore) -> tokio::task::JoinHandle<(String, u64)> {
    let semaphore = semaphore.clone();
    tokio::spawn(async move {
        let permit = semaphore.acquire().await.expect("granted");
        let turn = (permit.owner_id().to_owned(), permit.token().value());
        permit.release().await.expect("release");
        turn
    })
}

/// A permit release whose caller stopped waiting (its future dropped by
/// a timeout) is finished in the background, and then looks for a grant
/// it may have handed to a waiter here unheard: for a lock, with a lock
/// heartbeat call. On a permit set that call was the lock's script on the
/// set's keys, refused by Redis (`heartbeat.lua` run once, failing, with a
/// misleading "heartbeat failed" warning); permit grants are always
/// published and found by the permit heartbeat, so none runs now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_permit_release_runs_no_lock_script_on_the_set() {
    let server = server();
    // Waiters outlive the pause below (5 s waiter timeouts).
    let client = patient_client(&server).await;
    let other = patient_client(&server).await;
    let name = "dropped-release";
    let semaphore = |client: &fairlock::LockClient| client.semaphore(name, 1).expect("semaphore");
    let permit = semaphore(&client).acquire().await.expect("permit");
    let elsewhere = tokio::spawn({
        let sem = semaphore(&other);
        async move { sem.acquire().await }
    });
    until_queued(&server, name, 1).await;
    let here = tokio::spawn({
        let sem = semaphore(&client);
        async move { sem.acquire().await }
    });
    until_queued(&server, name, 2).await;
    log_every_command(&server);
    server
        .cmd_ok(&["CLIENT", "PAUSE", "500", "WRITE"])
        .expect("pause writes");
    let dropped = tokio::time::timeout(Duration::from_millis(100), permit.release()).await;
    assert!(dropped.is_err(), "the release waits in Redis");
    let elsewhere = within("the other process's permit", elsewhere)
        .await
        .expect("task")
        .expect("permit");
    elsewhere.release().await.expect("release");
    let here = within("this process's permit", here)
        .await
        .expect("task")
        .expect("permit");
    let lock_heartbeat = fairlock_core::HeartbeatBatch::script().sha1();
    let misplaced = commands_run(&server)
        .iter()
        .filter(|args| args.get(1).map(String::as_str) == Some(lock_heartbeat))
        .count();
    assert_eq!(misplaced, 0, "lock heartbeat calls on the permit set");
    here.release().await.expect("release");
}

/// A permit waiter whose queue entry was lost keeps its place when it is
/// queued again, as a lock waiter does: it joins with its own ticket,
/// ahead of a caller who queued after it. (Before the fix it got a new
/// ticket, behind that caller, and was granted after it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_whose_entry_was_lost_keeps_its_place() {
    let server = server();
    let clients = clients(&server, 3).await;
    let name = "lost-place";
    let set = sem_keys(name);
    let [h, p, q] = [0, 1, 2].map(|i| clients[i].semaphore(name, 1).expect("semaphore"));
    let holder = h.acquire().await.expect("holder");
    let a = spawn_permit_turn(&p);
    until_queued(&server, name, 1).await;
    let a_id = queue_entries(&server, set.queue())[0].clone();
    let ticket = ticket_of(&server, set.queue(), &a_id);
    let c = spawn_permit_turn(&q);
    until_queued(&server, name, 2).await;
    let tag = fairlock_core::OwnerId::tag_of(&a_id)
        .expect("an owner id")
        .to_owned();
    lose_entry_and_see_it_rejoin(&server, set.queue(), set.alive(), &a_id, &tag, &ticket).await;
    holder.release().await.expect("release");
    let (a_got, a_token) = within("A", a).await.expect("A");
    let (_, c_token) = within("C", c).await.expect("C");
    assert_eq!(a_got, a_id);
    assert!(
        a_token < c_token,
        "A, queued before C, is granted first: A {a_token}, C {c_token}"
    );
}

/// A permit waiter whose queue entry alone was lost, while an older
/// waiter of its process stayed queued (a fail-over to a replica that had
/// the older enqueue but not the newer; here a ZREM), is queued again
/// within a heartbeat or two, so a caller who comes after that does not
/// overtake it. The permit heartbeat used to check only the process's
/// oldest waiter on the set. (Before the fix: not back after 10
/// heartbeats of its process, and granted after the newcomer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_whose_entry_alone_was_lost_is_queued_again() {
    let server = server();
    let clients = clients(&server, 3).await;
    let name = "lost-entry";
    let set = sem_keys(name);
    let [h, p, q] = [0, 1, 2].map(|i| clients[i].semaphore(name, 1).expect("semaphore"));
    let holder = h.acquire().await.expect("holder");
    let a = spawn_permit_turn(&p);
    until_queued(&server, name, 1).await;
    let b = spawn_permit_turn(&p);
    until_queued(&server, name, 2).await;
    let queued = queue_entries(&server, set.queue());
    let (a_id, b_id) = (queued[0].clone(), queued[1].clone());
    let tag = fairlock_core::OwnerId::tag_of(&a_id)
        .expect("an owner id")
        .to_owned();
    server.cmd(&["ZREM", set.queue(), &b_id]).expect("ZREM");
    let back = queued_again_within_beats(&server, set.queue(), set.alive(), &b_id, &tag, 10).await;
    // A waiter of another process arrives after that.
    let c = spawn_permit_turn(&q);
    wait_for_a_newcomer(&server, set.queue(), &[&a_id, &b_id]).await;
    holder.release().await.expect("release");
    let (a_got, a_token) = within("A", a).await.expect("A");
    let (b_got, b_token) = within("B", b).await.expect("B");
    let (_, c_token) = within("C", c).await.expect("C");
    assert_eq!((a_got, b_got), (a_id, b_id));
    assert_queued_again_before_the_newcomer(back, [a_token, b_token, c_token]);
}
