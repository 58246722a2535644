//! fairlock on a local Redis Cluster (3 primaries, 1 replica each): locks in
//! every primary's slots, contention across clients, FIFO, and scripts
//! missing from a node (never loaded there, or flushed); slot migration and
//! fail-over mid-wait; and the single-server core cases on the cluster.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fairlock::{ClientConfig, Error, FencedOp, LockClient, LockOptions, Reply};
use fairlock_core::{Acquire, AcquireMode, AcquireReply, Timings};
use fairlock_examples::seckill::{swarm, SwarmConfig, Variant};
use fairlock_testkit::RedisCluster;
use fairlock_tests::{
    assert_swarm_passed, cluster_client, cluster_client_at, crash_clients, errors_answered,
    hand_over, lock_names_on_every_primary, lock_slot, pubsub_only_client, raw, wait_for_queue_len,
    waiters_survive, within,
};

/// Hang guard.
const LONG: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_every_primary_exclude_and_hand_over_in_order() {
    let cluster = RedisCluster::start().expect("cluster");
    let clients = [
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    ];
    // Nothing waited for yet: no node subscribed.
    assert!(clients[0].grants_subscribed_at().is_empty());
    for name in lock_names_on_every_primary(&cluster) {
        // Scripts are loaded on demand, node by node, even after a flush.
        for node in cluster.nodes() {
            let _ = node.cmd(&["SCRIPT", "FLUSH"]);
        }
        let holder = clients[0].lock(&name).await.expect("lock");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..6 {
            let client = clients[i % 2].clone();
            let name = name.clone();
            let order = Arc::clone(&order);
            waiters.push(tokio::spawn(async move {
                let guard = client.lock(&name).await.expect("waiter");
                let guard_id = guard.owner_id().to_owned();
                order
                    .lock()
                    .expect("order")
                    .push((guard.ticket(), guard.token().value()));
                let lost = guard.is_lost();
                let state = client.inspect(&name).await.expect("inspect");
                if let Err(e) = guard.release().await {
                    panic!("release: {e:?} lost={lost} me={} state={state:?}", guard_id);
                }
            }));
            // Queue them one after the other, so tickets follow i.
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        holder.release().await.expect("release");
        for waiter in waiters {
            tokio::time::timeout(LONG, waiter)
                .await
                .expect("every waiter is granted")
                .expect("task");
        }
        let order = order.lock().expect("order").clone();
        assert_eq!(order.len(), 6, "{name}");
        // Grants went by sharded pub/sub in the lock's slot, never by
        // PUBLISH across the cluster bus.
        let (mut spublish, mut publish) = (0, 0);
        for node in cluster.nodes() {
            let stats = node.commandstats().expect("commandstats");
            spublish += stats.get("spublish").copied().unwrap_or(0);
            publish += stats.get("publish").copied().unwrap_or(0);
        }
        assert!(spublish > 0, "{name}: no SPUBLISH");
        assert_eq!(publish, 0, "{name}: a grant crossed the cluster bus");
        for pair in order.windows(2) {
            assert!(
                pair[0].0 < pair[1].0,
                "{name}: grants out of ticket order: {order:?}"
            );
            assert!(
                pair[0].1 < pair[1].1,
                "{name}: tokens not increasing: {order:?}"
            );
        }
    }
    // Both clients waited in a slot of every primary: each has its own
    // grant connection to each of them.
    let mut primaries = cluster.primaries().expect("primaries");
    primaries.sort();
    for client in &clients {
        assert_eq!(client.grants_subscribed_at(), primaries);
    }
}

/// On a cluster a grant reaches a waiter of another process on
/// fairlock's own connection to the node serving the lock's slot: with
/// the heartbeat (the fallback that finds grants nobody heard) a minute
/// away, the waiter is granted at the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_comes_on_fairlocks_own_connection_to_the_slots_node() {
    let cluster = RedisCluster::start().expect("cluster");
    let holder_client = pubsub_only_client(&cluster.url()).await;
    let waiter_client = pubsub_only_client(&cluster.url()).await;
    for name in lock_names_on_every_primary(&cluster) {
        let holder = holder_client.lock(&name).await.expect("holder");
        let granted = hand_over(holder, &holder_client, &waiter_client, LONG / 2).await;
        granted.release().await.expect("release");
        let node = cluster.slot_owner(lock_slot(&name)).expect("slot owner");
        assert!(
            waiter_client.grants_subscribed_at().contains(&node),
            "{name}: subscribed at {:?}, the slot is on {node}",
            waiter_client.grants_subscribed_at()
        );
    }
}

/// A slot migration drops sharded subscriptions silently: the waiters'
/// processes subscribe again on the new owner (heartbeat), and a grant that
/// reached nobody keeps its place until its waiter confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_order_across_a_slot_migration() {
    let mut cluster = RedisCluster::start().expect("cluster");
    let clients = [
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    ];
    let name = "migrating";
    let slot = lock_slot(name);
    let from = cluster.slot_owner(slot).expect("owner");
    let to = cluster.other_primary(&from).expect("another primary");
    waiters_survive(&mut cluster, &clients, name, 6, |cluster| {
        cluster.migrate_slot(slot, &to).expect("migrate");
    })
    .await;
    assert_eq!(cluster.slot_owner(slot).expect("owner"), to);
}

