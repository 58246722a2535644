//! The script socket against a real redis-server: pipelined calls each
//! get their own reply, owed replies, callers dropped in a burst, a socket
//! closed by Redis, the URL's database, a refused connection, and
//! the calls of locks and permit sets that go on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fairlock_core::Reply;
use fairlock_testkit::RedisServer;

use super::super::grant_endpoint::{GrantEndpoint, GrantPlace};
use super::{EvalSha, Order, Outcome, ScriptSocket, SocketTarget};
use crate::test_waits::wait_until;

/// A script that answers its argument.
const ECHO: &str = "return ARGV[1]";

fn endpoint(server: &RedisServer) -> GrantEndpoint {
    let (_, never) = tokio::sync::broadcast::channel(1);
    GrantEndpoint::new(GrantPlace::Fixed(server.addr()), || never, None, None, None)
}

/// The socket's target at `endpoint`, no database selected.
pub(super) fn target(endpoint: &GrantEndpoint) -> SocketTarget<'_> {
    SocketTarget {
        endpoint,
        node: None,
        database: None,
        connect_timeout: Duration::from_secs(5),
    }
}

/// Loads `script` into the server; its SHA1.
pub(super) fn load(server: &RedisServer, script: &str) -> String {
    match server.cmd_ok(&["SCRIPT", "LOAD", script]).expect("load") {
        fairlock_testkit::Resp::Bulk(Some(sha)) => String::from_utf8(sha).expect("sha"),
        other => panic!("SCRIPT LOAD answered {other:?}"),
    }
}

