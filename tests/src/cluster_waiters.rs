//! Waiters across a disturbance of a Redis Cluster (a slot migration, a
//! fail-over, a crash), shared by the plain and the TLS cluster tests.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fairlock::{ClientConfig, LockClient};
use fairlock_testkit::RedisCluster;

use crate::{keys, lock_slot};

/// Hang guard for each waiter.
const LONG: Duration = Duration::from_secs(30);

/// Two clients of the cluster at `url` for a primary's crash (SIGKILL,
/// no `CLUSTER FAILOVER`): the outage (the kit's 2 s node timeout and the
/// promotion) must stay shorter than their 6 s waiter timeout, as the
/// README's promise needs (with a 1 s one, one process's waiters were
/// taken for dead and the other's, behind them, granted first: the stated
/// limit), and the holder's 40 s lease must outlast it and the kit's 30 s
/// wait for the cluster to settle (the fast clients' 3 s watchdog lease
/// would make the release answer `NotOwner`).
pub async fn crash_clients(url: &str) -> [LockClient; 2] {
    let config = || {
        let mut config = ClientConfig::new(url);
        config.heartbeat_interval = Duration::from_millis(200);
        config.waiter_timeout = Duration::from_secs(6);
        config.watchdog_lease = Duration::from_secs(40);
        config
    };
    [
        LockClient::with_config(config()).await.expect("connect"),
        LockClient::with_config(config()).await.expect("connect"),
    ]
}

/// Holds lock `name` on `clients[0]`, queues `n` waiters over both clients
/// one after the other, runs `disturb` on the cluster, releases, and checks
/// that every waiter is granted, in ticket order, with increasing tokens.
pub async fn waiters_survive(
    cluster: &mut RedisCluster,
    clients: &[LockClient; 2],
    name: &str,
    n: usize,
    disturb: impl FnOnce(&mut RedisCluster),
) {
    let holder = clients[0].lock(name).await.expect("holder");
    let held_since = std::time::Instant::now();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..n {
        let client = clients[i % 2].clone();
        let name = name.to_owned();
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let guard = client.lock(&name).await.expect("waiter");
            order
                .lock()
                .expect("order")
                .push((guard.ticket(), guard.token().value()));
            guard.release().await.expect("release");
        }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let disturbed = std::time::Instant::now();
    disturb(cluster);
    let outage = disturbed.elapsed();
    if let Err(error) = holder.release().await {
        // What the slot's primary holds now, to tell a lost write (no
        // owner key), a lease run out, and a release that ran twice (the
        // holder's id in the record of releases) apart.
        let keys = keys(name);
        let state = cluster
            .slot_owner(lock_slot(name))
            .and_then(|node| {
                let node = cluster.node(&node)?;
                let get = |key: &str| node.cmd(&["GET", key]);
                Ok(format!(
                    "on {}: owner {:?}, pttl {:?}, freed {:?}, queue {:?}",
                    node.addr(),
                    get(keys.owner())?,
                    node.cmd(&["PTTL", keys.owner()])?,
                    get(keys.freed())?,
                    node.cmd(&["ZRANGE", keys.queue(), "0", "-1", "WITHSCORES"])?,
                ))
            })
            .unwrap_or_else(|e| format!("unreadable: {e}"));
        panic!(
            "release after a disturbance of {outage:?} (held {:?}): {error:?}; {state}",
            held_since.elapsed()
        );
    }
    for waiter in waiters {
        tokio::time::timeout(LONG, waiter)
            .await
            .expect("every waiter is granted")
            .expect("task");
    }
    let order = order.lock().expect("order").clone();
    assert_eq!(order.len(), n);
    for pair in order.windows(2) {
        assert!(pair[0].0 < pair[1].0, "out of ticket order: {order:?}");
        assert!(pair[0].1 < pair[1].1, "tokens not increasing: {order:?}");
    }
}
