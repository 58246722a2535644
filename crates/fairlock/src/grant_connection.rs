//! fairlock's own grant connection: the socket a grant arrives on, read by
//! the task that wakes its waiter.
//!
//! On a single server (the usual deployment: Redis or Valkey behind a
//! `redis://host:port` URL) and on a primary managed by Sentinel, the
//! process's one pub/sub subscription is this connection, not fred's
//! subscriber; with TLS (`rediss://`, `rediss-sentinel://`) too, opened
//! with fred's TLS settings by `grant_stream.rs`. The task that reads it parses each message in
//! place from the connection's buffer and hands the grant to its waiter's
//! slot (`grants.rs`), so a
//! grant wakes the waiting task straight from the socket reader: one task
//! hop, and nothing allocated per grant. Through fred's subscriber a grant
//! crossed two tasks more (fred's connection task, its broadcast channel,
//! fairlock's router) before the waiter ran. On a cluster one such
//! connection per node is kept by `sharded_grants.rs`, which reads them
//! with [`route_frames`] too; only where fred's subscriber carries the
//! grants (RedLock's primaries) does a router task read them instead;
//! every path ends in [`route_notice`].
//!
//! Behind Sentinel the connection follows the primary that fred's waiters'
//! command connection is connected to (`redis/grant_endpoint.rs` reads
//! fred's reconnect announcements). A fail-over may cut this connection
//! (Sentinel kills the clients of the servers it reconfigures); it is then
//! opened again at the primary fred names at that moment, which can still
//! be the old one, now a replica: a connection opened again asks the
//! server's role first (`HELLO`) and does not subscribe on a replica. There
//! it would hear grants passed on by replication while the primary counted
//! no listener and cut each grant's lease to the waiter TTL, unknown to the
//! waiter; refused, it is tried again with its backoff, and meanwhile the
//! heartbeat finds the grants and their waiters set their own leases
//! (`faults.rs`:
//! `a_grant_connection_opened_again_on_a_replica_does_not_subscribe_there`).
//! Whenever fred names another server than the one it is subscribed on, it
//! moves there at its next keep-alive check, once per heartbeat interval
//! (`sentinel.rs` shows that without this check it stays on the old
//! primary).
//!
//! The connection keeps itself up. When Redis has sent nothing for a
//! heartbeat interval it sends `PING`; with no answer within the command
//! timeout (a dead peer, a cut network) it counts the connection as lost
//! (checked once per heartbeat interval). A lost
//! connection is opened again with a backoff of 50 ms doubling to 2 s,
//! for as long as the client lives; once subscribed again it asks the
//! waiter heartbeat for a round at once, because a grant published while
//! nobody listened is only found by a heartbeat.

use std::fmt;
use std::str;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::MissedTickBehavior;

use crate::error::Error;
use crate::grant_stream::GrantStream;
use crate::grants::{resubscribed, route_notice};
use crate::redis::{redact, GrantEndpoint};
use crate::resp2::{self, Frame, Malformed};
use crate::state::ClientState;
use crate::task::{BackgroundTask, ShutdownSignal};

/// What [`GrantConnection::open`] subscribes, and whether only on a
/// primary.
struct Subscribe<'a> {
    channel: &'a str,
    primary_only: bool,
}

/// The read buffer a connection starts with; it grows for a larger burst.
const BUFFER: usize = 4 * 1024;

/// The first pause before opening a lost connection again; it doubles on
/// each failure up to [`MAX_PAUSE`].
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(50);
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(2);

pub(crate) const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// Why the connection could not be opened or was lost.
#[derive(Debug)]
pub(crate) enum ConnectionError {
    /// Redis answered with an error (`NOPERM ...`, `WRONGPASS ...`,
    /// `ERR max number of clients reached`).
    Refused(String),
    Io(std::io::Error),
    TimedOut(Duration),
    Malformed(&'static str),
    /// Redis answered, but not what was asked.
    Unexpected,
    /// Redis closed the connection.
    Closed,
    /// Nothing came back for a PING within the command timeout.
    Silent(Duration),
    /// Behind Sentinel, before fred has reached a primary.
    NoPrimary,
    /// The server at the address is a replica (a primary just demoted).
    Replica,
    /// Behind Sentinel, fred now uses another primary than the one this
    /// connection is subscribed on.
    Moved {
        from: String,
        to: String,
    },
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(error) => write!(f, "Redis refused it: {error}"),
            Self::Io(error) => write!(f, "{error}"),
            Self::TimedOut(timeout) => write!(f, "no answer within {timeout:?}"),
            Self::Malformed(what) => write!(f, "Redis sent a malformed frame ({what})"),
            Self::Unexpected => write!(f, "Redis answered something other than asked"),
            Self::Closed => write!(f, "Redis closed the connection"),
            Self::Silent(timeout) => write!(f, "no answer to PING within {timeout:?}"),
            Self::NoPrimary => write!(f, "no primary known yet"),
            Self::Replica => write!(f, "the server there is a replica, not a primary"),
            Self::Moved { from, to } => write!(f, "the primary moved from {from} to {to}"),
        }
    }
}