fn eval<'a>(sha: &'a str, args: &'a [Vec<u8>]) -> EvalSha<'a> {
    EvalSha {
        sha,
        keys: &[],
        args,
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// The script's SHA1, an endpoint and a socket for `server`, kept for
/// the whole test so that spawned calls may borrow them.
fn leaked(server: &RedisServer) -> (&'static str, &'static GrantEndpoint, &'static ScriptSocket) {
    (
        Box::leak(load(server, ECHO).into_boxed_str()),
        Box::leak(Box::new(endpoint(server))),
        Box::leak(Box::new(ScriptSocket::new())),
    )
}

/// A call on `socket` that may go anywhere, asking for `args[0]`.
async fn ask(
    socket: &ScriptSocket,
    endpoint: &GrantEndpoint,
    sha: &str,
    args: &[Vec<u8>],
) -> Outcome {
    let call = eval(sha, args);
    socket
        .call(&target(endpoint), &call, Order::IfClear, soon(), None)
        .await
}

/// [`leaked`], the socket connected by a first call (calls that find
/// it connecting go through fred).
async fn connected(
    server: &RedisServer,
) -> (&'static str, &'static GrantEndpoint, &'static ScriptSocket) {
    let (sha, endpoint, socket) = leaked(server);
    let one = vec![b"one".to_vec()];
    let outcome = ask(socket, endpoint, sha, &one).await;
    assert_eq!(answered(outcome), "one", "connected by a first call");
    (sha, endpoint, socket)
}

/// `n` calls on `socket`, each in a task of its own, call `i` asking
/// for the answer `call-i`.
fn spawn_calls(
    socket: &'static ScriptSocket,
    endpoint: &'static GrantEndpoint,
    sha: &'static str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Outcome>> {
    (0..n)
        .map(|i| {
            tokio::spawn(async move {
                let args = vec![format!("call-{i}").into_bytes()];
                ask(socket, endpoint, sha, &args).await
            })
        })
        .collect()
}

fn answered(outcome: Outcome) -> String {
    match outcome {
        Outcome::Answered(Ok(Reply::Str(text))) => text,
        other => panic!("expected an answer, got {other:?}"),
    }
}

/// A call whose reply it stopped waiting for leaves that reply owed:
/// a call that must come after it is written behind it on the socket
/// and gets its own reply, not the owed one; a call that may go
/// anywhere is not sent while a reply is owed, and once it arrived
/// the socket is used again. The caller's flag says when its reply was
/// left unread. Redis is held up by `CLIENT PAUSE` (a script that
/// spins on `TIME` would not do: Valkey 8.1 freezes the time a
/// script sees).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_reply_is_owed_and_a_later_call_gets_its_own() {
    let server = RedisServer::start().expect("redis-server");
    let sha = load(&server, ECHO);
    let endpoint = endpoint(&server);
    let target = target(&endpoint);
    let socket = ScriptSocket::new();
    let arg = |answer: &str| vec![answer.as_bytes().to_vec()];
    let soon = || Instant::now() + Duration::from_secs(5);
    let pause = |ms: &str| {
        server
            .cmd_ok(&["CLIENT", "PAUSE", ms, "ALL"])
            .expect("pause");
    };

    let first = arg("first");
    let flag = AtomicBool::new(false);
    let outcome = socket
        .call(
            &target,
            &eval(&sha, &first),
            Order::IfClear,
            soon(),
            Some(&flag),
        )
        .await;
    assert_eq!(answered(outcome), "first");
    assert!(
        !flag.load(Ordering::SeqCst),
        "an answered call is not unanswered"
    );

    // Its deadline passes while Redis holds it: the reply is owed.
    pause("1000");
    let slow = arg("slow");
    let deadline = Instant::now() + Duration::from_millis(50);
    let outcome = socket
        .call(
            &target,
            &eval(&sha, &slow),
            Order::IfClear,
            deadline,
            Some(&flag),
        )
        .await;
    assert!(matches!(outcome, Outcome::TimedOut), "{outcome:?}");
    assert!(flag.load(Ordering::SeqCst), "its reply was left unread");

    // Redis still holds it: a call that may go anywhere is not sent.
    let other = arg("other");
    let outcome = socket
        .call(&target, &eval(&sha, &other), Order::IfClear, soon(), None)
        .await;
    assert!(matches!(outcome, Outcome::NotSent), "{outcome:?}");

    // One that must follow it goes behind it, and gets its own reply.
    let after = arg("after");
    let outcome = socket
        .call(
            &target,
            &eval(&sha, &after),
            Order::AfterSocket,
            soon(),
            None,
        )
        .await;
    assert_eq!(answered(outcome), "after");

    // A call dropped while it waits leaves its reply owed too.
    pause("300");
    let dropped = arg("dropped");
    let flag = AtomicBool::new(false);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        socket.call(
            &target,
            &eval(&sha, &dropped),
            Order::IfClear,
            soon(),
            Some(&flag),
        ),
    )
    .await;
    assert!(gave_up.is_err(), "the held call was still waiting");
    assert!(flag.load(Ordering::SeqCst), "its reply was left unread");
    // Once the owed reply has arrived (seen by a later call's look at
    // the socket, not waited for), the socket takes calls again; a call
    // never gets the owed reply for its own.
    let last = arg("last");
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let outcome = socket
            .call(&target, &eval(&sha, &last), Order::IfClear, soon(), None)
            .await;
        match outcome {
            Outcome::NotSent if Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            outcome => {
                assert_eq!(answered(outcome), "last");
                break;
            }
        }
    }
}

/// Calls made at once share the socket: written one behind another
/// and each answered with its own reply, many in flight at a time,
/// none sent through fred. Redis is held by `CLIENT PAUSE` so that
/// every call is written before the first is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_at_once_are_pipelined_and_each_gets_its_own_reply() {
    let server = RedisServer::start().expect("redis-server");
    let (sha, endpoint, socket) = connected(&server).await;
    server
        .cmd_ok(&["CLIENT", "PAUSE", "300", "ALL"])
        .expect("pause");
    let tasks = spawn_calls(socket, endpoint, sha, 400);
    for (i, task) in tasks.into_iter().enumerate() {
        let outcome = task.await.expect("task");
        assert_eq!(answered(outcome), format!("call-{i}"));
    }
    let most = socket.most_in_flight();
    assert!(most > 100, "at most {most} calls were in flight at once");
    assert!(socket.is_connected());
}