/// A call that meets a slot in migration after its keys left the source
/// (the source answers ASK) does not stop its client: the call itself
/// succeeds once the migration is done, the client answers again and its
/// waiter, heartbeaten on the same connection, is granted. fred 10.1 sends a command redirected by
/// ASK back to the source, and the third ASK ends the client's connection
/// task for good; a slot migration in CI did this to a waiter's process,
/// whose heartbeat then timed out for ever and whose waiter was never
/// granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_survives_an_ask_redirect_and_its_waiters_are_granted() {
    let cluster = RedisCluster::start().expect("cluster");
    let clients = [
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    ];
    let names = lock_names_on_every_primary(&cluster);
    let (waited, migrating) = (&names[0], &names[1]);
    let slot = lock_slot(migrating);
    let to = cluster
        .other_primary(&cluster.slot_owner(slot).expect("owner"))
        .expect("another primary");
    let holder = clients[0].lock(waited).await.expect("holder");
    let waiter = {
        let (client, name) = (clients[1].clone(), waited.clone());
        tokio::spawn(async move {
            let guard = client.lock(&name).await.expect("waiter");
            let token = guard.token();
            guard.release().await.expect("release");
            token
        })
    };
    wait_for_queue_len(&clients[0], waited, 1).await;

    // The lock has no keys on the source: it answers ASK, which fred 10.1
    // does not follow. The call is sent again until the migration is done
    // and then takes the free lock. The migration ends only once the
    // source has answered ASK (before, a 300 ms head start stood for this:
    // a call that ran after the migration never met the ASK).
    let from = cluster
        .begin_slot_migration(slot, &to)
        .expect("begin migration");
    let asked_before = answered(&cluster, &from, "ASK");
    let during = {
        let (client, name) = (clients[1].clone(), migrating.clone());
        tokio::spawn(async move { client.try_lock(&name).await })
    };
    until_answered(&cluster, &from, "ASK", asked_before + 1).await;
    cluster
        .finish_slot_migration(slot, &from, &to)
        .expect("finish migration");
    let guard = during
        .await
        .expect("task")
        .expect("a call that met the migration succeeds once it is done")
        .expect("nobody holds the lock");
    guard.release().await.expect("release");

    let guard = clients[1]
        .try_lock(migrating)
        .await
        .expect("the client answers after the migration")
        .expect("nobody holds the lock");
    guard.release().await.expect("release");
    let holder_token = holder.token();
    holder.release().await.expect("release");
    let token = tokio::time::timeout(LONG, waiter)
        .await
        .expect("the waiter is granted")
        .expect("task");
    assert!(token > holder_token);
}

/// A cluster, two clients, a lock name, its slot and a primary to migrate
/// that slot to.
async fn a_lock_to_migrate() -> (RedisCluster, [LockClient; 2], String, u16, String) {
    let cluster = RedisCluster::start().expect("cluster");
    let clients = [
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    ];
    let name = lock_names_on_every_primary(&cluster).remove(0);
    let slot = lock_slot(&name);
    let to = cluster
        .other_primary(&cluster.slot_owner(slot).expect("owner"))
        .expect("another primary");
    (cluster, clients, name, slot, to)
}

/// How many times the node at `addr` has answered with error `code`
/// (`ASK`, `TRYAGAIN`).
fn answered(cluster: &RedisCluster, addr: &str, code: &str) -> u64 {
    errors_answered(cluster.node(addr).expect("node"), code)
}

