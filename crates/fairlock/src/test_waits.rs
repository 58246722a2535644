//! Bounded waits on what a test redis-server shows, for the unit tests:
//! a test polls for the state it needs instead of sleeping for it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fairlock_testkit::RedisServer;

/// The ids of `server`'s connections: one line of `CLIENT LIST` each.
pub(crate) fn connections(server: &RedisServer) -> BTreeSet<u64> {
    client_list(server).map(|(id, _)| id).collect()
}

/// The ids of the connections whose command `server` holds now. Under
/// `CLIENT PAUSE`, a command that must wait is postponed: its connection
/// is blocked, flag `b` in `CLIENT LIST` (Redis 7.0 also counts it in
/// `blocked_clients` of `INFO clients`; fairlock sends no blocking
/// command, so nothing else is blocked).
pub(crate) fn held_connections(server: &RedisServer) -> BTreeSet<u64> {
    client_list(server)
        .filter(|(_, flags)| flags.contains('b'))
        .map(|(id, _)| id)
        .collect()
}

/// Each connection of `CLIENT LIST`: its id and its flags.
fn client_list(server: &RedisServer) -> impl Iterator<Item = (u64, String)> {
    let list = server.cmd_ok(&["CLIENT", "LIST"]).expect("CLIENT LIST");
    let text = list.as_str().expect("CLIENT LIST text").to_owned();
    text.lines()
        .map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|field| field.strip_prefix(name))
                    .unwrap_or_default()
                    .to_owned()
            };
            let id = field("id=").parse().expect("a client id");
            (id, field("flags="))
        })
        .collect::<Vec<_>>()
        .into_iter()
}

/// Polls `done` every 5 ms until it holds; fails the test, saying `what`,
/// if it does not within 10 s (a hang guard, not a timing check).
pub(crate) async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