/// Callers that stop waiting in the middle of a burst, among them the
/// first, which reads for the others, leave their replies owed:
/// every other caller still gets its own reply, and once the owed
/// replies are read the socket takes calls that may go anywhere again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_dropped_in_a_burst_leave_the_others_their_own_replies() {
    let server = RedisServer::start().expect("redis-server");
    let (sha, endpoint, socket) = connected(&server).await;
    server
        .cmd_ok(&["CLIENT", "PAUSE", "400", "ALL"])
        .expect("pause");
    let tasks = spawn_calls(socket, endpoint, sha, 300);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(socket.most_in_flight() > 100, "the burst is in flight");
    for task in tasks.iter().step_by(3) {
        task.abort();
    }
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await {
            Ok(outcome) => {
                assert!(i % 3 != 0, "call {i} was aborted, and answered {outcome:?}");
                assert_eq!(answered(outcome), format!("call-{i}"));
            }
            Err(error) => assert!(error.is_cancelled() && i % 3 == 0, "call {i}: {error}"),
        }
    }
    let last = vec![b"last".to_vec()];
    let outcome = ask(socket, endpoint, sha, &last).await;
    assert_eq!(answered(outcome), "last", "no reply is owed any more");
}

/// A socket Redis closes in the middle of a burst: every call is either
/// answered with its own reply or lost (sent again through fred by its
/// caller), never another's reply, and the next call connects afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_closed_in_a_burst_loses_calls_but_never_mixes_replies() {
    let server = RedisServer::start().expect("redis-server");
    let (sha, endpoint, socket) = connected(&server).await;
    let tasks = spawn_calls(socket, endpoint, sha, 2_000);
    server
        .cmd_ok(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
        .expect("kill");
    let mut lost = 0;
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await.expect("task") {
            Outcome::Lost | Outcome::NotSent => lost += 1,
            outcome => assert_eq!(answered(outcome), format!("call-{i}")),
        }
    }
    eprintln!("{lost} of 2000 calls lost or not sent");
    let last = vec![b"last".to_vec()];
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let outcome = ask(socket, endpoint, sha, &last).await;
        match outcome {
            // Lost: the first call after the kill finds the socket
            // closed; NotSent: the reconnect pause after a failed one.
            Outcome::Lost | Outcome::NotSent if Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            outcome => {
                assert_eq!(answered(outcome), "last");
                break;
            }
        }
    }
}

/// A socket that Redis closed runs nothing more: a call that finds it
/// so is lost (sent again through fred by the caller), and the next one
/// connects afresh. After `close`, nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_redis_closed_is_opened_again() {
    let server = RedisServer::start().expect("redis-server");
    let endpoint = endpoint(&server);
    let target = target(&endpoint);
    let sha = load(&server, ECHO);
    let args = vec![b"hi".to_vec()];
    let call = EvalSha {
        sha: &sha,
        keys: &[],
        args: &args,
    };
    let soon = || Instant::now() + Duration::from_secs(5);
    let socket = ScriptSocket::new();
    let outcome = socket.call(&target, &call, Order::IfClear, soon(), None);
    assert_eq!(answered(outcome.await), "hi");
    assert!(socket.is_connected());
    server
        .cmd_ok(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
        .expect("kill");
    let outcome = socket
        .call(&target, &call, Order::IfClear, soon(), None)
        .await;
    assert!(matches!(outcome, Outcome::Lost), "{outcome:?}");
    assert!(!socket.is_connected());
    let outcome = socket.call(&target, &call, Order::IfClear, soon(), None);
    assert_eq!(answered(outcome.await), "hi");
    socket.close(Duration::from_secs(1)).await;
    let outcome = socket
        .call(&target, &call, Order::IfClear, soon(), None)
        .await;
    assert!(matches!(outcome, Outcome::NotSent), "{outcome:?}");
}