/// Waits (bounded) until the node at `addr` has answered `code` `count`
/// times in all.
async fn until_answered(cluster: &RedisCluster, addr: &str, code: &str, count: u64) {
    within(&format!("{addr} to answer {code} {count} times"), async {
        while answered(cluster, addr, code) < count {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Once the source `from` has answered `TRYAGAIN` `count` times in all
/// (the calls spawned before met the migration; bounded), moves the
/// slot's keys and ends the migration. Before, a 300 ms head start stood
/// for this: a call that ran after the migration never met it, and the
/// test passed without its case.
async fn finish_the_migration_once_met(
    cluster: &RedisCluster,
    slot: u16,
    from: &str,
    to: &str,
    count: u64,
) {
    until_answered(cluster, from, "TRYAGAIN", count).await;
    cluster
        .move_slot_keys(slot, from, to)
        .expect("move the lock's keys");
    cluster
        .finish_slot_migration(slot, from, to)
        .expect("finish migration");
}

/// A lock held with nobody queued has its owner and seq keys but no queue:
/// while its slot migrates and those keys are still on the source, the
/// source answers a call with all the lock's keys `TRYAGAIN` (Redis 7: some
/// keys there, some not), not `ASK`. fred 10.1 returns that as an error;
/// the release is sent again until the migration is done and frees the
/// lock. Before, it failed at once with that error and the lock stayed
/// held for its whole lease (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_meets_a_slot_migration_frees_the_lock() {
    let (cluster, clients, name, slot, to) = a_lock_to_migrate().await;
    // A fixed lease longer than the test: only the release frees the lock.
    let holder = clients[0]
        .lock_with(&name, LockOptions::new().lease(Duration::from_secs(60)))
        .await
        .expect("holder");
    let holder_token = holder.token();

    let from = cluster
        .begin_slot_migration(slot, &to)
        .expect("begin migration");
    let before = answered(&cluster, &from, "TRYAGAIN");
    let release = tokio::spawn(holder.release());
    finish_the_migration_once_met(&cluster, slot, &from, &to, before + 1).await;
    release
        .await
        .expect("task")
        .expect("a release that met the migration succeeds once it is done");

    let state = clients[1].inspect(&name).await.expect("inspect");
    assert_eq!(state.owner, None, "the lock is free: {state:?}");
    let guard = clients[1]
        .try_lock(&name)
        .await
        .expect("try_lock")
        .expect("nobody holds the lock");
    assert!(guard.token() > holder_token);
    guard.release().await.expect("release");
}

/// As above, for the calls that read a held lock or queue on it: the
/// holder's `is_held` and another client's `try_lock`, sent while the
/// lock's keys are still on the source, are answered `TRYAGAIN` and sent
/// again until the migration is done. Before, both failed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_a_held_lock_are_sent_again_across_a_slot_migration() {
    let (cluster, clients, name, slot, to) = a_lock_to_migrate().await;
    let holder = Arc::new(
        clients[0]
            .lock_with(&name, LockOptions::new().lease(Duration::from_secs(60)))
            .await
            .expect("holder"),
    );

    let from = cluster
        .begin_slot_migration(slot, &to)
        .expect("begin migration");
    let before = answered(&cluster, &from, "TRYAGAIN");
    let held = {
        let holder = Arc::clone(&holder);
        tokio::spawn(async move { holder.is_held().await })
    };
    let other = {
        let (client, name) = (clients[1].clone(), name.clone());
        tokio::spawn(async move { client.try_lock(&name).await })
    };
    // One TRYAGAIN per call (both are sent again every 50 ms: counts do
    // not tell whose an answer was, but both were spawned together).
    finish_the_migration_once_met(&cluster, slot, &from, &to, before + 2).await;
    let (held, other) = (held.await.expect("task"), other.await.expect("task"));
    assert!(
        matches!((&held, &other), (Ok(true), Ok(None))),
        "is_held and try_lock that met the migration succeed once it is done: \
         {held:?}, {other:?}"
    );

    let holder = Arc::try_unwrap(holder).expect("the only guard");
    holder.release().await.expect("release");
}

/// A primary fail-over mid-wait: the promoted replica has the queue (the
/// manual fail-over waits for it to catch up); waiters follow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_order_across_a_primary_failover() {
    let mut cluster = RedisCluster::start().expect("cluster");
    let clients = [
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    ];
    let name = "failing-over";
    let primary = cluster.slot_owner(lock_slot(name)).expect("owner");
    waiters_survive(&mut cluster, &clients, name, 6, |cluster| {
        cluster.failover(&primary).expect("failover");
    })
    .await;
}

/// A primary killed mid-wait (SIGKILL, no `CLUSTER FAILOVER`): its replica
/// is promoted by the cluster and has the queue (replicated before the
/// crash); the waiters, their grant connections refused and their calls
/// failing until the slot map moves, follow it and are granted in ticket
/// order with increasing tokens. The outage (the kit's 2 s node timeout
/// and the promotion) is shorter than the clients' 6 s waiter timeout, as
/// the README's promise needs: with a 1 s waiter timeout one process's
/// waiters were taken for dead and the other's, behind them, granted
/// first (the stated limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_order_across_a_primary_crash() {
    let mut cluster = RedisCluster::start().expect("cluster");
    let clients = crash_clients(&cluster.url()).await;
    let name = "crashing";
    let primary = cluster.slot_owner(lock_slot(name)).expect("owner");
    waiters_survive(&mut cluster, &clients, name, 6, |cluster| {
        cluster.kill_primary(&primary).expect("kill the primary");
    })
    .await;
}

