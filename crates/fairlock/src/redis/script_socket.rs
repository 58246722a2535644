//! A command socket of fairlock's own for the hot path's script calls (a
//! lock's acquire and release), written and read by the calling task
//! itself.
//!
//! A call through fred crosses tasks twice: the caller hands it to fred's
//! connection task, which writes it, reads the reply and hands that back.
//! On a multi-threaded runtime each crossing wakes a parked worker: 4
//! context switches and about 15-20 µs per call on an idle local server
//! (a fred `PING` took 39-44 µs, the same `PING` written and read by the
//! calling task 24-30 µs, on 2 workers). Here the caller writes the
//! command and reads its reply on the socket: the reply wakes the caller
//! and nobody else.
//!
//! One call at a time per socket, one socket per command lane: a call that
//! finds its lane's socket busy goes on the lane's fred connection as
//! before, so a burst is never queued here. Order is what a lane's
//! callers rely on, and both paths keep it where it matters:
//! - a call whose reply it stopped waiting for (its timeout, or its future
//!   dropped) leaves the reply owed; the socket is not closed, since Redis
//!   may still run the command. Calls that find replies owed go to fred,
//!   except one that must run after the call that left them ([`Order`]): it
//!   is written behind it on this socket, which Redis reads in order (an
//!   acquire's cancel, see `acquire.rs`).
//! - a socket that Redis closed, or that failed, runs nothing more, so
//!   nothing written to it can overtake what comes after. The exception:
//!   a write that cannot finish by its deadline closes the socket from
//!   this side, and replies owed on it may then still run after a cancel
//!   sent through fred (Redis must have stopped reading the socket while a
//!   send buffer of a megabyte or so filled, which one small call at a
//!   time does not do; the README states it).
//!
//! Used on a single server only, plain TCP or TLS (see
//! [`RedisConnection::connect`](super::RedisConnection::connect)); behind
//! Sentinel, on a cluster, with replica acknowledgement (a `WAIT` covers
//! fred's connections only) and for RedLock every call goes through fred.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex as StdMutex;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use fairlock_core::Reply;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Mutex, MutexGuard};

use super::grant_endpoint::GrantEndpoint;
use crate::grant_stream::GrantStream;
use crate::resp2;

/// After a connect that failed, calls go through fred for this long before
/// the next attempt (a server that is down is not asked on every call).
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// Bytes kept for replies; a lock script's reply is far smaller.
const BUFFER: usize = 512;

/// Whether a call may go on the socket, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// If the socket is free and owes no reply; else through fred.
    IfFree,
    /// Behind everything written to the socket, waiting for it: the call
    /// must run after one that went on the socket and whose reply was
    /// never read. Through fred if the socket is closed (nothing written
    /// to it runs any more).
    AfterSocket,
}

/// How a call on the socket ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Redis answered: a reply, or an error reply's text.
    Answered(Result<Reply, String>),
    /// Not written (the socket busy, owing replies, or not connected): the
    /// call goes through fred.
    NotSent,
    /// Written, and the socket failed before the reply came: the call may
    /// have run; it is sent again through fred (every script sent here is
    /// safe to run twice).
    Lost,
    /// No reply by the deadline (it is owed; see the module docs); or, for
    /// [`Order::AfterSocket`], the socket stayed busy until then.
    TimedOut,
}

/// Where the socket connects and how it logs in.
pub(crate) struct SocketTarget<'a> {
    /// The single server's address, TLS and credentials.
    pub(crate) endpoint: &'a GrantEndpoint,
    /// The URL's database, selected on connect.
    pub(crate) database: Option<u8>,
    /// Limit for connecting and logging in.
    pub(crate) connect_timeout: Duration,
}

/// One command lane's socket (see the module docs).
pub(crate) struct ScriptSocket {
    slot: Mutex<Slot>,
    /// No connect before this, after one failed.
    pause_until: StdMutex<Option<Instant>>,
    /// Set by [`ScriptSocket::close`]: nothing is sent any more.
    closed: AtomicBool,
    /// Calls written in [`Order::AfterSocket`] (for tests).
    #[cfg(test)]
    written_after: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Slot {
    connection: Option<Connection>,
    /// Replies of calls that stopped waiting, to be read and dropped before
    /// the next call's own.
    owed: usize,
}

impl Slot {
    /// The socket failed: what was written to it and not answered never
    /// runs now, or has run.
    fn lose(&mut self) {
        self.connection = None;
        self.owed = 0;
    }
}

struct Connection {
    stream: GrantStream,
    /// Read and not parsed yet.
    buf: Vec<u8>,
    /// The command being written (kept: no allocation per call).
    out: Vec<u8>,
}

/// A script call as written: `EVALSHA sha numkeys keys... args...`.
pub(crate) struct EvalSha<'a> {
    pub(crate) sha: &'a str,
    pub(crate) keys: &'a [&'a str],
    pub(crate) args: &'a [Vec<u8>],
}