/// A lock's acquire and release go on the lanes' sockets (the
/// waiters' and the holders'), in the URL's database; switched off,
/// neither socket is opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_cycle_goes_on_the_sockets_in_the_urls_database() {
    let server = RedisServer::start().expect("redis-server");
    let url = format!("{}/3", server.url().trim_end_matches('/'));
    let client = crate::LockClient::connect(&url).await.expect("client");
    let state = client.state().clone();
    assert_eq!(state.redis.sockets_connected(), [false, false]);
    // The first cycle finds the scripts missing: fred's path loads them.
    let guard = client.lock("direct").await.expect("lock");
    assert_eq!(state.redis.sockets_connected(), [true, false]);
    guard.release().await.expect("release");
    assert_eq!(state.redis.sockets_connected(), [true, true]);
    // Written by the socket's acquire, read through fred: one database,
    // not the server's first.
    server.cmd_ok(&["FLUSHALL"]).expect("flush");
    let guard = client.lock("direct").await.expect("lock");
    let seen = client.inspect("direct").await.expect("inspect");
    assert!(seen.owner.is_some(), "the lock is held in database 3");
    assert_eq!(
        server.cmd_ok(&["DBSIZE"]).expect("dbsize"),
        fairlock_testkit::Resp::Int(0),
        "nothing written to database 0"
    );
    guard.release().await.expect("release");
    assert!(client
        .inspect("direct")
        .await
        .expect("inspect")
        .owner
        .is_none());
    client.shutdown().await;
    assert_eq!(state.redis.sockets_connected(), [false, false]);

    let config = crate::ClientConfig::builder(server.url())
        .direct_calls(false)
        .build()
        .expect("config");
    let client = crate::LockClient::with_config(config)
        .await
        .expect("client");
    let state = client.state().clone();
    client
        .lock("direct")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    assert_eq!(state.redis.sockets_connected(), [false, false]);
    client.shutdown().await;
}

/// A server that refuses the connection (at its `maxclients`, it writes
/// an error and closes) fails the connect, and the call goes through
/// fred; the call itself is never answered with that error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_sends_the_call_through_fred() {
    let server = RedisServer::start().expect("redis-server");
    let endpoint = endpoint(&server);
    let target = target(&endpoint);
    let _only_client = std::net::TcpStream::connect(server.addr()).expect("connect");
    server
        .cmd_ok(&["CONFIG", "SET", "maxclients", "1"])
        .expect("maxclients");
    let args = vec![b"hi".to_vec()];
    let call = eval("0000000000000000000000000000000000000000", &args);
    let socket = ScriptSocket::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let outcome = socket
        .call(&target, &call, Order::IfClear, deadline, None)
        .await;
    assert!(matches!(outcome, Outcome::NotSent), "{outcome:?}");
    assert!(!socket.is_connected());
}