/// The single-server core cases, on the cluster, each on a lock in another
/// primary's slots: a dead holder's lease runs out, a dead waiter is
/// skipped, killed sharded subscriptions lose no grant, a paused holder's
/// stale fenced write is refused, and the seckill swarm sells exactly its
/// stock both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_cases_hold_on_the_cluster() {
    let cluster = RedisCluster::start().expect("cluster");
    let clients = [
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    ];
    let names = lock_names_on_every_primary(&cluster);
    let owner_of = |name: &str| {
        let addr = cluster.slot_owner(lock_slot(name)).expect("slot owner");
        cluster.node(&addr).expect("node")
    };

    // Dead holder: its client is gone without a release; the lock frees
    // when the lease runs out and the next token is greater.
    let doomed = cluster_client(&cluster).await;
    let abandoned = doomed
        .lock_with(
            &names[0],
            LockOptions::new().lease(Duration::from_millis(500)),
        )
        .await
        .expect("lock");
    let abandoned_token = abandoned.token();
    std::mem::forget(abandoned);
    doomed.shutdown().await;
    let next = clients[0]
        .lock_with(&names[0], LockOptions::new().wait_timeout(LONG))
        .await
        .expect("granted after the abandoned lease");
    assert!(next.token() > abandoned_token);
    next.release().await.expect("release");

    // Dead waiter: a queue entry of a process that never heartbeats, ahead
    // of a live waiter, is skipped by the release.
    let holder = clients[0].lock(&names[1]).await.expect("holder");
    let dead_timings = Timings::new(300, 20_000, 600_000).expect("timings");
    let dead = Acquire {
        owner_id: "dead0000000000000000000000000000.0000000000000000.60000",
        mode: AcquireMode::Wait,
        timings: &dead_timings,
        channel_prefix: "test:nobody:",
        rejoin: None,
    };
    let queued = raw(owner_of(&names[1]), &names[1], &dead);
    assert!(matches!(queued, AcquireReply::Queued { .. }), "{queued:?}");
    let live = {
        let client = clients[1].clone();
        let name = names[1].clone();
        tokio::spawn(async move {
            client
                .lock_with(&name, LockOptions::new().wait_timeout(LONG))
                .await
                .map(|g| g.token())
        })
    };
    wait_for_queue_len(&clients[0], &names[1], 2).await;
    let holder_token = holder.token();
    holder.release().await.expect("release");
    let token = live
        .await
        .expect("task")
        .expect("the live waiter is granted");
    assert!(token > holder_token);
    let state = clients[0].inspect(&names[1]).await.expect("inspect");
    assert_eq!(state.queue_len, 0, "the dead waiter is gone");

    // Lost notifications: every sharded subscriber connection is killed
    // while waiters wait; every waiter is still granted, in ticket order.
    let holder = clients[0].lock(&names[2]).await.expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..8 {
        let (client, name, order) = (clients[i % 2].clone(), names[2].clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = client
                .lock_with(&name, LockOptions::new().wait_timeout(LONG))
                .await
                .expect("granted despite lost messages");
            order.lock().expect("order").push(guard.ticket());
            guard.release().await.expect("release");
        }));
    }
    wait_for_queue_len(&clients[0], &names[2], 8).await;
    let kill_subscribers = || {
        for node in cluster.nodes() {
            node.cmd_ok(&["CLIENT", "KILL", "TYPE", "pubsub"])
                .expect("CLIENT KILL");
        }
    };
    kill_subscribers();
    holder.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(20)).await;
    kill_subscribers();
    for waiter in waiters {
        tokio::time::timeout(LONG, waiter)
            .await
            .expect("every waiter is granted")
            .expect("task");
    }
    let order = order.lock().expect("order").clone();
    assert_eq!(order.len(), 8);
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");

    // Fencing: a holder paused past its fixed lease writes after a newer
    // holder did; the cluster node refuses it.
    let (fence, value) = ("{stock:c}:fence", "{stock:c}:value");
    let paused = clients[0]
        .lock_with(
            "stock:c",
            LockOptions::new().lease(Duration::from_millis(300)),
        )
        .await
        .expect("first holder");
    clients[0]
        .fenced_write(fence, value, paused.token(), FencedOp::set("first"))
        .await
        .expect("a fresh token writes");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let newer = clients[1].lock("stock:c").await.expect("newer holder");
    assert!(newer.token() > paused.token());
    clients[1]
        .fenced_write(fence, value, newer.token(), FencedOp::set("second"))
        .await
        .expect("newer write");
    let refused = clients[0]
        .fenced_write(fence, value, paused.token(), FencedOp::set("stale"))
        .await;
    assert!(
        matches!(refused, Err(Error::StaleToken { .. })),
        "{refused:?}"
    );
    let read = clients[1]
        .fenced_write(fence, value, newer.token(), FencedOp::Get)
        .await
        .expect("read");
    assert_eq!(read, Reply::Str("second".to_owned()));
    newer.release().await.expect("release");

    // The seckill swarm, both ways, through a cluster URL.
    let config = SwarmConfig {
        stock: 50,
        attempts: 120,
        clients: 2,
        workers: 12,
        wait_timeout: Duration::from_secs(60),
        ..SwarmConfig::default()
    };
    for variant in Variant::ALL {
        let report = swarm::run(&cluster.url(), &config, variant)
            .await
            .expect("swarm run");
        assert_swarm_passed(&report);
        assert_eq!(report.sold, 50, "{variant:?}");
        assert_eq!(report.final_stock, Some(0), "{variant:?}");
    }
}

