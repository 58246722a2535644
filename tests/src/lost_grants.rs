//! Faults a test makes by hand: subscribers cut off (grants published to
//! nobody), lost queue entries, and dead waiters planted in a queue.

use std::time::Duration;

use fairlock_testkit::{RedisServer, Resp};

use crate::redis_state::{config_value, subscribed_connections, ticket_of};
use crate::waits::within;

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

/// Queues `count` waiters of one dead process (its deadline long past) on
/// the lock whose keys are `keys`, with tickets 1 to `count`: what a
/// crashed process leaves behind.
pub fn plant_dead_waiters(server: &RedisServer, keys: &fairlock_core::LockKeys, count: usize) {
    server
        .cmd(&["ZADD", keys.alive(), "1", "00000000000000dd"])
        .expect("dead process");
    for chunk in (0..count).collect::<Vec<_>>().chunks(1_000) {
        let entries: Vec<String> = chunk
            .iter()
            .flat_map(|i| {
                [
                    (i + 1).to_string(),
                    format!("{i:032x}.00000000000000dd.30000"),
                ]
            })
            .collect();
        let mut cmd = vec!["ZADD", keys.queue()];
        cmd.extend(entries.iter().map(String::as_str));
        server.cmd(&cmd).expect("dead entries");
    }
}
