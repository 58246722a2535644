//! The script sockets behind Sentinel, against real servers: a lock's
//! calls go on them, they connect only to a server that answers `ROLE` as
//! the primary, and they follow fred to the new primary after a
//! fail-over.

use std::time::{Duration, Instant};

use fairlock_testkit::{RedisServer, SentinelGroup};
use fred::prelude::Server;
use tokio::sync::broadcast;

use super::super::grant_endpoint::{GrantEndpoint, GrantPlace};
use super::tests::{load, target};
use super::{EvalSha, Order, Outcome, ScriptSocket, SocketTarget};

/// Answers the value of `where` on the server that runs it.
const WHERE: &str = "return redis.call('GET', 'where')";

/// Loads [`WHERE`] into `server` and names it `name` there.
fn prepare(server: &RedisServer, name: &str) -> String {
    if !name.is_empty() {
        server.cmd_ok(&["SET", "where", name]).expect("SET");
    }
    load(server, WHERE)
}

/// An endpoint that follows the server `announce` names, as one follows
/// fred's reconnects behind Sentinel.
fn following(announce: &broadcast::Sender<Server>) -> GrantEndpoint {
    GrantEndpoint::new(
        GrantPlace::SentinelPrimary,
        || announce.subscribe(),
        None,
        None,
        None,
    )
}

/// `server` as fred announces a reconnect to it.
fn announced(server: &RedisServer) -> Server {
    Server::new("127.0.0.1", server.port())
}