/// After a lock's slot moves to another primary, the next grant reaches a
/// waiter of another process on fairlock's own connection to the slot's
/// new node, with the heartbeat (the fallback) a minute away; so does the
/// grant after that node cut the process's pub/sub connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_slot_migration_grants_come_from_the_new_node() {
    let cluster = RedisCluster::start().expect("cluster");
    let holder_client = pubsub_only_client(&cluster.url()).await;
    let waiter_client = pubsub_only_client(&cluster.url()).await;
    let name = lock_names_on_every_primary(&cluster).remove(0);
    let slot = lock_slot(&name);
    let holder = holder_client.lock(&name).await.expect("holder");
    let granted = hand_over(holder, &holder_client, &waiter_client, LONG / 2).await;
    granted.release().await.expect("release");

    let from = cluster.slot_owner(slot).expect("slot owner");
    let to = cluster.other_primary(&from).expect("another primary");
    cluster.migrate_slot(slot, &to).expect("slot migration");
    let holder = tokio::time::timeout(LONG, holder_client.lock(&name))
        .await
        .expect("lock after the migration")
        .expect("holder");
    let granted = hand_over(holder, &holder_client, &waiter_client, LONG / 2).await;
    granted.release().await.expect("release");
    assert!(
        waiter_client.grants_subscribed_at().contains(&to),
        "subscribed at {:?}, the slot is on {to}",
        waiter_client.grants_subscribed_at()
    );

    // The node cuts the pub/sub connections while nobody waits: the next
    // waiter opens one again and subscribes before it enqueues.
    cluster
        .node(&to)
        .expect("node")
        .cmd_ok(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .expect("kill the pub/sub connections");
    let deadline = std::time::Instant::now() + LONG;
    while waiter_client.grants_subscribed_at().contains(&to) {
        assert!(std::time::Instant::now() < deadline, "the cut is noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let holder = holder_client.lock(&name).await.expect("holder");
    let granted = hand_over(holder, &holder_client, &waiter_client, LONG / 2).await;
    granted.release().await.expect("release");
    assert!(waiter_client.grants_subscribed_at().contains(&to));
}

/// After a `CLUSTER FAILOVER`, a waiter whose slot map still names the
/// demoted primary subscribes the slot there (a replica now, which still
/// hears the slot's messages) and queues on the new primary, where the
/// grant is published to nobody: counted unheard, its lease was cut to the
/// releasing process's waiter TTL (1 s here) while the waiter, which heard
/// it, took it for its full 60 s. The waiter now notices after its acquire
/// call that its grants are heard elsewhere than they are published:
/// it subscribes where the slot is at once, and sets its own lease if
/// granted before that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_manual_failover_a_grant_keeps_the_waiters_own_lease() {
    let cluster = RedisCluster::start().expect("cluster");
    let holder_client = cluster_client(&cluster).await;
    // A heartbeat a minute away: no round tidies up in between.
    let waiter_client = pubsub_only_client(&cluster.url()).await;
    let name = lock_names_on_every_primary(&cluster).remove(0);
    let slot = lock_slot(&name);
    // The waiter's slot map and subscription name the first primary.
    waiter_client
        .lock(&name)
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    let primary = cluster.slot_owner(slot).expect("owner");
    let promoted = cluster.failover(&primary).expect("failover");

    let holder = holder_client.lock(&name).await.expect("holder");
    let waiter = queue_for_a_minute(&holder_client, &waiter_client, &name).await;
    holder.release().await.expect("release");
    assert_keeps_its_minute(&cluster, &promoted, &name, waiter).await;
}

/// A waiter of `waiter_client` asks for `name` with a 60 s lease; returns
/// once it is queued (seen through `holder_client`).
async fn queue_for_a_minute(
    holder_client: &LockClient,
    waiter_client: &LockClient,
    name: &str,
) -> tokio::task::JoinHandle<fairlock::Result<fairlock::LockGuard>> {
    let waiter = {
        let (waiter_client, name) = (waiter_client.clone(), name.to_owned());
        tokio::spawn(async move {
            waiter_client
                .lock_with(&name, LockOptions::new().lease(Duration::from_secs(60)))
                .await
        })
    };
    wait_for_queue_len(holder_client, name, 1).await;
    waiter
}

/// The waiter is granted, and the lease of its grant on `node` is its own
/// 60 s, not a waiter TTL.
async fn assert_keeps_its_minute(
    cluster: &RedisCluster,
    node: &str,
    name: &str,
    waiter: tokio::task::JoinHandle<fairlock::Result<fairlock::LockGuard>>,
) {
    let granted = tokio::time::timeout(LONG, waiter)
        .await
        .expect("granted")
        .expect("task")
        .expect("lock");
    let owner_key = fairlock_tests::keys(name).owner().to_owned();
    let left = cluster
        .node(node)
        .expect("node")
        .cmd_ok(&["PTTL", &owner_key])
        .expect("PTTL")
        .as_int()
        .expect("int");
    // Above halfway between the 60 s asked and the releasing client's 1 s
    // waiter TTL, the lease this rules out: a loaded machine may take
    // seconds from the grant to this read.
    assert!(left > 32_500, "the grant's lease is {left} ms, asked 60 s");
    granted.release().await.expect("release");
}

/// A waiter already queued at a `CLUSTER FAILOVER`: the demoted primary
/// ends the process's sharded subscription (`sunsubscribe`) and the
/// process subscribes the slot again at once, at the node its slot map
/// names. That map, fred's, was still the one from before the fail-over:
/// the subscription went back to the demoted primary (a replica, which
/// still hears the slot's messages), the new primary's grant was counted
/// unheard and its lease cut to the releasing process's waiter TTL, while
/// the waiter took it for its own 60 s [the lease in Redis was ≤ 1 s].
/// The map is now refreshed before subscribing again after a
/// `sunsubscribe`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_queued_before_a_manual_failover_keeps_its_own_lease() {
    let cluster = RedisCluster::start().expect("cluster");
    let holder_client = cluster_client(&cluster).await;
    // A heartbeat a minute away: only the subscription's end can move it.
    let waiter_client = pubsub_only_client(&cluster.url()).await;
    let name = lock_names_on_every_primary(&cluster).remove(0);
    let slot = lock_slot(&name);
    let holder = holder_client.lock(&name).await.expect("holder");
    let waiter = queue_for_a_minute(&holder_client, &waiter_client, &name).await;
    let primary = cluster.slot_owner(slot).expect("owner");
    let promoted = cluster.failover(&primary).expect("failover");
    // Until the waiter's process has subscribed the slot again somewhere
    // other than where it first did (a set-up wait, not a measure).
    let deadline = std::time::Instant::now() + LONG;
    while !waiter_client
        .grants_subscribed_at()
        .iter()
        .any(|at| *at != primary)
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    holder.release().await.expect("release");
    assert_keeps_its_minute(&cluster, &promoted, &name, waiter).await;
}