impl From<std::io::Error> for ConnectionError {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

impl From<Malformed> for ConnectionError {
    fn from(error: Malformed) -> Self {
        Self::Malformed(error.0)
    }
}

impl ConnectionError {
    /// The error `LockClient::connect` reports for a grant connection that
    /// could not be opened.
    pub(crate) fn at_connect(self, url: &str, channel: &str) -> Error {
        match self {
            Self::Refused(error) if error.starts_with("NOPERM") => {
                Error::NoPermission(format!("SUBSCRIBE {channel} was refused by Redis: {error}"))
            }
            other => Error::Unreachable {
                url: redact(url),
                reason: format!("opening the pub/sub connection for grants: {other}"),
                source: None,
            },
        }
    }
}

/// A connection subscribed to the process's grant channel.
pub(crate) struct GrantConnection {
    /// The server it is connected to, `host:port`.
    address: String,
    stream: GrantStream,
    /// What has been read and not parsed yet.
    buf: Vec<u8>,
    /// The endpoint's [`GrantEndpoint::moves`] when it was opened: a
    /// single server's URL that has moved since is opened again.
    moves: u64,
}

impl GrantConnection {
    /// Connects, authenticates with the URL's credentials and subscribes
    /// `channel`, all within `timeout`. When this returns, Redis has
    /// confirmed the subscription: a grant published from then on is heard.
    /// With `primary_only`, a server that says it is a replica is refused
    /// ([`ConnectionError::Replica`]): a subscriber there hears grants
    /// passed on by replication, but the primary counts no listener and
    /// cuts each grant's lease to the waiter TTL, which the waiter would
    /// not know of (found by the heartbeat instead, the waiter sets its
    /// own lease).
    pub(crate) async fn open(
        endpoint: &GrantEndpoint,
        channel: &str,
        timeout: Duration,
        primary_only: bool,
    ) -> Result<Self, ConnectionError> {
        let address = endpoint.address().ok_or(ConnectionError::NoPrimary)?;
        let subscribe = Subscribe {
            channel,
            primary_only,
        };
        tokio::time::timeout(
            timeout,
            Self::open_unbounded(endpoint, address, Some(subscribe)),
        )
        .await
        .map_err(|_| ConnectionError::TimedOut(timeout))?
    }

    /// Connects to the cluster node at `address` and authenticates, within
    /// `timeout`; nothing is subscribed yet (`sharded_grants.rs` does).
    pub(crate) async fn open_node(
        endpoint: &GrantEndpoint,
        address: String,
        timeout: Duration,
    ) -> Result<Self, ConnectionError> {
        tokio::time::timeout(timeout, Self::open_unbounded(endpoint, address, None))
            .await
            .map_err(|_| ConnectionError::TimedOut(timeout))?
    }

    /// The server's address, the stream, and what was read of it and not
    /// parsed yet.
    pub(crate) fn into_parts(self) -> (String, GrantStream, Vec<u8>) {
        (self.address, self.stream, self.buf)
    }