impl EvalSha<'_> {
    fn write_to(&self, out: &mut Vec<u8>) {
        let numkeys = self.keys.len().to_string();
        let head = [
            b"EVALSHA".as_slice(),
            self.sha.as_bytes(),
            numkeys.as_bytes(),
        ];
        let args = head
            .into_iter()
            .chain(self.keys.iter().map(|key| key.as_bytes()))
            .chain(self.args.iter().map(Vec::as_slice));
        resp2::command_of(out, 3 + self.keys.len() + self.args.len(), args);
    }
}

/// Where a call on the socket stands, for when its future is dropped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Part of the command may be on the wire: the socket cannot be used
    /// again (what follows would be read as the rest of it).
    Writing,
    /// Written; the reply is owed if nobody reads it.
    Awaiting,
    Done,
}

/// A call holding the socket; dropped mid-call it leaves the socket in a
/// state the next call can use (see [`Phase`]).
struct InFlight<'a> {
    slot: MutexGuard<'a, Slot>,
    phase: Phase,
    /// The caller's record that its call sits on the socket unanswered.
    unanswered: Option<&'a AtomicBool>,
}

impl InFlight<'_> {
    /// The call ended with its reply read, or with the socket lost.
    fn end(&mut self, outcome: Outcome) -> Outcome {
        self.phase = Phase::Done;
        if let Some(flag) = self.unanswered {
            flag.store(false, Ordering::SeqCst);
        }
        outcome
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        match self.phase {
            Phase::Writing => self.slot.lose(),
            Phase::Awaiting => self.slot.owed += 1,
            Phase::Done => {}
        }
    }
}