/// A node that stops answering holds up the heartbeat of its own slots
/// only. Here one primary pauses its clients' writes (`CLIENT PAUSE`) for
/// longer than the waiter timeout while a process waits on a lock there
/// and on a lock of another primary: the heartbeat keeps the waiter on the
/// healthy primary alive, so it keeps its place ahead of a later waiter of
/// another process. Before, a heartbeat round waited for all of its calls,
/// the paused node's call held every slot's next round back, and the
/// healthy waiter was skipped as dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stops_answering_holds_up_only_its_own_slots_heartbeat() {
    let cluster = RedisCluster::start().expect("cluster");
    let names = lock_names_on_every_primary(&cluster);
    let (healthy, paused) = (names[0].clone(), names[1].clone());
    let paused_node = cluster.slot_owner(lock_slot(&paused)).expect("slot owner");
    let holder = cluster_client(&cluster).await;
    // A waiter timeout of 2 s: a stall of this loaded machine alone must
    // not take the first waiter for dead.
    let patient = || async {
        let mut config = fairlock::ClientConfig::new(cluster.url());
        config.heartbeat_interval = Duration::from_millis(100);
        config.waiter_timeout = Duration::from_secs(2);
        LockClient::with_config(config).await.expect("client")
    };
    let first = patient().await;
    let later = patient().await;
    let held_healthy = holder.lock(&healthy).await.expect("holder");
    let held_paused = holder.lock(&paused).await.expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let wait = |client: &LockClient, name: &str, who: &'static str| {
        let (client, name, order) = (client.clone(), name.to_owned(), Arc::clone(&order));
        tokio::spawn(async move {
            let guard = client.lock(&name).await.expect("waiter");
            order.lock().expect("order").push(who);
            guard.release().await.expect("release");
        })
    };
    let first_on_paused = wait(&first, &paused, "first, on the paused node");
    wait_for_queue_len(&holder, &paused, 1).await;
    let first_on_healthy = wait(&first, &healthy, "first");
    wait_for_queue_len(&holder, &healthy, 1).await;
    let later_on_healthy = wait(&later, &healthy, "later");
    wait_for_queue_len(&holder, &healthy, 2).await;

    // Over two waiter timeouts (2 s each) of paused writes: heartbeat
    // scripts on that node wait until the pause ends.
    cluster
        .node(&paused_node)
        .expect("node")
        .cmd_ok(&["CLIENT", "PAUSE", "7000", "WRITE"])
        .expect("CLIENT PAUSE");
    tokio::time::sleep(Duration::from_secs(5)).await;
    held_healthy.release().await.expect("release");
    for task in [first_on_healthy, later_on_healthy] {
        tokio::time::timeout(LONG, task)
            .await
            .expect("granted")
            .expect("task");
    }
    assert_eq!(
        *order.lock().expect("order"),
        ["first", "later"],
        "the first waiter was kept alive and keeps its place"
    );
    drop(held_paused);
    tokio::time::timeout(LONG, first_on_paused)
        .await
        .expect("granted after the pause")
        .expect("task");
}

