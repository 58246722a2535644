//! Servers and clients for a test: a fresh redis-server (or a replica),
//! clients with short protocol timings, RedLock and cluster clients, a
//! plain fred client for data, and a loud skip.

use std::time::Duration;

use fairlock::redlock::{RedLock, RedLockConfig};
use fairlock::{ClientConfig, LockClient};
use fairlock_testkit::RedisServer;
use fred::prelude::{Client, ClientLike};

use crate::raw_calls::lock_slot;
use crate::switch_proxy::SwitchProxy;
use crate::waits::within;

/// Short timings: 100 ms heartbeats, 1 s waiter timeout, 3 s watchdog lease.
pub fn fast_config(server: &RedisServer) -> ClientConfig {
    ClientConfig::builder(server.url())
        .connect_timeout(Duration::from_secs(3))
        .command_timeout(Duration::from_secs(3))
        .heartbeat_interval(Duration::from_millis(100))
        .waiter_timeout(Duration::from_secs(1))
        .watchdog_lease(Duration::from_secs(3))
        .build()
        .expect("the fast test timings are valid")
}

/// A client with [`fast_config`] but a 5 s waiter timeout, for tests that
/// count script calls: a stall of a loaded machine longer than the fast 1 s
/// would drop its waiters as dead, and their re-queueing would be counted.
pub async fn patient_client(server: &RedisServer) -> LockClient {
    let mut config = fast_config(server);
    config.waiter_timeout = Duration::from_secs(5);
    match LockClient::with_config(config).await {
        Ok(client) => client,
        Err(error) => panic!("cannot connect to the test redis-server: {error}"),
    }
}

/// Starts a redis-server for one test; it is killed when dropped.
pub fn server() -> RedisServer {
    match RedisServer::start() {
        Ok(server) => server,
        Err(error) => panic!("cannot start redis-server for the test: {error}"),
    }
}

/// Starts a redis-server that replicates `primary`, and waits (bounded)
/// until the primary counts it online, so a `WAIT` there is answered.
pub async fn online_replica_of(primary: &RedisServer) -> RedisServer {
    // A full sync starts at once rather than after the default 5 s.
    primary
        .cmd(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"])
        .expect("CONFIG SET");
    let replica = server();
    replica
        .cmd(&["REPLICAOF", "127.0.0.1", &primary.port().to_string()])
        .expect("REPLICAOF");
    within("the replica to come online", async {
        loop {
            let info = primary.cmd(&["INFO", "replication"]).expect("INFO");
            if info.as_str().unwrap_or_default().contains("state=online") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    replica
}

/// RedLock timings for tests over `urls`: short, with room for a loaded
/// machine (a live primary slower than the call timeout does not vote,
/// and one missing vote of three fails a lock), the delayed-restart rule
/// off.
pub fn redlock_config(urls: Vec<String>) -> RedLockConfig {
    let mut config = RedLockConfig::new(urls);
    config.connect_timeout = Duration::from_secs(3);
    config.call_timeout = Duration::from_millis(900);
    config.watchdog_lease = Duration::from_secs(3);
    config.restart_delay = Duration::ZERO;
    config
}

/// Connects a RedLock, failing the test if it cannot.
pub async fn redlock_connect(config: RedLockConfig) -> RedLock {
    RedLock::with_config(config)
        .await
        .expect("RedLock connects to the primaries")
}

/// A client with [`fast_config`].
pub async fn client(server: &RedisServer) -> LockClient {
    match LockClient::with_config(fast_config(server)).await {
        Ok(client) => client,
        Err(error) => panic!("cannot connect to the test redis-server: {error}"),
    }
}

/// `n` clients with [`fast_config`].
pub async fn clients(server: &RedisServer, n: usize) -> Vec<LockClient> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(client(server).await);
    }
    out
}

/// A plain fred client for the data a test's critical section touches.
pub async fn data_client(server: &RedisServer) -> Client {
    let config = fred::prelude::Config::from_url(&server.url()).expect("test url");
    let client = Client::new(config, None, None, None);
    client.init().await.expect("data client connects");
    client
}

/// A bare subscriber on `channel`, standing in for the process of a waiter
/// crafted with raw script calls: a handoff reaches only owner ids whose
/// process listens. Keep it alive while the waiter should count as live.
pub async fn listener(server: &RedisServer, channel: &str) -> fred::clients::SubscriberClient {
    use fred::prelude::PubsubInterface;
    let config = fred::prelude::Config::from_url(&server.url()).expect("test url");
    let client = fred::prelude::Builder::from_config(config)
        .build_subscriber_client()
        .expect("subscriber");
    client.init().await.expect("subscriber connects");
    client.subscribe(channel).await.expect("subscribe");
    // fred reports SUBSCRIBE done once it is written, without waiting for
    // Redis's answer: the PING's reply comes after the SUBSCRIBE has run,
    // so the channel is live when this returns.
    client
        .ping::<fred::types::Value>(None)
        .await
        .expect("PING after SUBSCRIBE");
    client
}

/// A client of `url` whose heartbeat, the fallback that finds grants
/// nobody heard, runs only once a minute: a grant that reaches it within
/// seconds came by pub/sub.
pub async fn pubsub_only_client(url: &str) -> LockClient {
    let mut config = ClientConfig::new(url);
    config.connect_timeout = Duration::from_secs(3);
    config.heartbeat_interval = Duration::from_secs(60);
    config.waiter_timeout = Duration::from_secs(180);
    match LockClient::with_config(config).await {
        Ok(client) => client,
        Err(error) => panic!("client of {url}: {error}"),
    }
}

/// Lock names whose keys land on each of the three primaries.
pub fn lock_names_on_every_primary(cluster: &fairlock_testkit::RedisCluster) -> Vec<String> {
    let primaries = cluster.primaries().expect("primaries");
    let mut names = Vec::new();
    for primary in &primaries {
        let name = (0..)
            .map(|i| format!("cluster:{i}"))
            .find(|name| cluster.slot_owner(lock_slot(name)).ok().as_ref() == Some(primary))
            .expect("a name on this primary");
        names.push(name);
    }
    names
}

/// A client of a local Redis Cluster with fast test timings.
pub async fn cluster_client(cluster: &fairlock_testkit::RedisCluster) -> LockClient {
    cluster_client_at(cluster.url()).await
}

/// A client of the cluster at `url` (a user's credentials in it, say)
/// with fast test timings.
pub async fn cluster_client_at(url: String) -> LockClient {
    let mut config = ClientConfig::new(url);
    config.heartbeat_interval = Duration::from_millis(100);
    config.waiter_timeout = Duration::from_secs(1);
    config.watchdog_lease = Duration::from_secs(3);
    LockClient::with_config(config)
        .await
        .expect("client connects to the cluster")
}

/// Says loudly that `test` is skipped and why. Written to the process's
/// stderr directly, not with `eprintln!`, which the test harness captures
/// and hides for a passing test: a skip must never pass silently.
pub fn skip(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// A [`SwitchProxy`] in front of `server`, and a client through it with
/// [`fast_config`] as changed by `tweak`.
pub async fn client_behind_proxy(
    server: &RedisServer,
    tweak: impl FnOnce(&mut ClientConfig),
) -> (SwitchProxy, LockClient) {
    let proxy = SwitchProxy::start(server.port()).await;
    let mut config = fast_config(server);
    config.url = proxy.url();
    tweak(&mut config);
    match LockClient::with_config(config).await {
        Ok(client) => (proxy, client),
        Err(error) => panic!("cannot connect through the proxy: {error}"),
    }
}