/// Calls [`WHERE`] on the socket: the server's name, or how it ended.
async fn where_runs(socket: &ScriptSocket, target: &SocketTarget<'_>, sha: &str) -> Outcome {
    let call = EvalSha {
        sha,
        keys: &[],
        args: &[],
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    socket
        .call(target, &call, Order::IfClear, deadline, None)
        .await
}

fn answered(outcome: Outcome) -> String {
    match outcome {
        Outcome::Answered(Ok(fairlock_core::Reply::Str(name))) => name,
        other => panic!("expected a name, got {other:?}"),
    }
}

/// Behind Sentinel the socket goes where fred's last reconnect went, but
/// only to a primary: a replica there (the demoted primary, right after
/// a fail-over) is refused at connect and the call goes through fred; and
/// once fred announces another server, the next call leaves the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_behind_sentinel_takes_only_a_primary_and_follows_fred() {
    let primary = RedisServer::start().expect("primary");
    let replica = RedisServer::start().expect("replica");
    let other = RedisServer::start().expect("another primary");
    let sha = prepare(&primary, "primary");
    prepare(&other, "other");
    replica
        .cmd_ok(&["REPLICAOF", "127.0.0.1", &primary.port().to_string()])
        .expect("REPLICAOF");
    // The replica has the script and the key too: only the role check
    // keeps the call off it.
    assert_eq!(prepare(&replica, ""), sha);
    let deadline = Instant::now() + Duration::from_secs(30);
    while replica.cmd_ok(&["GET", "where"]).expect("GET")
        != fairlock_testkit::Resp::Bulk(Some(b"primary".to_vec()))
    {
        assert!(Instant::now() < deadline, "the replica never synced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (announce, _) = broadcast::channel(8);
    let endpoint = following(&announce);
    let target = target(&endpoint);
    let socket = ScriptSocket::new();

    announce.send(announced(&replica)).expect("announce");
    let outcome = where_runs(&socket, &target, &sha).await;
    assert!(
        matches!(outcome, Outcome::NotSent),
        "a replica is refused: {outcome:?}"
    );
    assert_eq!(socket.connected_to(), None);

    announce.send(announced(&primary)).expect("announce");
    // After a failed connect the socket waits a second before the next.
    tokio::time::sleep(super::RECONNECT_PAUSE + Duration::from_millis(100)).await;
    assert_eq!(
        answered(where_runs(&socket, &target, &sha).await),
        "primary"
    );
    assert_eq!(socket.connected_to(), Some(primary.addr()));

    announce.send(announced(&other)).expect("announce");
    assert_eq!(answered(where_runs(&socket, &target, &sha).await), "other");
    assert_eq!(socket.connected_to(), Some(other.addr()));
}

/// A client behind `group`'s sentinels that has locked and released
/// `name` twice, and the primary both its sockets are connected to (the
/// first cycle finds the scripts missing: fred's path loads them).
async fn client_on_the_sockets(group: &SentinelGroup, name: &str) -> (crate::LockClient, String) {
    let mut config = crate::ClientConfig::new(group.url());
    config.heartbeat_interval = Duration::from_millis(100);
    config.waiter_timeout = Duration::from_secs(3);
    config.watchdog_lease = Duration::from_secs(3);
    let client = crate::LockClient::with_config(config)
        .await
        .expect("client");
    let primary = group.primary_addr().expect("primary");
    for _ in 0..2 {
        client
            .lock(name)
            .await
            .expect("lock")
            .release()
            .await
            .expect("release");
    }
    assert_eq!(
        client.state().redis.sockets_at(),
        [Some(primary.clone()), Some(primary.clone())],
        "both lanes' sockets on the primary"
    );
    (client, primary)
}

/// Behind Sentinel a lock's acquire and release go on the lanes' script
/// sockets, connected to the primary; after `SENTINEL FAILOVER` the lock
/// keeps working and the sockets move to the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_a_lock_goes_on_the_sockets_and_they_follow_a_failover() {
    let group = SentinelGroup::start(1).expect("sentinel group");
    let (client, primary) = client_on_the_sockets(&group, "follow").await;
    let state = client.state().clone();

    let new_primary = group.failover().expect("failover");
    assert_ne!(new_primary, primary);
    group.wait_settled().expect("settled");
    let want = [Some(new_primary.clone()), Some(new_primary.clone())];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last_token = None;
    loop {
        // Calls in the fail-over's wake may time out or be refused; a
        // grant, when it comes, has a token above every earlier one.
        if let Ok(Ok(guard)) =
            tokio::time::timeout(Duration::from_secs(5), client.lock("follow")).await
        {
            let token = guard.token();
            assert!(last_token < Some(token), "tokens go on increasing");
            last_token = Some(token);
            let _ = guard.release().await;
        }
        if state.redis.sockets_at() == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sockets never moved to {new_primary}: {:?}",
            state.redis.sockets_at()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // On the new primary, a whole cycle on the sockets.
    let guard = client.lock("follow").await.expect("lock");
    guard.release().await.expect("release");
    assert_eq!(state.redis.sockets_at(), want);
    client.shutdown().await;
}

/// Behind Sentinel, a primary demoted with its connections left open (an
/// operator's `REPLICAOF`; Sentinel's own fail-over closes them) answers
/// the socket's acquire `READONLY`: the sockets leave it, and do not come
/// back to it while it is a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_a_socket_answered_readonly_leaves_the_server() {
    let group = SentinelGroup::start(1).expect("sentinel group");
    let (client, primary) = client_on_the_sockets(&group, "demoted").await;
    let state = client.state().clone();
    let replica = group.replica_addrs().expect("replicas").remove(0);
    let (host, port) = replica.rsplit_once(':').expect("host:port");
    let node = group.node(&primary).expect("primary node");
    node.cmd_ok(&["REPLICAOF", host, port]).expect("REPLICAOF");
    let refused = client.lock("demoted").await;
    assert!(
        matches!(refused, Err(crate::Error::ReadOnly(_))),
        "fred's connection is on the demoted server too: {refused:?}"
    );
    assert_eq!(
        state.redis.sockets_at()[0],
        None,
        "the waiters' socket left the demoted server"
    );
    let _ = node.cmd_ok(&["REPLICAOF", "NO", "ONE"]);
    client.shutdown().await;
}

/// Sets a flag when woken: a hand-polled future's waker.
struct Woken(std::sync::atomic::AtomicBool);

impl std::task::Wake for Woken {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Behind Sentinel, `READONLY` answers read together (a burst on a
/// primary demoted with its connections left open) each close the
/// connection they came on, and only that one: the second caller, seen to
/// after a call has connected again, leaves the new connection open.
/// Before, each such answer closed the lane's socket whatever it was
/// connected to, and the calls on the new connection were lost and sent
/// again through fred.
#[tokio::test(flavor = "current_thread")]
async fn read_only_answers_close_only_the_connection_they_came_on() {
    use std::future::Future;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    let server = RedisServer::start().expect("redis-server");
    let sha = prepare(&server, "server");
    let refused = load(
        &server,
        "#!lua flags=no-writes\n\
         return redis.error_reply(\"READONLY You can't write against a read only replica.\")",
    );
    let (announce, _) = broadcast::channel(8);
    let endpoint = following(&announce);
    announce.send(announced(&server)).expect("announce");
    let target = target(&endpoint);
    let socket = ScriptSocket::new();
    assert_eq!(answered(where_runs(&socket, &target, &sha).await), "server");

    let call = EvalSha {
        sha: &refused,
        keys: &[],
        args: &[],
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let x_woken = Arc::new(Woken(std::sync::atomic::AtomicBool::new(false)));
    let x_waker = Waker::from(x_woken.clone());
    // Both commands wait out the pause and are answered in one write.
    server
        .cmd_ok(&["CLIENT", "PAUSE", "300", "ALL"])
        .expect("CLIENT PAUSE");
    let mut x = Box::pin(socket.call(&target, &call, Order::IfClear, deadline, None));
    assert!(x
        .as_mut()
        .poll(&mut Context::from_waker(&x_waker))
        .is_pending());
    let mut y = Box::pin(socket.call(&target, &call, Order::IfClear, deadline, None));
    assert!(y
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending());
    while !x_woken.0.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "x's reply never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match x.as_mut().poll(&mut Context::from_waker(&x_waker)) {
        Poll::Ready(Outcome::Answered(Err(error))) if error.starts_with("READONLY") => {}
        other => panic!("x is refused: {other:?}"),
    }
    assert_eq!(
        socket.connected_to(),
        None,
        "x's answer closed the connection it came on"
    );
    assert_eq!(answered(where_runs(&socket, &target, &sha).await), "server");
    match y.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Outcome::Answered(Err(error))) if error.starts_with("READONLY") => {}
        other => panic!("y's answer was read with x's: {other:?}"),
    }
    assert_eq!(
        socket.connected_to(),
        Some(server.addr()),
        "y's answer came on the closed connection: the one opened since stays open"
    );
}