/// Holds Redis with `CLIENT PAUSE` and drops `acquire` (a waiter of a
/// held lock or permit set) while its reply on the waiters' socket is
/// unread; then waits (bounded) until its cancel was written behind it
/// on that socket and the queue at `queue_key` is empty again.
async fn drop_an_acquire_held_by_a_pause<T>(
    server: &RedisServer,
    state: &crate::state::ClientState,
    acquire: impl std::future::Future<Output = T>,
    queue_key: &str,
) {
    server
        .cmd_ok(&["CLIENT", "PAUSE", "500", "ALL"])
        .expect("pause");
    let waited = tokio::time::timeout(Duration::from_millis(100), acquire).await;
    assert!(waited.is_err(), "the acquire was held by the pause");
    let deadline = Instant::now() + Duration::from_secs(10);
    while state.redis.written_after_socket() == 0 {
        assert!(
            Instant::now() < deadline,
            "no cancel written behind the acquire"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queued = server.cmd_ok(&["ZCARD", queue_key]).expect("zcard");
        if queued == fairlock_testkit::Resp::Int(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped acquire left {queued:?} queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An acquire dropped while its reply on the waiters' socket is unread
/// (Redis held by `CLIENT PAUSE`) is cancelled behind it on that
/// socket, not through fred, where the cancel could run first; the
/// queue ends empty and the lock goes on to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquires_cancel_goes_behind_it_on_the_socket() {
    let server = RedisServer::start().expect("redis-server");
    let client = crate::LockClient::connect(&server.url())
        .await
        .expect("client");
    let state = client.state().clone();
    // Scripts loaded, sockets open.
    client
        .lock("q")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    let holder = client.lock("q").await.expect("holder");
    drop_an_acquire_held_by_a_pause(&server, &state, client.lock("q"), "fairlock:{q}:queue").await;
    holder.release().await.expect("release");
    assert!(client.inspect("q").await.expect("inspect").owner.is_none());
    assert_eq!(state.redis.written_after_socket(), 1);
    client.shutdown().await;
}

/// With a waiter of `state`'s client queued and idle on the lock or permit
/// set whose liveness zset is `alive`: its heartbeats go on the waiters'
/// socket (which takes calls, one per round) and keep the waiter alive
/// from there past two waiter timeouts (its process's deadline on the
/// lock is ahead of the server's clock).
async fn assert_heartbeats_on_the_waiters_socket(
    server: &RedisServer,
    state: &crate::state::ClientState,
    alive: &str,
) {
    let before = state.redis.socket_calls()[0];
    wait_until("heartbeat calls on the waiters' socket", || {
        state.redis.socket_calls()[0] >= before + 2
    })
    .await;
    // Two waiter timeouts more without a word from the waiter itself.
    tokio::time::sleep(state.config.waiter_timeout * 2).await;
    let entries = server
        .cmd(&["ZRANGE", alive, "0", "-1", "WITHSCORES"])
        .expect("ZRANGE");
    let deadline: u64 = match entries.as_array() {
        Some([_, score]) => score.as_str().and_then(|s| s.parse().ok()),
        _ => None,
    }
    .unwrap_or_else(|| panic!("one live process on {alive}: {entries:?}"));
    let time = server.cmd(&["TIME"]).expect("TIME");
    let number = |v: &fairlock_testkit::Resp| v.as_str()?.parse::<u64>().ok();
    let now_ms = match time.as_array() {
        Some([seconds, micros]) => number(seconds).zip(number(micros)),
        _ => None,
    }
    .map(|(seconds, micros)| seconds * 1_000 + micros / 1_000)
    .expect("TIME");
    assert!(
        deadline > now_ms,
        "the waiter's process was let lapse: {deadline} <= {now_ms}"
    );
}

/// A client whose waiter heartbeat runs every 100 ms, a waiter taken for
/// dead after a second without one.
async fn beating_client(server: &RedisServer) -> crate::LockClient {
    let mut config = crate::ClientConfig::new(server.url());
    config.heartbeat_interval = Duration::from_millis(100);
    config.waiter_timeout = Duration::from_secs(1);
    crate::LockClient::with_config(config)
        .await
        .expect("client")
}

/// A lock's waiter heartbeat goes on the waiters' socket, as the
/// waiter's acquire did, and keeps the waiter alive from there. Before,
/// the heartbeat went through fred, cloning its batch's keys and
/// arguments into fred's types (a few percent of the client's CPU where a
/// process waits on many locks), and the socket took none. (With the
/// heartbeat's keys sent in the wrong order the waiter lapsed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_goes_on_the_waiters_socket() {
    let server = RedisServer::start().expect("redis-server");
    let client = beating_client(&server).await;
    let holder = client.lock("beat").await.expect("holder");
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move { client.lock("beat").await.map(|guard| guard.token()) })
    };
    wait_until("the waiter is queued", || client.stats().queued == 1).await;
    assert_heartbeats_on_the_waiters_socket(&server, client.state(), "fairlock:{beat}:alive").await;
    holder.release().await.expect("release");
    waiter.await.expect("task").expect("the waiter is granted");
    client.shutdown().await;
}

