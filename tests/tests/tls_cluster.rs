//! fairlock on a Redis Cluster over TLS (`rediss-cluster://`, the `tls`
//! feature): every node listens for TLS with a certificate authority made
//! for the test, and runs `tls-cluster yes`, so clients connected over TLS
//! are sent the nodes' TLS ports. One test in this binary: it sets
//! `SSL_CERT_FILE`, which the TLS setup of every client in the process
//! reads.

use std::time::Duration;

use fairlock::LockClient;
use fairlock_testkit::{RedisCluster, TlsFiles};
use fairlock_tests::{
    cluster_client_at, crash_clients, hand_over, lock_names_on_every_primary, lock_slot,
    pubsub_only_client, waiters_survive,
};

/// A grant reaches a waiter of a [`pubsub_only_client`] within this bound
/// only on a pub/sub connection. Not a speed assertion.
const HEARD: Duration = Duration::from_secs(20);

/// The TLS address of the node serving `name`'s slot.
fn tls_owner(cluster: &RedisCluster, name: &str) -> String {
    let owner = cluster.slot_owner(lock_slot(name)).expect("slot owner");
    cluster
        .node(&owner)
        .expect("owner node")
        .tls_addr()
        .expect("a TLS port")
}

/// Locks on every primary hand over between two clients over TLS, each
/// grant arriving on fairlock's own TLS connection to the node serving
/// the lock's slot; after a slot moves to another primary the waiter's
/// subscription follows it there, over TLS too; and waiters queued over
/// TLS across a primary's fail-over, and then across another primary's
/// crash (SIGKILL), follow the promoted replica and are granted in ticket
/// order with increasing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_come_over_tls_from_each_slots_node() {
    let files = TlsFiles::generate().expect("a CA and a server certificate");
    let mut cluster = RedisCluster::start_tls(&files).expect("cluster with TLS");
    let url = cluster.tls_url().expect("TLS ports");
    // The only test of this binary, before any client exists.
    files.trust();
    let holder_client = pubsub_only_client(&url).await;
    let waiter_client = pubsub_only_client(&url).await;

    let names = lock_names_on_every_primary(&cluster);
    for name in &names {
        let holder = holder_client.lock(name).await.expect("lock over TLS");
        let granted = hand_over(holder, &holder_client, &waiter_client, HEARD).await;
        granted.release().await.expect("release");
        let node = tls_owner(&cluster, name);
        assert!(
            waiter_client.grants_subscribed_at().contains(&node),
            "{name}: subscribed at {:?}, the slot is on {node}",
            waiter_client.grants_subscribed_at()
        );
    }

    // Move the first lock's slot to the next primary: the next grant comes
    // from there.
    let name = &names[0];
    let slot = lock_slot(name);
    let from = cluster.slot_owner(slot).expect("slot owner");
    let to = cluster.other_primary(&from).expect("another primary");
    cluster.migrate_slot(slot, &to).expect("slot migration");
    let holder = tokio::time::timeout(HEARD, holder_client.lock(name))
        .await
        .expect("lock after the migration")
        .expect("holder");
    let granted = hand_over(holder, &holder_client, &waiter_client, HEARD).await;
    granted.release().await.expect("release");
    let node = tls_owner(&cluster, name);
    assert_eq!(to, cluster.slot_owner(slot).expect("slot owner"));
    assert!(
        waiter_client.grants_subscribed_at().contains(&node),
        "after the migration: subscribed at {:?}, the slot is on {node}",
        waiter_client.grants_subscribed_at()
    );
    holder_client.shutdown().await;
    waiter_client.shutdown().await;

    // A manual fail-over of another lock's primary while waiters of two
    // clients (fast test timings) are queued over TLS.
    let clients = [
        cluster_client_at(url.clone()).await,
        cluster_client_at(url.clone()).await,
    ];
    waiters_follow_the_slot(&mut cluster, clients, &names[1], |cluster, primary| {
        cluster.failover(primary).expect("fail-over");
    })
    .await;

    // A third lock's primary killed (SIGKILL, no `CLUSTER FAILOVER`) while
    // waiters of two clients are queued over TLS: their TLS connections to
    // it are refused until the slot map names the promoted replica.
    let clients = crash_clients(&url).await;
    waiters_follow_the_slot(&mut cluster, clients, &names[2], |cluster, primary| {
        cluster.kill_primary(primary).expect("kill the primary");
    })
    .await;
}

/// Waiters of `clients` queued on lock `name` across `disturb` of the
/// primary serving its slot (see [`waiters_survive`]); the slot ends on
/// another node. The clients are shut down.
async fn waiters_follow_the_slot(
    cluster: &mut RedisCluster,
    clients: [LockClient; 2],
    name: &str,
    disturb: impl FnOnce(&mut RedisCluster, &str),
) {
    let primary = cluster.slot_owner(lock_slot(name)).expect("slot owner");
    waiters_survive(cluster, &clients, name, 6, |cluster| {
        disturb(cluster, &primary)
    })
    .await;
    assert_ne!(
        cluster.slot_owner(lock_slot(name)).expect("slot owner"),
        primary,
        "the replica took the slot over"
    );
    for client in clients {
        client.shutdown().await;
    }
}
