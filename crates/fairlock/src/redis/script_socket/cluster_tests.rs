//! The script sockets on a Redis Cluster, against a real local cluster: a
//! lock's calls go on the sockets of the node serving its slot, and a call
//! that a migration redirects goes through fred and succeeds, the lock's
//! next calls going on sockets of the new node.

use std::time::Duration;

use fairlock_core::{KeyPrefix, LockKeys, LockName};
use fairlock_testkit::RedisCluster;

/// The slot of lock `name`'s keys.
fn slot_of(name: &str) -> u16 {
    LockKeys::new(
        &KeyPrefix::default(),
        &LockName::new(name).expect("a valid lock name"),
    )
    .slot()
}

/// A lock name served by each primary of `cluster`, with that primary.
fn a_name_per_primary(cluster: &RedisCluster) -> Vec<(String, String)> {
    let primaries = cluster.primaries().expect("primaries");
    primaries
        .into_iter()
        .map(|primary| {
            let name = (0..)
                .map(|i| format!("socket:{i}"))
                .find(|name| cluster.slot_owner(slot_of(name)).expect("owner") == primary)
                .expect("a name in every primary's slots");
            (name, primary)
        })
        .collect()
}

async fn client_of(cluster: &RedisCluster) -> crate::LockClient {
    let mut config = crate::ClientConfig::new(cluster.url());
    config.heartbeat_interval = Duration::from_millis(100);
    config.waiter_timeout = Duration::from_secs(3);
    config.watchdog_lease = Duration::from_secs(3);
    crate::LockClient::with_config(config)
        .await
        .expect("client")
}

/// Locks and releases `name` twice (the first cycle finds the scripts
/// missing on the node: fred's path loads them), tokens increasing.
async fn two_cycles(client: &crate::LockClient, name: &str) {
    let first = client.lock(name).await.expect("lock");
    let token = first.token();
    first.release().await.expect("release");
    let second = client.lock(name).await.expect("lock again");
    assert!(second.token() > token, "tokens increase");
    second.release().await.expect("release again");
}

/// On a cluster each lock's acquire and release go on a pair of script
/// sockets of the node serving its slot: one pair per primary used, both
/// lanes connected there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_lock_goes_on_the_sockets_of_its_slots_node() {
    let cluster = RedisCluster::start().expect("cluster");
    let client = client_of(&cluster).await;
    let names = a_name_per_primary(&cluster);
    for (name, _) in &names {
        two_cycles(&client, name).await;
    }
    let mut sockets = client.state().redis.node_sockets_at();
    sockets.sort();
    let mut want: Vec<(String, [Option<String>; 2])> = names
        .iter()
        .map(|(_, primary)| {
            (
                primary.clone(),
                [Some(primary.clone()), Some(primary.clone())],
            )
        })
        .collect();
    want.sort();
    assert_eq!(sockets, want, "a pair of sockets on every primary used");
    client.shutdown().await;
}

/// A slot in migration whose keys have left the source: the socket's call
/// on the source is answered `ASK` (nothing ran there), goes through fred,
/// which sends it again until the migration is done, and succeeds; the
/// lock's next calls go on sockets of the new node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_call_redirected_by_a_migration_goes_through_fred() {
    let cluster = RedisCluster::start().expect("cluster");
    let client = client_of(&cluster).await;
    let (name, from) = a_name_per_primary(&cluster).remove(0);
    two_cycles(&client, &name).await;
    let slot = slot_of(&name);
    let to = cluster.other_primary(&from).expect("another primary");
    cluster.begin_slot_migration(slot, &to).expect("begin");
    cluster.move_slot_keys(slot, &from, &to).expect("move keys");
    assert_eq!(
        client.state().redis.node_of_slot(slot),
        Some(from.clone()),
        "the slot is still the source's: the call goes on its sockets"
    );
    let during = {
        let (client, name) = (client.clone(), name.clone());
        tokio::spawn(async move { client.lock(&name).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster
        .finish_slot_migration(slot, &from, &to)
        .expect("finish migration");
    let guard = during
        .await
        .expect("task")
        .expect("the call that met ASK succeeds once the migration is done");
    guard.release().await.expect("release");

    two_cycles(&client, &name).await;
    let sockets = client.state().redis.node_sockets_at();
    assert!(
        sockets.contains(&(to.clone(), [Some(to.clone()), Some(to.clone())])),
        "the lock's calls went on to sockets of {to}: {sockets:?}"
    );
    client.shutdown().await;
}