/// A semaphore's waiter heartbeat goes on the waiters' socket too, and
/// keeps its waiter alive from there (before, through fred: the socket
/// took no call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_heartbeat_goes_on_the_waiters_socket() {
    let server = RedisServer::start().expect("redis-server");
    let client = beating_client(&server).await;
    let semaphore = client.semaphore("beat", 1).expect("semaphore");
    let holder = semaphore.acquire().await.expect("holder");
    let waiter = {
        let semaphore = semaphore.clone();
        tokio::spawn(async move { semaphore.acquire().await.map(|permit| permit.token()) })
    };
    wait_until("the waiter is queued", || client.stats().queued == 1).await;
    assert_heartbeats_on_the_waiters_socket(&server, client.state(), "fairlock:{beat}:sem:alive")
        .await;
    holder.release().await.expect("release");
    waiter.await.expect("task").expect("the waiter is granted");
    client.shutdown().await;
}

/// A semaphore's acquire and release go on the lanes' sockets as a
/// lock's do (before, every permit call went through fred).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_cycle_goes_on_the_sockets() {
    let server = RedisServer::start().expect("redis-server");
    let client = crate::LockClient::connect(&server.url())
        .await
        .expect("client");
    let state = client.state().clone();
    let semaphore = client.semaphore("direct", 2).expect("semaphore");
    let permit = semaphore.acquire().await.expect("permit");
    assert_eq!(state.redis.sockets_connected(), [true, false]);
    permit.release().await.expect("release");
    assert_eq!(state.redis.sockets_connected(), [true, true]);
    client.shutdown().await;
}

/// A permit acquire dropped while its reply on the waiters' socket is
/// unread (Redis held by `CLIENT PAUSE`) is cancelled behind it on that
/// socket, as a lock's is: the queue ends empty, and the permit the
/// holder gives back is free for the next caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_permit_acquires_cancel_goes_behind_it_on_the_socket() {
    let server = RedisServer::start().expect("redis-server");
    let client = crate::LockClient::connect(&server.url())
        .await
        .expect("client");
    let state = client.state().clone();
    let semaphore = client.semaphore("q", 1).expect("semaphore");
    // Scripts loaded, sockets open.
    semaphore
        .acquire()
        .await
        .expect("permit")
        .release()
        .await
        .expect("release");
    let holder = semaphore.acquire().await.expect("holder");
    drop_an_acquire_held_by_a_pause(
        &server,
        &state,
        semaphore.acquire(),
        "fairlock:{q}:sem:queue",
    )
    .await;
    holder.release().await.expect("release");
    let next = semaphore.try_acquire().await.expect("try");
    assert!(next.is_some(), "the permit went to nobody");
    assert_eq!(state.redis.written_after_socket(), 1);
    next.expect("permit").release().await.expect("release");
    client.shutdown().await;
}

