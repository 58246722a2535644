//! Shared helpers of fairlock's integration tests: a fresh redis-server per
//! test (from fairlock-testkit), clients with short protocol timings so
//! fault tests finish quickly, and raw script calls for setting up states
//! that a well-behaved client never produces (a dead waiter, an expired
//! holder).

pub mod local_metrics;
pub mod silent_proxy;
pub mod switch_proxy;

use std::time::Duration;

use fairlock::redlock::{RedLock, RedLockConfig};
use fairlock::{ClientConfig, LockClient, LockGuard};
use fairlock_core::{Acquire, AcquireMode, KeyPrefix, LockKeys, LockName, ScriptCall, Timings};
use fairlock_metrics::PrometheusHandle;
pub use fairlock_testkit::{RedisServer, Resp};
use fred::prelude::{Client, ClientLike, KeysInterface};
use tokio::task::JoinHandle;

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

/// The five keys of lock `name` under the default prefix.
pub fn keys(name: &str) -> LockKeys {
    LockKeys::new(
        &KeyPrefix::default(),
        &LockName::new(name).expect("valid test lock name"),
    )
}

/// Runs a fairlock script with plain EVAL over the testkit's own admin
/// connection, bypassing the client: for crafting states like a waiter
/// that never heartbeats.
pub fn raw<C: ScriptCall>(server: &RedisServer, name: &str, call: &C) -> C::Output {
    raw_with_args::<C>(server, name, &call.args())
}

/// [`raw`] with the script's arguments given as they are, for arguments
/// the call type would never make (bad input the script must survive).
pub fn raw_with_args<C: ScriptCall>(
    server: &RedisServer,
    name: &str,
    args: &[String],
) -> C::Output {
    let keys = keys(name);
    let numkeys = keys.all().len().to_string();
    let mut cmd: Vec<&str> = vec!["EVAL", C::SCRIPT.source(), &numkeys];
    cmd.extend(keys.all().iter().map(String::as_str));
    cmd.extend(args.iter().map(String::as_str));
    let reply = server.cmd(&cmd).expect("raw script call");
    C::decode(to_reply(reply)).expect("raw script reply")
}

/// Converts the admin client's reply into a script reply.
pub fn to_reply(resp: Resp) -> fairlock_core::Reply {
    use fairlock_core::Reply;
    match resp {
        Resp::Int(i) => Reply::Int(i),
        Resp::Simple(s) => Reply::Str(s),
        Resp::Bulk(Some(b)) => Reply::from_bulk(b),
        Resp::Bulk(None) | Resp::Array(None) => Reply::Nil,
        Resp::Array(Some(items)) => Reply::Array(items.into_iter().map(to_reply).collect()),
        Resp::Error(e) => panic!("raw script failed: {e}"),
    }
}

/// A snapshot of every key and its value, to prove a call changed nothing.
pub fn dump(server: &RedisServer) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let keys = match server.cmd(&["KEYS", "*"]) {
        Ok(Resp::Array(Some(keys))) => keys,
        other => panic!("KEYS failed: {other:?}"),
    };
    for key in keys {
        let key = key.as_str().unwrap_or_default().to_owned();
        let dumped = server.cmd(&["DUMP", &key]).expect("DUMP");
        out.push((key, format!("{dumped:?}")));
    }
    out.sort();
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

/// GET a counter (missing = 0).
pub async fn get_counter(client: &Client, key: &str) -> i64 {
    client
        .get::<Option<i64>, _>(key)
        .await
        .expect("GET")
        .unwrap_or(0)
}

/// SET a counter.
pub async fn set_counter(client: &Client, key: &str, value: i64) {
    client
        .set::<(), _, _>(key, value, None, None, false)
        .await
        .expect("SET");
}

/// An `acquire.lua` call of `owner_id` that waits in the queue, for tests
/// that run the scripts raw: its grants are published under
/// `test:nobody:`, where nobody listens unless the test does.
pub fn waiting_acquire<'a>(owner_id: &'a str, timings: &'a Timings) -> Acquire<'a> {
    Acquire {
        owner_id,
        mode: AcquireMode::Wait,
        timings,
        channel_prefix: "test:nobody:",
        rejoin: None,
    }
}

/// Reads one stats counter from `INFO commandstats` (0 if absent).
pub fn calls(server: &RedisServer, command: &str) -> u64 {
    server
        .commandstats()
        .expect("INFO commandstats")
        .get(command)
        .copied()
        .unwrap_or(0)
}

/// Script calls (`EVALSHA`) the server ran during a window of about
/// `window`, and how many 100 ms intervals (the fast config's heartbeat)
/// the window really lasted: a loaded machine sleeps longer, so a bound
/// per interval uses the measured count, not the intended one.
pub async fn script_calls_over(server: &RedisServer, window: Duration) -> (u64, u64) {
    server.cmd(&["CONFIG", "RESETSTAT"]).expect("reset stats");
    let started = std::time::Instant::now();
    tokio::time::sleep(window).await;
    let evalsha = calls(server, "evalsha");
    let intervals = started.elapsed().as_millis().div_ceil(100) as u64;
    (evalsha, intervals)
}

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