    async fn open_unbounded(
        endpoint: &GrantEndpoint,
        address: String,
        subscribe: Option<Subscribe<'_>>,
    ) -> Result<Self, ConnectionError> {
        let stream = GrantStream::connect(&address, endpoint.tls()).await?;
        let mut connection = Self {
            address,
            stream,
            buf: Vec::with_capacity(BUFFER),
            moves: endpoint.moves(),
        };
        let channel = subscribe.as_ref().map(|s| s.channel);
        // HELLO (which says the server's role, and authenticates) or AUTH,
        // and SUBSCRIBE go in one write; their answers come in order.
        let mut out = Vec::new();
        let hello = subscribe.as_ref().is_some_and(|s| s.primary_only);
        let authenticating = endpoint.password.is_some() && !hello;
        match (&endpoint.username, &endpoint.password) {
            (user, Some(password)) if hello => {
                let user = user.as_deref().unwrap_or("default");
                resp2::command(
                    &mut out,
                    &[
                        b"HELLO",
                        b"2",
                        b"AUTH",
                        user.as_bytes(),
                        password.as_bytes(),
                    ],
                )
            }
            _ if hello => resp2::command(&mut out, &[b"HELLO", b"2"]),
            (Some(user), Some(password)) => {
                resp2::command(&mut out, &[b"AUTH", user.as_bytes(), password.as_bytes()])
            }
            (None, Some(password)) => resp2::command(&mut out, &[b"AUTH", password.as_bytes()]),
            _ => {}
        }
        if let Some(channel) = channel {
            resp2::command(&mut out, &[b"SUBSCRIBE", channel.as_bytes()]);
        }
        if out.is_empty() {
            return Ok(connection);
        }
        connection.stream.write_all(&out).await?;
        // TLS keeps written bytes in its session until flushed.
        connection.stream.flush().await?;
        if authenticating {
            connection
                .answer(|frame| match frame {
                    Frame::Simple(_) => Ok(()),
                    _ => Err(ConnectionError::Unexpected),
                })
                .await?;
        }
        if hello {
            // Refused before its SUBSCRIBE's answer is read: the grants
            // that subscription hears are never routed.
            connection
                .answer(|frame| match frame {
                    Frame::Hello {
                        role: Some(b"replica" | b"slave"),
                    } => Err(ConnectionError::Replica),
                    Frame::Hello { .. } => Ok(()),
                    _ => Err(ConnectionError::Unexpected),
                })
                .await?;
        }
        if let Some(channel) = channel {
            connection
                .answer(|frame| match frame {
                    Frame::Subscribed(name) if name == channel.as_bytes() => Ok(()),
                    _ => Err(ConnectionError::Unexpected),
                })
                .await?;
        }
        Ok(connection)
    }

