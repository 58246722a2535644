//! What a test reads straight from the server: its keys, counters, command
//! counts, settings and subscriptions.

use std::time::Duration;

use fairlock_testkit::{RedisServer, Resp};
use fred::prelude::{Client, KeysInterface};

use crate::raw_calls::keys;

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

/// Reads one stats counter from `INFO commandstats` (0 if absent).
pub fn calls(server: &RedisServer, command: &str) -> u64 {
    server
        .commandstats()
        .expect("INFO commandstats")
        .get(command)
        .copied()
        .unwrap_or(0)
}

/// How many times `server` has answered with error `code` (`WRONGTYPE`,
/// `ASK`, ...), from its `INFO errorstats`.
pub fn errors_answered(server: &RedisServer, code: &str) -> u64 {
    server
        .info("errorstats")
        .expect("INFO errorstats")
        .get(&format!("errorstat_{code}"))
        .and_then(|value| value.strip_prefix("count="))
        .map_or(0, |count| count.parse().expect("a count"))
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

/// `ZCARD key` through the admin connection.
pub fn zcard(server: &RedisServer, key: &str) -> i64 {
    server
        .cmd(&["ZCARD", key])
        .expect("ZCARD")
        .as_int()
        .expect("int")
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

/// Whether everything `server` has sent its subscribers (pub/sub
/// messages) has reached their sockets, read or not: nothing waits in
/// Redis's output buffer of a subscribed connection (`omem=0` in `CLIENT
/// LIST TYPE pubsub`), and, where `/proc/net/tcp` tells, nothing sent on
/// such a connection is unacknowledged by the subscriber's kernel (loopback
/// delivery can lag behind Redis's write on a loaded machine).
pub fn subscribers_have_everything(server: &RedisServer) -> bool {
    let list = server
        .cmd_ok(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .expect("CLIENT LIST");
    let text = list.as_str().expect("CLIENT LIST text").to_owned();
    text.lines().all(|line| {
        let field = |name: &str| {
            line.split(' ')
                .find_map(|field| field.strip_prefix(name))
                .unwrap_or_default()
        };
        let port = field("addr=")
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok());
        field("omem=") == "0"
            && port.is_none_or(|port| unacknowledged(server.port(), port).is_none_or(|n| n == 0))
    })
}

/// Bytes sent on the connection from `127.0.0.1:local_port` to
/// `127.0.0.1:remote_port` that the other end has not acknowledged yet
/// (`tx_queue` in `/proc/net/tcp`); `None` when `/proc` does not tell.
fn unacknowledged(local_port: u16, remote_port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let (local, remote) = (
        format!("0100007F:{local_port:04X}"),
        format!("0100007F:{remote_port:04X}"),
    );
    // Columns: sl local_address rem_address st tx_queue:rx_queue ...
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.get(1) != Some(&local.as_str()) || cols.get(2) != Some(&remote.as_str()) {
            return None;
        }
        let tx_queue = cols.get(4)?.split(':').next()?;
        u64::from_str_radix(tx_queue, 16).ok()
    })
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

/// The ticket (score) of `member` in `queue`, as Redis prints it.
pub fn ticket_of(server: &RedisServer, queue: &str, member: &str) -> String {
    server
        .cmd(&["ZSCORE", queue, member])
        .expect("ZSCORE")
        .as_str()
        .unwrap_or_else(|| panic!("{member} is not queued"))
        .to_owned()
}

/// The TTL of `key` in ms, as Redis answers `PTTL` (-1 without a TTL, -2
/// once the key is gone).
pub fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cmd_ok(&["PTTL", key])
        .expect("PTTL")
        .as_int()
        .expect("PTTL answers a number")
}

/// Has `server` log every command it runs from now on (`SLOWLOG` with a
/// threshold of 0; a script is logged after the commands it ran), for
/// [`commands_run`].
pub fn log_every_command(server: &RedisServer) {
    for setting in [
        ["slowlog-log-slower-than", "0"],
        ["slowlog-max-len", "100000"],
    ] {
        server
            .cmd_ok(&["CONFIG", "SET", setting[0], setting[1]])
            .expect("CONFIG SET");
    }
    server.cmd_ok(&["SLOWLOG", "RESET"]).expect("SLOWLOG RESET");
}

/// Every command Redis logged in its `SLOWLOG` (all of them, at a
/// threshold of 0), oldest first, each as its arguments.
pub fn commands_run(server: &RedisServer) -> Vec<Vec<String>> {
    let entries = server
        .cmd_ok(&["SLOWLOG", "GET", "-1"])
        .expect("SLOWLOG GET");
    let mut log: Vec<(i64, Vec<String>)> = entries
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| {
            let fields = entry.as_array().expect("an entry");
            let id = fields[0].as_int().expect("an id");
            let args = fields[3]
                .as_array()
                .expect("arguments")
                .iter()
                .map(|arg| arg.as_str().unwrap_or_default().to_owned())
                .collect();
            (id, args)
        })
        .collect();
    log.sort_by_key(|&(id, _)| id);
    log.into_iter().map(|(_, args)| args).collect()
}