/// The value of metric `name` in this process's exporter, summed over its
/// series; `None` before anything recorded it.
pub fn metric_value(metrics: &PrometheusHandle, name: &str) -> Option<f64> {
    let text = metrics.render();
    let values: Vec<f64> = text
        .lines()
        .filter(|line| {
            let series = line.split([' ', '{']).next();
            series == Some(name)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Waits until metric `name` in this process's exporter reads `value`.
///
/// A waiting task records its contention once its acquire reply arrives,
/// which can be after [`wait_for_queue_len`] has already seen the queue
/// grow in Redis: a test that needs those records in queue order waits for
/// the count too.
pub async fn wait_for_metric(metrics: &PrometheusHandle, name: &str, value: f64) {
    for _ in 0..2000 {
        if metric_value(metrics, name) == Some(value) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "{name} never read {value}: {:?}",
        metric_value(metrics, name)
    );
}

/// Installs fairlock's Prometheus exporter on a free loopback port and
/// returns its address and a handle to render it in-process. The port is found by binding port 0 and closing it
/// again, so another process may take it in between: retry a few times.
pub fn install_exporter() -> (std::net::SocketAddr, PrometheusHandle) {
    for _ in 0..5 {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port");
        match fairlock_metrics::install_prometheus(addr) {
            Ok(handle) => return (addr, handle),
            Err(fairlock_metrics::MetricsError::Listen { .. }) => continue,
            Err(error) => panic!("cannot install the exporter: {error}"),
        }
    }
    panic!("no free port for the exporter after 5 tries");
}

/// Says loudly that `test` is skipped and why. Written to the process's
/// stderr directly, not with `eprintln!`, which the test harness captures
/// and hides for a passing test: a skip must never pass silently.
pub fn skip(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// How long a test waits for a grant that must come before it fails.
pub const GRANT_GUARD: Duration = Duration::from_secs(20);

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

/// Asserts that a seckill swarm run passed every one of its checks (sold =
/// min(stock, attempts), stock never negative, one order per sale...).
pub fn assert_swarm_passed(report: &fairlock_examples::seckill::Report) {
    let failed: Vec<String> = report
        .checks()
        .into_iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    assert!(
        failed.is_empty(),
        "{:?} run failed: {failed:#?}",
        report.variant
    );
}

/// The keys of permit set `name` (a semaphore or a read-write lock).
pub fn permit_keys(name: &str, family: fairlock_core::PermitFamily) -> LockKeys {
    LockKeys::permits(
        &KeyPrefix::default(),
        &LockName::new(name).expect("valid test set name"),
        family,
    )
}

/// `ZCARD key` through the admin connection.
pub fn zcard(server: &RedisServer, key: &str) -> i64 {
    server
        .cmd(&["ZCARD", key])
        .expect("ZCARD")
        .as_int()
        .expect("int")
}

/// The cluster slot of lock `name`'s keys (default prefix).
pub fn lock_slot(name: &str) -> u16 {
    LockKeys::new(
        &KeyPrefix::default(),
        &LockName::new(name).expect("a valid lock name"),
    )
    .slot()
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
    let mut config = ClientConfig::new(cluster.url());
    config.heartbeat_interval = Duration::from_millis(100);
    config.waiter_timeout = Duration::from_secs(1);
    config.watchdog_lease = Duration::from_secs(3);
    LockClient::with_config(config)
        .await
        .expect("client connects to the cluster")
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

/// The raw value of lock `name`'s owner key (default prefix), read by the
/// admin connection: `None` when nobody holds the lock in Redis.
pub fn owner_in_redis(server: &RedisServer, name: &str) -> Option<String> {
    server
        .cmd(&["GET", keys(name).owner()])
        .expect("GET owner")
        .as_str()
        .map(str::to_owned)
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

/// Awaits `future`, failing the test if it takes longer than 20 s: a
/// liveness bound for waits that end unless a grant was lost, not a
/// timing assertion.
pub async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish: a grant was lost"))
}

/// How many connections of `server` hold a subscription (`sub`, `psub` or
/// `ssub` above 0 in `CLIENT LIST`).
pub fn subscribed_connections(server: &RedisServer) -> usize {
    let list = server.cmd_ok(&["CLIENT", "LIST"]).expect("CLIENT LIST");
    list.as_str()
        .expect("CLIENT LIST text")
        .lines()
        .filter(|line| {
            line.split(' ').any(|field| {
                ["sub=", "psub=", "ssub="]
                    .iter()
                    .any(|kind| field.strip_prefix(kind).is_some_and(|n| n != "0"))
            })
        })
        .count()
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

/// A setting of `server` as `CONFIG GET` gives it.
pub fn config_value(server: &RedisServer, name: &str) -> String {
    let reply = server.cmd_ok(&["CONFIG", "GET", name]).expect("CONFIG GET");
    reply
        .as_array()
        .and_then(|pair| pair.get(1))
        .and_then(|value| value.as_str())
        .unwrap_or_else(|| panic!("{name} is not a setting of the server"))
        .to_owned()
}

/// Keeps every pub/sub subscriber of `server` away while it lives: it
/// kills them and lowers `maxclients` below the connections left, so none
/// can reconnect. Grant messages published meanwhile reach nobody. Drop it
/// to let them back.
pub struct SubscribersCutOff<'a> {
    server: &'a RedisServer,
    /// `maxclients` before the cut, restored on drop.
    maxclients: String,
}

/// Cuts every subscriber of `server` off (see [`SubscribersCutOff`]).
pub fn cut_off_subscribers(server: &RedisServer) -> SubscribersCutOff<'_> {
    let list = server.cmd_ok(&["CLIENT", "LIST"]).expect("CLIENT LIST");
    let connected = list.as_str().expect("CLIENT LIST text").lines().count();
    let subscribers = subscribed_connections(server);
    assert!(subscribers > 0, "no subscriber to cut off");
    let maxclients = config_value(server, "maxclients");
    let limit = (connected - subscribers).to_string();
    server
        .cmd_ok(&["CONFIG", "SET", "maxclients", &limit])
        .expect("maxclients");
    server
        .cmd_ok(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .expect("kill the subscribers");
    SubscribersCutOff { server, maxclients }
}

impl Drop for SubscribersCutOff<'_> {
    fn drop(&mut self) {
        let restored = self
            .server
            .cmd_ok(&["CONFIG", "SET", "maxclients", &self.maxclients]);
        if let Err(error) = restored {
            if !std::thread::panicking() {
                panic!("maxclients not restored to {}: {error}", self.maxclients);
            }
        }
    }
}

/// The owner ids queued in zset `queue`, oldest ticket first.
pub fn queue_entries(server: &RedisServer, queue: &str) -> Vec<String> {
    match server.cmd(&["ZRANGE", queue, "0", "-1"]).expect("ZRANGE") {
        Resp::Array(Some(items)) => items
            .iter()
            .map(|item| item.as_str().expect("owner id").to_owned())
            .collect(),
        other => panic!("ZRANGE {queue}: {other:?}"),
    }
}

/// Waits until `owner_id` is queued in `queue` again, or until the process
/// of client tag `tag` has refreshed its deadline in `alive` `beats` times
/// (each refresh is one of its heartbeats on that queue, or one of its
/// acquires) without that happening: whether it came back. Counting the
/// process's own heartbeats, not time, keeps the check fair on a loaded
/// machine. Bounded by [`within`].
pub async fn queued_again_within_beats(
    server: &RedisServer,
    queue: &str,
    alive: &str,
    owner_id: &str,
    tag: &str,
    beats: usize,
) -> bool {
    let deadline = || server.cmd(&["ZSCORE", alive, tag]).expect("ZSCORE alive");
    within("the process's heartbeats", async {
        let mut last = deadline();
        let mut seen = 0;
        loop {
            if !matches!(
                server.cmd(&["ZSCORE", queue, owner_id]).expect("ZSCORE"),
                Resp::Bulk(None)
            ) {
                eprintln!("{owner_id} queued again after {seen} deadline refreshes of its process");
                return true;
            }
            let now = deadline();
            if now != last {
                last = now;
                seen += 1;
                if seen > beats {
                    eprintln!("{owner_id} not queued again after {beats} deadline refreshes of its process");
                    return false;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
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

/// The ticket (score) of `member` in `queue`, as Redis prints it.
pub fn ticket_of(server: &RedisServer, queue: &str, member: &str) -> String {
    server
        .cmd(&["ZSCORE", queue, member])
        .expect("ZSCORE")
        .as_str()
        .unwrap_or_else(|| panic!("{member} is not queued"))
        .to_owned()
}

/// Removes `member` from `queue` (a lost entry) and checks that its
/// process, of client tag `tag`, queues it again within 10 of its
/// heartbeats, with the same `ticket`: back in its old place.
pub async fn lose_entry_and_see_it_rejoin(
    server: &RedisServer,
    queue: &str,
    alive: &str,
    member: &str,
    tag: &str,
    ticket: &str,
) {
    server.cmd(&["ZREM", queue, member]).expect("ZREM");
    let back = queued_again_within_beats(server, queue, alive, member, tag, 10).await;
    assert!(back, "{member} was not queued again within 10 heartbeats");
    assert_eq!(
        ticket_of(server, queue, member),
        ticket,
        "{member} is queued again with its own ticket"
    );
}

/// The lost-entry tests' verdict: B (whose entry alone was removed) was
/// queued again within 10 heartbeats (`back`), and with `tokens` of A, B
/// and the newcomer C, granted after A and before C.
pub fn assert_queued_again_before_the_newcomer(back: bool, tokens: [u64; 3]) {
    let [a, b, c] = tokens;
    let grants = format!("grants: A {a}, B {b}, C {c}");
    assert!(
        back,
        "B was not queued again within 10 heartbeats of its process; {grants}"
    );
    assert!(
        a < b && b < c,
        "B came back before C arrived, so it goes before C; {grants}"
    );
}