/// `rejected_connections` of a node's `INFO stats`.
fn rejected_connections(node: &fairlock_testkit::RedisServer) -> u64 {
    let info = node.cmd_ok(&["INFO", "stats"]).expect("INFO stats");
    info.as_str()
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("rejected_connections:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("rejected_connections in INFO stats")
}

/// A node that accepts connections and closes them at once (here: its
/// `maxclients` is reached, so it answers each new connection with an
/// error and closes it) is reconnected to with a backoff, 50 ms doubling
/// to 2 s, not in a loop of heartbeat rounds; once it takes connections
/// again, the waiter's grant comes as before. Before, each lost connection
/// asked for a heartbeat round at once, which opened the next connection
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_closes_every_connection_is_reconnected_with_a_backoff() {
    let cluster = RedisCluster::start().expect("cluster");
    let name = lock_names_on_every_primary(&cluster).remove(0);
    let address = cluster.slot_owner(lock_slot(&name)).expect("slot owner");
    let node = cluster.node(&address).expect("node");
    let holder_client = cluster_client(&cluster).await;
    let waiter_client = cluster_client(&cluster).await;
    let holder = holder_client.lock(&name).await.expect("holder");
    let waiter = {
        let (client, name) = (waiter_client.clone(), name.clone());
        tokio::spawn(async move { client.lock(&name).await })
    };
    wait_for_queue_len(&holder_client, &name, 1).await;

    // No room for one more connection once the sharded subscribers are
    // gone; the test kit's admin connection stays.
    let list = node.cmd_ok(&["CLIENT", "LIST"]).expect("CLIENT LIST");
    let lines: Vec<&str> = list.as_str().unwrap_or_default().lines().collect();
    let subscribers = lines
        .iter()
        .filter(|line| line.contains(" ssub=") && !line.contains(" ssub=0 "))
        .count();
    assert!(
        subscribers > 0,
        "the waiter's client subscribed on {address}"
    );
    let limit = (lines.len() - subscribers).to_string();
    let maxclients = fairlock_tests::config_value(node, "maxclients");
    node.cmd_ok(&["CONFIG", "SET", "maxclients", &limit])
        .expect("maxclients");
    node.cmd_ok(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .expect("kill the subscribers");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rejected_connections(node);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rejected = rejected_connections(node) - before;
    node.cmd_ok(&["CONFIG", "SET", "maxclients", &maxclients])
        .expect("maxclients");
    // With the backoff at 2 s by then: 2 or 3 attempts per client in 3 s.
    assert!(
        rejected <= 12,
        "{rejected} connections refused in 3 s: reconnected without a backoff"
    );
    holder.release().await.expect("release");
    let granted = tokio::time::timeout(LONG, waiter)
        .await
        .expect("granted once the node takes connections again")
        .expect("task")
        .expect("granted");
    granted.release().await.expect("release");
}

/// fairlock's connection to a node that stops answering while nobody
/// waits there (here the node pauses all its clients, as a stalled
/// process or a cut network would look) is noticed by a keep-alive PING
/// unanswered for the command timeout and closed; once the node answers
/// again, the next waiter there opens a new one and is granted by it.
/// Before, a connection was only checked by the subscriptions sent on it,
/// so an idle one stayed open, dead, until the client shut down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_to_a_silent_node_is_noticed_and_closed() {
    let cluster = RedisCluster::start().expect("cluster");
    let name = lock_names_on_every_primary(&cluster).remove(0);
    let address = cluster.slot_owner(lock_slot(&name)).expect("slot owner");
    let holder_client = cluster_client(&cluster).await;
    let mut config = fairlock::ClientConfig::new(cluster.url());
    config.heartbeat_interval = Duration::from_millis(100);
    config.waiter_timeout = Duration::from_secs(2);
    config.command_timeout = Duration::from_secs(1);
    let waiter_client = LockClient::with_config(config).await.expect("client");
    let holder = holder_client.lock(&name).await.expect("holder");
    let granted = hand_over(holder, &holder_client, &waiter_client, LONG / 2).await;
    granted.release().await.expect("release");
    assert!(waiter_client.grants_subscribed_at().contains(&address));

    let node = cluster.node(&address).expect("node");
    node.cmd_ok(&["CLIENT", "PAUSE", "6000", "ALL"])
        .expect("CLIENT PAUSE");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while waiter_client.grants_subscribed_at().contains(&address) {
        assert!(
            std::time::Instant::now() < deadline,
            "the connection to the silent node {address} is still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.cmd_ok(&["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    let holder = holder_client.lock(&name).await.expect("holder");
    let granted = hand_over(holder, &holder_client, &waiter_client, LONG / 2).await;
    granted.release().await.expect("release");
    assert!(waiter_client.grants_subscribed_at().contains(&address));
}

/// On a cluster, an ACL user that may subscribe to the sharded grant
/// channels but not `SPUBLISH` on them is refused at connect with
/// `NoPermission` naming the command: the cluster's twin of
/// `fuzz_and_bad_input.rs::an_acl_user_that_cannot_publish_grants_is_refused_at_connect`
/// (a release handing the lock to another process publishes inside the
/// script, after the handoff's writes). The same user with `SPUBLISH`
/// connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_that_cannot_spublish_grants_is_refused_at_connect() {
    let cluster = RedisCluster::start().expect("cluster");
    let with_user = |rule: &str| {
        for node in cluster.nodes() {
            node.cmd_ok(&[
                "ACL", "SETUSER", "limited", "reset", "on", ">pw", "~*", "&*", "+@all", rule,
            ])
            .expect("ACL SETUSER");
        }
        let mut config = ClientConfig::new(cluster.url().replacen(
            "redis-cluster://",
            "redis-cluster://limited:pw@",
            1,
        ));
        config.connect_timeout = LONG / 4;
        config
    };
    let refused = within(
        "a connect without SPUBLISH",
        LockClient::with_config(with_user("-spublish")),
    )
    .await;
    match refused {
        Err(error @ Error::NoPermission(_)) => {
            assert!(error.to_string().contains("SPUBLISH"), "{error}")
        }
        other => panic!("a user without SPUBLISH: {:?}", other.map(|_| "connected")),
    }
    let allowed = within(
        "a connect with SPUBLISH",
        LockClient::with_config(with_user("+spublish")),
    )
    .await
    .expect("the same user with SPUBLISH connects");
    let guard = allowed.lock("acl-cluster").await.expect("lock");
    guard.release().await.expect("release");
}

/// On a cluster the eviction check reads every primary's
/// `maxmemory-policy`, and `replica_acks` is refused: a keyless `CONFIG
/// GET` or `WAIT` goes to one arbitrary primary, so the check passed a
/// cluster whose other primaries may evict lock keys, and a `WAIT` vouched
/// for writes made on another node (before, each primary set to
/// `allkeys-lru` in turn was caught only when it happened to be the one
/// asked, and `replica_acks` connected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primary_is_checked_and_replica_acks_are_refused() {
    let cluster = RedisCluster::start().expect("cluster");
    let checked = || {
        ClientConfig::builder(cluster.url())
            .eviction_check(fairlock::EvictionCheck::Fail)
            .build()
            .expect("config")
    };
    for primary in cluster.primaries().expect("primaries") {
        let node = cluster.node(&primary).expect("node");
        node.cmd_ok(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
            .expect("CONFIG SET");
        match LockClient::with_config(checked()).await {
            Err(Error::UnsafeServer(warning)) => assert!(
                warning.contains(&primary) && warning.contains("allkeys-lru"),
                "{warning}"
            ),
            Ok(_) => panic!("a cluster whose primary {primary} evicts keys passed the check"),
            Err(other) => panic!("{other:?}"),
        }
        node.cmd_ok(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
            .expect("CONFIG SET");
    }
    LockClient::with_config(checked())
        .await
        .expect("every primary safe")
        .shutdown()
        .await;
    let acked = ClientConfig::builder(cluster.url())
        .replica_acks(1, Duration::from_millis(500))
        .build()
        .expect("config");
    match LockClient::with_config(acked).await {
        Err(Error::InvalidOptions(why)) => assert!(why.contains("replica_acks"), "{why}"),
        Ok(_) => panic!("replica_acks accepted on a cluster"),
        Err(other) => panic!("{other:?}"),
    }
}

/// A client logged in on every node as the ACL user `limited` (password
/// `pw`), made for it; its password can then be changed on a node to
/// keep the process from opening a new connection there, while the
/// connections already logged in go on working.
async fn limited_user_client(cluster: &RedisCluster) -> LockClient {
    for node in cluster.nodes() {
        node.cmd_ok(&[
            "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all",
        ])
        .expect("ACL SETUSER");
    }
    cluster_client_at(
        cluster
            .url()
            .replacen("redis-cluster://", "redis-cluster://limited:pw@", 1),
    )
    .await
}

/// A slot's waiter heartbeat does not wait for the renewal of the
/// process's sharded subscription there. When the grant connection to a
/// node cannot be opened again (here the client's password was changed on
/// that node: the command connections, logged in already, keep working),
/// each renewal tries until the command timeout; the heartbeat calls, on
/// the working connections, must go on every interval, or the process's
/// waiters there are taken for dead and passed over. Before, the slot's
/// heartbeat waited for the renewal (5 s a round against a 1 s waiter
/// timeout) and the later caller of another process was granted first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slots_heartbeat_goes_on_while_its_subscription_cannot_be_renewed() {
    let cluster = RedisCluster::start().expect("cluster");
    let name = lock_names_on_every_primary(&cluster)
        .into_iter()
        .next()
        .expect("a name");
    let node = cluster
        .slot_owner(lock_slot(&name))
        .expect("the slot's primary");
    let holder = cluster_client(&cluster).await;
    let other = cluster_client(&cluster).await;
    let limited = limited_user_client(&cluster).await;
    let held = holder.lock(&name).await.expect("lock");
    let order = Arc::new(Mutex::new(Vec::new()));
    let queue = |client: &LockClient, who: &'static str| {
        let (client, name, order) = (client.clone(), name.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let guard = client.lock(&name).await.expect("granted");
            order.lock().expect("order").push(who);
            guard.release().await.expect("release");
        })
    };
    let first = queue(&limited, "first");
    wait_for_queue_len(&holder, &name, 1).await;
    let second = queue(&other, "second");
    wait_for_queue_len(&holder, &name, 2).await;
    // The first waiter's process can no longer log in to the node: its
    // grant connection there, cut, cannot be opened again.
    let primary = cluster.node(&node).expect("node");
    primary
        .cmd_ok(&["ACL", "SETUSER", "limited", "resetpass", ">other"])
        .expect("ACL SETUSER");
    primary
        .cmd_ok(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .expect("CLIENT KILL");
    // Three waiter timeouts: a heartbeat held up by the renewal lets the
    // first waiter's entry run out.
    tokio::time::sleep(Duration::from_secs(3)).await;
    held.release().await.expect("release");
    for task in [first, second] {
        within("the waiters", task).await.expect("task");
    }
    assert_eq!(*order.lock().expect("order"), ["first", "second"]);
    limited.shutdown().await;
}

/// A try that never waits needs no grant message, so it subscribes
/// nothing: it answers even while the slot's node refuses the process a
/// new connection (its password changed after the command connections
/// logged in). It used to subscribe the slot first and fail with
/// `Error::Timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_that_never_waits_answers_while_no_grant_connection_can_be_opened() {
    let cluster = RedisCluster::start().expect("cluster");
    let limited = limited_user_client(&cluster).await;
    let other = cluster_client(&cluster).await;
    for node in cluster.nodes() {
        node.cmd_ok(&["ACL", "SETUSER", "limited", "resetpass", ">other"])
            .expect("ACL SETUSER");
    }
    for name in lock_names_on_every_primary(&cluster) {
        let guard = within("a free lock's try", limited.try_lock(&name))
            .await
            .expect("try_lock")
            .expect("a free lock is taken");
        let busy = within("a held lock's try", other.try_lock(&name))
            .await
            .expect("try_lock");
        assert!(busy.is_none(), "{name} is held");
        let again = within(
            "a held lock's try by its holder's process",
            limited.try_lock(&name),
        )
        .await
        .expect("try_lock");
        assert!(again.is_none(), "{name} is held by the same process");
        guard.release().await.expect("release");
    }
    assert!(
        limited.grants_subscribed_at().is_empty(),
        "a try subscribed {:?}",
        limited.grants_subscribed_at()
    );
    limited.shutdown().await;
}