    /// Reads the next frame and judges it with `judge`; an error frame is
    /// [`ConnectionError::Refused`].
    async fn answer(
        &mut self,
        judge: impl FnOnce(Frame<'_>) -> Result<(), ConnectionError>,
    ) -> Result<(), ConnectionError> {
        loop {
            if let Some((frame, used)) = resp2::parse(&self.buf)? {
                let judged = match frame {
                    Frame::Error(error) => Err(ConnectionError::Refused(
                        String::from_utf8_lossy(error).into_owned(),
                    )),
                    frame => judge(frame),
                };
                self.buf.drain(..used);
                return judged;
            }
            self.read().await?;
        }
    }

    /// Reads what the socket has into the buffer.
    async fn read(&mut self) -> Result<(), ConnectionError> {
        match self.stream.read_buf(&mut self.buf).await? {
            0 => Err(ConnectionError::Closed),
            _ => Ok(()),
        }
    }

    /// Hands every complete message in the buffer to its waiter; whether
    /// there was any frame (an answer to PING counts: the peer is alive).
    fn route_buffered(&mut self, state: &Arc<ClientState>) -> Result<bool, ConnectionError> {
        let used = route_frames(state, &self.buf, |frame| {
            if let Frame::Error(error) = frame {
                tracing::warn!(
                    error = %String::from_utf8_lossy(error),
                    "fairlock's pub/sub connection got an error from Redis"
                );
            }
        })?;
        self.buf.drain(..used);
        Ok(used > 0)
    }

    /// Routes grants until the connection is lost (`Err`) or shutdown is
    /// asked for (`Ok`). Once per `keepalive`: a PING if Redis sent nothing
    /// since the last check, the connection is lost if a PING has gone
    /// unanswered for `timeout`, and it is given up if the endpoint names
    /// another server now (behind Sentinel, after a fail-over) or its URL
    /// has moved (a single server that answered `READONLY`).
    async fn serve(
        &mut self,
        state: &Arc<ClientState>,
        shutdown: &mut ShutdownSignal,
        keepalive: Duration,
        timeout: Duration,
    ) -> Result<(), ConnectionError> {
        let start = tokio::time::Instant::now() + keepalive;
        let mut ticks = tokio::time::interval_at(start, keepalive);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut heard = false;
        let mut pinged: Option<tokio::time::Instant> = None;
        loop {
            if self.route_buffered(state)? {
                heard = true;
                pinged = None;
            }
            tokio::select! {
                biased;
                () = shutdown.requested() => return Ok(()),
                read = self.read() => read?,
                now = ticks.tick() => {
                    let endpoint = state.redis.grant_endpoint();
                    let address = endpoint.and_then(GrantEndpoint::address);
                    let moved = endpoint.is_some_and(|e| e.moves() != self.moves);
                    if let Some(to) = address.filter(|to| moved || *to != self.address) {
                        return Err(ConnectionError::Moved { from: self.address.clone(), to });
                    }
                    match pinged {
                        Some(sent) if now.duration_since(sent) >= timeout => {
                            return Err(ConnectionError::Silent(timeout));
                        }
                        Some(_) => {}
                        None if !heard => {
                            let ping = async {
                                self.stream.write_all(PING).await?;
                                self.stream.flush().await
                            };
                            tokio::time::timeout(timeout, ping)
                                .await
                                .map_err(|_| ConnectionError::Silent(timeout))??;
                            pinged = Some(now);
                        }
                        None => {}
                    }
                    heard = false;
                }
            }
        }
    }
}

/// Routes every complete frame at the start of `buf`: a message on one of
/// this process's grant channels goes to its waiter ([`route_notice`]),
/// read in place, with no copy and no allocation; every other frame (an
/// answer, an error) goes to `answer`. Returns how many bytes the frames
/// took (the rest is an incomplete frame).
pub(crate) fn route_frames(
    state: &Arc<ClientState>,
    buf: &[u8],
    mut answer: impl FnMut(Frame<'_>),
) -> Result<usize, ConnectionError> {
    let mut used = 0;
    while let Some((frame, len)) = resp2::parse(&buf[used..])? {
        used += len;
        match frame {
            Frame::Message { channel, payload } => {
                match (str::from_utf8(channel), str::from_utf8(payload)) {
                    (Ok(channel), Ok(payload)) if state.is_our_channel(channel) => {
                        route_notice(state, payload)
                    }
                    _ => tracing::warn!(
                        payload = %String::from_utf8_lossy(payload),
                        "fairlock ignored a message that is not a grant for this process"
                    ),
                }
            }
            other => answer(other),
        }
    }
    Ok(used)
}

/// Starts the task that reads `connection` (subscribed already) and keeps
/// it open: the grant router of a client on a single plain-TCP server or
/// behind Sentinel.
pub(crate) fn spawn_grant_reader(
    state: Arc<ClientState>,
    connection: GrantConnection,
) -> BackgroundTask {
    subscribed_at(&state, Some(&connection.address));
    BackgroundTask::spawn(
        "grant connection",
        move |mut shutdown: ShutdownSignal| async move {
            let keepalive = state.config.heartbeat_interval;
            let timeout = state.config.command_timeout;
            let mut connection = connection;
            loop {
                let served = connection
                    .serve(&state, &mut shutdown, keepalive, timeout)
                    .await;
                subscribed_at(&state, None);
                match served {
                    Ok(()) => return,
                    Err(error) => tracing::warn!(
                        %error,
                        address = %connection.address,
                        "fairlock's pub/sub connection is closed; opening it again"
                    ),
                }
                connection = match reopen(&state, &mut shutdown).await {
                    Some(connection) => connection,
                    None => return,
                };
                subscribed_at(&state, Some(&connection.address));
                resubscribed(&state);
            }
        },
    )
}

/// Records where the grant connection is subscribed (see
/// [`ClientState::grants_at`]).
fn subscribed_at(state: &ClientState, address: Option<&str>) {
    *state.grants_at.lock().unwrap_or_else(|p| p.into_inner()) =
        address.map(str::to_owned).into_iter().collect();
}

/// Opens the grant connection again, backing off, until it is subscribed
/// (`Some`) or shutdown is asked for (`None`).
async fn reopen(state: &ClientState, shutdown: &mut ShutdownSignal) -> Option<GrantConnection> {
    let endpoint = state.redis.grant_endpoint()?;
    let mut pause = FIRST_PAUSE;
    loop {
        tokio::select! {
            () = shutdown.requested() => return None,
            () = tokio::time::sleep(pause) => {}
        }
        // Only on a primary: opened again after a fail-over, the address
        // may still name the demoted one.
        let open =
            GrantConnection::open(endpoint, &state.channel, state.config.connect_timeout, true);
        tokio::select! {
            () = shutdown.requested() => return None,
            opened = open => match opened {
                Ok(connection) => return Some(connection),
                Err(error) => {
                    tracing::warn!(%error, "fairlock could not open its pub/sub connection again; retrying");
                    pause = (pause * 2).min(MAX_PAUSE);
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::time::Duration;

    use fairlock_testkit::RedisServer;

    use super::route_frames;
    use crate::LockClient;

    /// Counts the allocations the current thread makes while asked to; the
    /// other threads of the test binary are not counted.
    struct Counting;

    thread_local! {
        static COUNT: Cell<Option<usize>> = const { Cell::new(None) };
    }

    // SAFETY: every call is passed to the system allocator as it is.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let _ = COUNT.try_with(|count| count.set(count.get().map(|n| n + 1)));
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    fn allocations_in(run: impl FnOnce()) -> usize {
        COUNT.with(|count| count.set(Some(0)));
        run();
        COUNT.with(|count| count.replace(None)).unwrap_or(0)
    }

    /// Reads one pub/sub `message` frame off `stream` (subscribed) and
    /// returns its payload.
    async fn next_message(stream: &mut tokio::net::TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if let Some(at) = text.find("$7\r\nmessage\r\n") {
                let lines: Vec<&str> = text[at..].split("\r\n").collect();
                // $7, message, $n, channel, $m, payload, and the end.
                if lines.len() >= 7 {
                    return lines[5].to_owned();
                }
            }
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
                .await
                .expect("a message within 10 s")
                .expect("read");
            assert!(read > 0, "the subscriber connection closed");
            bytes.extend_from_slice(&chunk[..read]);
        }
    }

    /// A grant read off the socket reaches its waiting task with no
    /// allocation: the frame is parsed in place, the waiter found by its
    /// owner id and woken through its slot. The task then holds the lock
    /// with the token the message carried. The grant is Redis's own: the
    /// release script runs by hand and publishes it on a side channel
    /// (so the client's grant connection does not hear it first), where a
    /// subscriber of the test reads the payload Redis wrote; the frame
    /// given to the client carries that payload on the client's channel.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_reaches_its_waiter_without_an_allocation() {
        use fairlock_core::ScriptCall;
        use tokio::io::AsyncWriteExt;

        let server = RedisServer::start().expect("redis-server");
        let client = LockClient::connect(&server.url()).await.expect("client");
        assert_eq!(client.grants_subscribed_at(), [server.addr()]);
        let holder = client.lock("routed").await.expect("holder");
        let waiter = {
            let client = client.clone();
            tokio::spawn(async move { client.lock("routed").await })
        };
        let state = client.state();
        let name = fairlock_core::LockName::new("routed").expect("name");
        let keys = state.keys_of(&name);
        while server
            .cmd(&["ZCARD", keys.queue()])
            .expect("ZCARD")
            .as_int()
            != Some(1)
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The side channel: `capture:` and this process's tag.
        let side = format!("capture:{}", state.tag);
        let mut subscriber = tokio::net::TcpStream::connect(server.addr())
            .await
            .expect("connect");
        let subscribe = format!("*2\r\n$9\r\nSUBSCRIBE\r\n${}\r\n{side}\r\n", side.len());
        subscriber
            .write_all(subscribe.as_bytes())
            .await
            .expect("SUBSCRIBE");
        while server
            .cmd(&["PUBSUB", "NUMSUB", &side])
            .expect("NUMSUB")
            .as_array()
            .and_then(|reply| reply.get(1).and_then(|n| n.as_int()))
            != Some(1)
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The holder's release, run by hand: Redis grants the waiter and
        // publishes the grant on the side channel.
        let release = fairlock_core::Release {
            owner_id: holder.owner_id(),
            timings: &state.timings,
            channel_prefix: "capture:",
            reply_to: "",
        };
        let args = release.args();
        let numkeys = keys.all().len().to_string();
        let mut eval = vec!["EVAL", fairlock_core::Release::SCRIPT.source(), &numkeys];
        eval.extend(keys.all().iter().map(String::as_str));
        eval.extend(args.iter().map(String::as_str));
        server.cmd_ok(&eval).expect("the release script");
        let payload = next_message(&mut subscriber).await;
        let owner = server.cmd(&["GET", keys.owner()]).expect("GET owner");
        let owner = owner.as_str().expect("the lock is held").to_owned();
        let frame = format!(
            "*3\r\n$7\r\nmessage\r\n${}\r\n{}\r\n${}\r\n{}\r\n",
            state.channel.len(),
            state.channel,
            payload.len(),
            payload
        );
        let mut used = 0;
        let allocations = allocations_in(|| {
            used = route_frames(state, frame.as_bytes(), |_| {}).expect("well-formed");
        });
        assert_eq!(used, frame.len(), "the whole frame was read");
        assert_eq!(allocations, 0, "allocations while routing one grant");
        let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .expect("task")
            .expect("granted");
        // The waiter holds what Redis granted: its owner id and token are
        // the owner key's.
        assert!(
            owner.starts_with(granted.owner_id()),
            "{owner} / {}",
            granted.owner_id()
        );
        assert!(
            owner.ends_with(&format!(" {}", granted.token().value())),
            "{owner} / token {}",
            granted.token().value()
        );
        assert!(granted.token().value() > holder.token().value());
        granted
            .release()
            .await
            .expect("the granted waiter releases");
        drop(holder);
        client.shutdown().await;
    }
}