/// One read that holds valid replies and then a malformed one (here an
/// array nested deeper than the reader takes): the callers answered by
/// that read are woken, not left to their deadline (10 s here). Before,
/// the malformed reply's error discarded the wake-ups collected for the
/// replies before it, and the second caller returned at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_reply_still_wakes_the_callers_answered_before_it() {
    let server = RedisServer::start().expect("redis-server");
    let (sha, endpoint, socket) = connected(&server).await;
    let deep: &'static str = Box::leak(load(&server, "return {{{{{1}}}}}").into_boxed_str());
    // Held by Redis until the three are written, then answered in one go.
    server
        .cmd_ok(&["CLIENT", "PAUSE", "400", "ALL"])
        .expect("CLIENT PAUSE");
    let first = tokio::spawn(async move { ask(socket, endpoint, sha, &[b"1".to_vec()]).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tokio::spawn(async move { ask(socket, endpoint, sha, &[b"2".to_vec()]).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let malformed = tokio::spawn(async move { ask(socket, endpoint, deep, &[]).await });
    for call in [first, malformed] {
        let _ = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("ends");
    }
    let second = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second caller is woken well before its 10 s deadline")
        .expect("task");
    assert!(
        matches!(second, Outcome::Answered(Ok(_)) | Outcome::Lost),
        "{second:?}"
    );
}

/// Sets a flag when woken: a hand-polled future's waker.
struct WokenFlag(AtomicBool);

impl std::task::Wake for WokenFlag {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The caller woken to read next (y) has its reply read for it by a
/// call that first reads the replies owed (w, `Order::IfClear`): the
/// reading must still pass on to the caller waiting behind (z), not sit
/// in the socket with nobody woken to take it. Before, z slept until its
/// deadline, though its reply had come.
#[tokio::test(flavor = "current_thread")]
async fn reading_owed_replies_passes_the_reading_on() {
    use std::future::Future;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    let server = RedisServer::start().expect("redis-server");
    let (sha, endpoint, socket) = connected(&server).await;
    // Runs while writes are paused; `sha`'s script does not.
    let read_only: &'static str =
        Box::leak(load(&server, "#!lua flags=no-writes\nreturn ARGV[1]").into_boxed_str());
    let target: &'static SocketTarget<'static> = Box::leak(Box::new(target(endpoint)));
    let call = |sha: &'static str, arg: &str| -> &'static EvalSha<'static> {
        let args: &'static [Vec<u8>] = Box::leak(vec![arg.as_bytes().to_vec()].into_boxed_slice());
        Box::leak(Box::new(EvalSha {
            sha,
            keys: &[],
            args,
        }))
    };
    let (x_woken, y_woken) = (
        Arc::new(WokenFlag(AtomicBool::new(false))),
        Arc::new(WokenFlag(AtomicBool::new(false))),
    );
    let (x_waker, y_waker) = (Waker::from(x_woken.clone()), Waker::from(y_woken.clone()));
    server
        .cmd_ok(&["CLIENT", "PAUSE", "1500", "WRITE"])
        .expect("CLIENT PAUSE");
    let mut x = Box::pin(socket.call(target, call(read_only, "x"), Order::IfClear, soon(), None));
    assert!(
        x.as_mut()
            .poll(&mut Context::from_waker(&x_waker))
            .is_pending(),
        "x reads"
    );
    let mut y = Box::pin(socket.call(target, call(read_only, "y"), Order::IfClear, soon(), None));
    assert!(y
        .as_mut()
        .poll(&mut Context::from_waker(&y_waker))
        .is_pending());
    // a: held by the pause, its caller gone: its reply is owed.
    let mut a = Box::pin(socket.call(target, call(sha, "a"), Order::IfClear, soon(), None));
    assert!(a
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending());
    drop(a);
    let z = tokio::spawn(async move {
        socket
            .call(
                target,
                call(read_only, "z"),
                Order::AfterSocket,
                soon(),
                None,
            )
            .await
    });
    // z written; x's and y's replies in.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(x);
    assert!(y_woken.0.load(Ordering::SeqCst), "y woken to read");
    let mut w = Box::pin(socket.call(target, call(read_only, "w"), Order::IfClear, soon(), None));
    match w.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Outcome::NotSent) => {}
        other => panic!("w, with a reply owed, goes through fred: {other:?}"),
    }
    assert!(
        matches!(
            y.as_mut().poll(&mut Context::from_waker(&y_waker)),
            Poll::Ready(Outcome::Answered(_))
        ),
        "y's reply was read for it"
    );
    let z = tokio::time::timeout(Duration::from_secs(5), z)
        .await
        .expect("z is woken once the pause ends, well before its 10 s deadline")
        .expect("task");
    assert!(matches!(z, Outcome::Answered(Ok(_))), "{z:?}");
}
