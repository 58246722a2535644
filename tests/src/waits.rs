//! Bounded waits: for a queue, an owner, a subscription or a grant, each
//! failing the test if what must come does not (liveness bounds, never
//! timing assertions).

use std::time::Duration;

use fairlock::{LockClient, LockGuard};
use fairlock_testkit::RedisServer;
use tokio::task::JoinHandle;

use crate::redis_state::{
    owner_in_redis, pttl, queue_entries, subscribed_connections, subscribers_have_everything, zcard,
};

/// Awaits `future`, failing the test if it takes longer than 20 s: a
/// liveness bound for waits that end unless a grant was lost, not a
/// timing assertion.
pub async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish: a grant was lost"))
}

/// How long a test waits for a grant that must come before it fails.
pub const GRANT_GUARD: Duration = Duration::from_secs(20);

/// Waits (bounded) until lock `name` has at least `len` queue entries, so a
/// test can enqueue waiters in a known order.
pub async fn wait_for_queue_len(client: &LockClient, name: &str, len: u64) {
    for _ in 0..1000 {
        if client.inspect(name).await.expect("inspect").queue_len >= len {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("queue of {name} never reached {len}");
}

/// A waiter of `waiter` queues behind `holder` (held through another
/// client), the holder releases, and the waiter's guard is returned once
/// granted within `within`: the grant crosses processes by pub/sub. Its
/// token is checked to be above the holder's.
pub async fn hand_over(
    holder: LockGuard,
    holder_client: &LockClient,
    waiter: &LockClient,
    within: Duration,
) -> LockGuard {
    let name = holder.name().to_owned();
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move { waiter.lock(&name).await }
    });
    wait_for_queue_len(holder_client, &name, 1).await;
    let holder_token = holder.token().value();
    holder.release().await.expect("release");
    let granted = tokio::time::timeout(within, waiting)
        .await
        .expect("the waiter is granted in time")
        .expect("task")
        .expect("lock");
    assert!(granted.token().value() > holder_token);
    granted
}

/// Spawns a task that waits for lock `name` on `client`.
pub fn spawn_lock(
    client: &LockClient,
    name: &'static str,
) -> JoinHandle<fairlock::Result<LockGuard>> {
    let client = client.clone();
    tokio::spawn(async move { client.lock(name).await })
}

/// The guard a [`spawn_lock`] task got; fails the test, saying `what`, if
/// it is not granted within [`GRANT_GUARD`].
pub async fn granted(task: JoinHandle<fairlock::Result<LockGuard>>, what: &str) -> LockGuard {
    match tokio::time::timeout(GRANT_GUARD, task).await {
        Ok(Ok(Ok(guard))) => guard,
        Ok(Ok(Err(error))) => panic!("{what}: {error}"),
        Ok(Err(join)) => panic!("{what}: the task failed: {join}"),
        Err(_) => panic!("{what}: not granted within {GRANT_GUARD:?}"),
    }
}

/// Waits (bounded, 20 s) until zset `key` has at least `count` owner ids.
pub async fn wait_for_zcard(server: &RedisServer, key: &str, count: i64) {
    for _ in 0..4000 {
        if zcard(server, key) >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{key} never reached {count} owner ids");
}

/// Waits (bounded, 20 s) until lock `name` is held in Redis (`held`) or
/// free there (`!held`).
pub async fn wait_for_owner(server: &RedisServer, name: &str, held: bool) {
    within(&format!("{name} held in Redis: {held}"), async {
        while owner_in_redis(server, name).is_some() != held {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Waits (bounded, 20 s) until `server` has `count` subscribed
/// connections: a grant connection may be reopening after a keep-alive
/// check a stall of a loaded machine failed.
pub async fn wait_for_subscribed_connections(server: &RedisServer, count: usize) {
    within("the subscribed connections", async {
        while subscribed_connections(server) != count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Waits (bounded, 20 s) until everything `server` has published has
/// reached its subscribers' sockets ([`subscribers_have_everything`]):
/// a process that does not read (a blocked runtime) then finds it all
/// there when it does.
pub async fn wait_for_subscribers_to_have_everything(server: &RedisServer) {
    within("the published messages to reach the subscribers", async {
        while !subscribers_have_everything(server) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Waits (bounded) until the queue at `queue` holds a member other than
/// `known`: a newcomer has queued.
pub async fn wait_for_a_newcomer(server: &RedisServer, queue: &str, known: &[&str]) {
    within("the newcomer to queue", async {
        while !queue_entries(server, queue)
            .iter()
            .any(|member| !known.contains(&member.as_str()))
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Waits (bounded) until a renewal of `owner_key` runs in Redis: its TTL
/// rises.
pub async fn a_renewal_runs(server: &RedisServer, owner_key: &str) {
    within("a renewal", async {
        let mut lowest = pttl(server, owner_key);
        loop {
            let now = pttl(server, owner_key);
            if now > lowest + 300 {
                break;
            }
            lowest = lowest.min(now);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}