impl ScriptSocket {
    pub(crate) fn new() -> Self {
        Self {
            slot: Mutex::new(Slot::default()),
            pause_until: StdMutex::new(None),
            closed: AtomicBool::new(false),
            #[cfg(test)]
            written_after: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Runs `call` on the socket, answered by `deadline`, in `order`.
    /// `unanswered`, if given, is set while the call sits on the socket
    /// without its reply read, and stays set if its reply is left owed:
    /// the caller's later call that must follow it then goes
    /// [`Order::AfterSocket`].
    pub(crate) async fn call(
        &self,
        target: &SocketTarget<'_>,
        call: &EvalSha<'_>,
        order: Order,
        deadline: Instant,
        unanswered: Option<&AtomicBool>,
    ) -> Outcome {
        if self.closed.load(Ordering::SeqCst) {
            return Outcome::NotSent;
        }
        let mut slot = match order {
            Order::IfFree => match self.slot.try_lock() {
                Ok(slot) => slot,
                Err(_) => return Outcome::NotSent,
            },
            Order::AfterSocket => {
                match tokio::time::timeout_at(deadline.into(), self.slot.lock()).await {
                    Ok(slot) => slot,
                    Err(_) => return Outcome::TimedOut,
                }
            }
        };
        if order == Order::IfFree {
            if slot.owed > 0 && !read_owed_now(&mut slot) {
                return Outcome::NotSent;
            }
            if slot.connection.is_none() {
                slot.connection = self.connect(target).await;
            }
        }
        if slot.connection.is_none() || self.closed.load(Ordering::SeqCst) {
            return Outcome::NotSent;
        }
        if let Some(flag) = unanswered {
            flag.store(true, Ordering::SeqCst);
        }
        #[cfg(test)]
        if order == Order::AfterSocket {
            self.written_after.fetch_add(1, Ordering::SeqCst);
        }
        let mut flight = InFlight {
            slot,
            phase: Phase::Writing,
            unanswered,
        };
        let Some(connection) = flight.slot.connection.as_mut() else {
            return flight.end(Outcome::NotSent);
        };
        connection.out.clear();
        call.write_to(&mut connection.out);
        let written = tokio::time::timeout_at(deadline.into(), async {
            connection.stream.write_all(&connection.out).await?;
            // TLS keeps written bytes in its session until flushed.
            connection.stream.flush().await
        })
        .await;
        match written {
            Ok(Ok(())) => flight.phase = Phase::Awaiting,
            // Failed or timed out part-way: what was written never runs
            // (Redis waits for the rest of the command, then sees the
            // socket close), so the call goes through fred.
            _ => {
                flight.slot.lose();
                return flight.end(Outcome::Lost);
            }
        }
        loop {
            let Some(Connection { stream, buf, .. }) = flight.slot.connection.as_mut() else {
                return flight.end(Outcome::Lost);
            };
            match resp2::reply(buf) {
                Ok(Some((reply, used))) => {
                    buf.drain(..used);
                    if flight.slot.owed > 0 {
                        flight.slot.owed -= 1;
                        continue;
                    }
                    return flight.end(Outcome::Answered(reply));
                }
                Ok(None) => {}
                Err(malformed) => {
                    tracing::warn!(
                        error = malformed.0,
                        "fairlock's script socket read a malformed reply; closing it"
                    );
                    flight.slot.lose();
                    return flight.end(Outcome::Lost);
                }
            }
            match tokio::time::timeout_at(deadline.into(), stream.read_buf(buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) => {
                    flight.slot.lose();
                    return flight.end(Outcome::Lost);
                }
                // Left owed, by the Drop of `flight` (still `Awaiting`);
                // the caller's flag stays set.
                Err(_) => return Outcome::TimedOut,
            }
        }
    }

    /// Connects and logs in, within the connect timeout; `None` (and no
    /// attempt for [`RECONNECT_PAUSE`]) if that fails.
    async fn connect(&self, target: &SocketTarget<'_>) -> Option<Connection> {
        let now = Instant::now();
        {
            let mut pause = self.pause_until.lock().unwrap_or_else(|p| p.into_inner());
            if pause.is_some_and(|until| now < until) {
                return None;
            }
            *pause = None;
        }
        let opened = tokio::time::timeout(target.connect_timeout, open(target)).await;
        match opened {
            Ok(Ok(connection)) => Some(connection),
            failed => {
                let reason = match failed {
                    Ok(Err(reason)) => reason,
                    _ => "no answer within the connect timeout".to_owned(),
                };
                tracing::debug!(%reason, "fairlock's script socket could not connect; calls go through fred meanwhile");
                *self.pause_until.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(now + RECONNECT_PAUSE);
                None
            }
        }
    }

    /// Closes the socket: later calls go through fred (which a closing
    /// client refuses). Waits at most `timeout` for a call on it to end.
    pub(crate) async fn close(&self, timeout: Duration) {
        self.closed.store(true, Ordering::SeqCst);
        if let Ok(mut slot) = tokio::time::timeout(timeout, self.slot.lock()).await {
            slot.lose();
        }
    }

    /// How many calls were written behind the socket's owed replies
    /// ([`Order::AfterSocket`]).
    #[cfg(test)]
    pub(crate) fn written_after(&self) -> usize {
        self.written_after.load(Ordering::SeqCst)
    }

    /// Whether the socket is connected now (for tests).
    #[cfg(test)]
    pub(crate) fn is_connected(&self) -> bool {
        self.slot
            .try_lock()
            .is_ok_and(|slot| slot.connection.is_some())
    }
}

/// Reads the replies owed that have arrived, without waiting; whether none
/// is owed now (a socket found closed owes none).
fn read_owed_now(slot: &mut Slot) -> bool {
    while slot.owed > 0 {
        let Some(Connection { stream, buf, .. }) = slot.connection.as_mut() else {
            slot.owed = 0;
            break;
        };
        match resp2::reply(buf) {
            Ok(Some((_, used))) => {
                buf.drain(..used);
                slot.owed -= 1;
                continue;
            }
            Ok(None) => {}
            Err(_) => {
                slot.lose();
                break;
            }
        }
        // One poll: the bytes the socket has now, if any.
        let mut context = Context::from_waker(Waker::noop());
        match pin!(stream.read_buf(buf)).poll(&mut context) {
            Poll::Ready(Ok(n)) if n > 0 => {}
            Poll::Ready(_) => slot.lose(),
            Poll::Pending => return false,
        }
    }
    true
}

/// Opens the connection: TCP (and TLS), then `AUTH` and `SELECT` as the
/// URL asks (or a `PING`), in one write, and reads their answers.
async fn open(target: &SocketTarget<'_>) -> Result<Connection, String> {
    let endpoint = target.endpoint;
    let address = endpoint
        .address()
        .ok_or_else(|| "no server address".to_owned())?;
    let stream = GrantStream::connect(&address, endpoint.tls())
        .await
        .map_err(|e| e.to_string())?;
    let mut connection = Connection {
        stream,
        buf: Vec::with_capacity(BUFFER),
        out: Vec::with_capacity(BUFFER),
    };
    let mut answers = 0;
    let out = &mut connection.out;
    match (&endpoint.username, &endpoint.password) {
        (Some(user), Some(password)) => {
            resp2::command(out, &[b"AUTH", user.as_bytes(), password.as_bytes()]);
            answers += 1;
        }
        (None, Some(password)) => {
            resp2::command(out, &[b"AUTH", password.as_bytes()]);
            answers += 1;
        }
        _ => {}
    }
    if let Some(database) = target.database.filter(|&db| db != 0) {
        resp2::command(out, &[b"SELECT", database.to_string().as_bytes()]);
        answers += 1;
    }
    if answers == 0 {
        // Answered before the socket takes a call: a server that refuses
        // the connection (at its `maxclients`, it writes an error and
        // closes) fails the connect, not the call.
        resp2::command(out, &[b"PING"]);
        answers += 1;
    }
    let io = |e: std::io::Error| e.to_string();
    connection
        .stream
        .write_all(&connection.out)
        .await
        .map_err(io)?;
    connection.stream.flush().await.map_err(io)?;
    while answers > 0 {
        match resp2::reply(&connection.buf).map_err(|m| m.0.to_owned())? {
            Some((Ok(_), used)) => {
                connection.buf.drain(..used);
                answers -= 1;
            }
            Some((Err(error), _)) => return Err(format!("Redis refused the login: {error}")),
            None => {
                if connection
                    .stream
                    .read_buf(&mut connection.buf)
                    .await
                    .map_err(io)?
                    == 0
                {
                    return Err("Redis closed the connection".to_owned());
                }
            }
        }
    }
    Ok(connection)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use fairlock_core::Reply;
    use fairlock_testkit::RedisServer;

    use super::super::grant_endpoint::{GrantEndpoint, GrantPlace};
    use super::{EvalSha, Order, Outcome, ScriptSocket, SocketTarget};

    /// A script that answers its argument.
    const ECHO: &str = "return ARGV[1]";

    fn endpoint(server: &RedisServer) -> GrantEndpoint {
        let (_, never) = tokio::sync::broadcast::channel(1);
        GrantEndpoint::new(GrantPlace::Fixed(server.addr()), || never, None, None, None)
    }

    /// The server's single-server target, no database selected.
    fn target(endpoint: &GrantEndpoint) -> SocketTarget<'_> {
        SocketTarget {
            endpoint,
            database: None,
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// Loads `script` into the server; its SHA1.
    fn load(server: &RedisServer, script: &str) -> String {
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
                Order::IfFree,
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
                Order::IfFree,
                deadline,
                Some(&flag),
            )
            .await;
        assert!(matches!(outcome, Outcome::TimedOut), "{outcome:?}");
        assert!(flag.load(Ordering::SeqCst), "its reply was left unread");

        // Redis still holds it: a call that may go anywhere is not sent.
        let other = arg("other");
        let outcome = socket
            .call(&target, &eval(&sha, &other), Order::IfFree, soon(), None)
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
                Order::IfFree,
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
                .call(&target, &eval(&sha, &last), Order::IfFree, soon(), None)
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
        let outcome = socket.call(&target, &call, Order::IfFree, soon(), None);
        assert_eq!(answered(outcome.await), "hi");
        assert!(socket.is_connected());
        server
            .cmd_ok(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
            .expect("kill");
        let outcome = socket
            .call(&target, &call, Order::IfFree, soon(), None)
            .await;
        assert!(matches!(outcome, Outcome::Lost), "{outcome:?}");
        assert!(!socket.is_connected());
        let outcome = socket.call(&target, &call, Order::IfFree, soon(), None);
        assert_eq!(answered(outcome.await), "hi");
        socket.close(Duration::from_secs(1)).await;
        let outcome = socket
            .call(&target, &call, Order::IfFree, soon(), None)
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
            .call(&target, &call, Order::IfFree, deadline, None)
            .await;
        assert!(matches!(outcome, Outcome::NotSent), "{outcome:?}");
        assert!(!socket.is_connected());
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
        server
            .cmd_ok(&["CLIENT", "PAUSE", "500", "ALL"])
            .expect("pause");
        let waited = tokio::time::timeout(Duration::from_millis(100), client.lock("q")).await;
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
            let seen = client.inspect("q").await.expect("inspect");
            if seen.queue_len == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the dropped acquire left {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        holder.release().await.expect("release");
        assert!(client.inspect("q").await.expect("inspect").owner.is_none());
        assert_eq!(state.redis.written_after_socket(), 1);
        client.shutdown().await;
    }
}
