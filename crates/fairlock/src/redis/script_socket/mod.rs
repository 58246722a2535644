//! A command socket of fairlock's own for the hot path's script calls (the
//! acquire and release of a lock, a semaphore and a read-write lock, and
//! their waiter heartbeats), written and read by the calling tasks
//! themselves.
//!
//! A call through fred crosses tasks twice: the caller hands it to fred's
//! connection task, which writes it, reads the reply and hands that back.
//! On a multi-threaded runtime each crossing wakes a parked worker: 4
//! context switches and about 15-20 µs per call on an idle local server
//! (a fred `PING` took 39-44 µs, the same `PING` written and read by the
//! calling task 24-30 µs, on 2 workers). Here the callers write the
//! commands and read the replies on the socket themselves.
//!
//! Calls made at once are pipelined, one socket per command lane. A call
//! takes a number and adds its command to the bytes to write. A caller
//! that finds nobody writing writes them all, its own and what others add
//! meanwhile; a caller that finds nobody reading reads replies, which come
//! in the order the calls were written, hands each to its caller, and when
//! its own has come passes the reading on to the oldest caller still
//! waiting. A call alone writes and reads itself: no task between it and
//! Redis. A call of a burst costs an entry in the list of calls in flight
//! and its command's bytes, where a call through fred holds fred's request
//! future, about 5 KB, while it is in flight.
//!
//! Order is what a lane's callers rely on, and both paths keep it where it
//! matters:
//! - a call whose reply it stopped waiting for (its timeout, or its future
//!   dropped) leaves the reply owed; the socket is not closed, since Redis
//!   may still run the command. A call that may go anywhere
//!   ([`Order::IfClear`]) goes to fred while replies are owed, so that a
//!   socket Redis stopped answering does not hold up more calls; one that
//!   must run after a call that left its reply owed ([`Order::AfterSocket`])
//!   is written behind it on this socket, which Redis reads in order (an
//!   acquire's cancel, sent through fred as well, behind the acquire's
//!   calls that went there meanwhile: `ClientState::cancel`).
//! - a socket that Redis closed, or that failed, runs nothing more, so
//!   nothing written to it can overtake what comes after. The exception:
//!   a write that cannot finish by its writer's deadline (or whose writer
//!   is dropped part-way) closes the socket from this side, and replies
//!   owed on it may then still run after a cancel sent through fred
//!   (Redis must have stopped reading the socket while a send buffer of a
//!   megabyte or so filled; the README states it).
//!
//! Used on a single server, behind Sentinel and on a cluster (a pair of
//! sockets per node, `redis/sockets.rs`), plain TCP or TLS (see
//! [`RedisConnection::connect`](super::RedisConnection::connect)); with
//! replica acknowledgement (a `WAIT` covers fred's connections only) and
//! for RedLock every call goes through fred. Behind
//! Sentinel the socket goes where fred's waiters' connection last
//! reconnected, and only to a server that answers `ROLE` as the primary
//! (`login.rs`); a call made after fred has moved elsewhere moves the
//! socket first ([`ScriptSocket::leave_old_primary`]), and one answered
//! `READONLY` closes the connection it was written on.

//!
//! The files: this one takes a call onto the socket, writes, reads and
//! closes; `pipe.rs` is the bookkeeping behind the socket's lock (the
//! calls in flight, whose reply comes next, who holds which half);
//! `guards.rs` puts things right when a caller's future is dropped
//! part-way; `login.rs` opens the connection; `tests.rs` runs it all
//! against a real redis-server, `sentinel_tests.rs` behind Sentinel,
//! `cluster_tests.rs` on a cluster. Which socket a call takes is
//! `redis/sockets.rs`'s.

#[cfg(test)]
mod cluster_tests;
mod guards;
mod login;
mod pipe;
#[cfg(test)]
mod sentinel_tests;
#[cfg(test)]
mod tests;

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use fairlock_core::Reply;
use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};

use super::grant_endpoint::GrantEndpoint;
use crate::grant_stream::GrantStream;
use crate::resp2;
use guards::{Reading, Taken, Writing};
use login::{open, Opened};
use pipe::{wake, Pipe, Reader, Slot, Wakers, BUFFER, KEEP_BUFFER};

/// After a connect that failed, calls go through fred for this long before
/// the next attempt (a server that is down is not asked on every call).
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// Whether a call may go on the socket, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// On the socket, behind the calls in flight there, if it is connected
    /// and owes no reply; else through fred.
    IfClear,
    /// Behind everything written to the socket: the call must run after
    /// one that went on the socket and whose reply was never read. Through
    /// fred if the socket is closed (nothing written to it runs any more).
    AfterSocket,
}

/// How a call on the socket ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Redis answered: a reply, or an error reply's text.
    Answered(Result<Reply, String>),
    /// Not written (replies owed, or not connected): the call goes through
    /// fred.
    NotSent,
    /// The socket failed before the reply came: the call may have run; it
    /// is sent again through fred (every script sent here is safe to run
    /// twice).
    Lost,
    /// No reply by the deadline (it is owed; see the module docs).
    TimedOut,
}

/// Where the socket connects and how it logs in.
pub(crate) struct SocketTarget<'a> {
    /// The server's address (a single server's, or the primary fred
    /// follows behind Sentinel), TLS and credentials.
    pub(crate) endpoint: &'a GrantEndpoint,
    /// On a cluster, the node to connect to (`host:port`), in place of the
    /// endpoint's address (which a cluster's has not).
    pub(crate) node: Option<&'a str>,
    /// The URL's database, selected on connect.
    pub(crate) database: Option<u8>,
    /// Limit for connecting and logging in.
    pub(crate) connect_timeout: Duration,
}

/// One command lane's socket (see the module docs).
pub(crate) struct ScriptSocket {
    pipe: Mutex<Pipe>,
    /// No connect before this, after one failed.
    pause_until: Mutex<Option<Instant>>,
    /// Set by [`ScriptSocket::close`]: nothing is sent any more.
    closed: AtomicBool,
    /// Calls written in [`Order::AfterSocket`] (for tests).
    #[cfg(test)]
    written_after: std::sync::atomic::AtomicUsize,
}

/// What a waiting caller does next.
enum Step {
    Outcome(Outcome),
    /// Nobody reads: this caller reads, for everyone, until its own reply.
    Read(Reader, u64),
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

/// Whether the server refused the call as a replica.
fn answered_read_only(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Answered(Err(error)) if error.starts_with("READONLY"))
}

impl ScriptSocket {
    pub(crate) fn new() -> Self {
        Self {
            pipe: Mutex::new(Pipe::default()),
            pause_until: Mutex::new(None),
            closed: AtomicBool::new(false),
            #[cfg(test)]
            written_after: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pipe> {
        self.pipe.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The socket failed while `epoch`'s connection was open.
    fn lose(&self, epoch: u64) {
        let wakers = {
            let mut pipe = self.lock();
            if pipe.epoch != epoch {
                return;
            }
            pipe.lose()
        };
        wake(wakers);
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
        if target.endpoint.follows_primary() {
            self.leave_old_primary(target.endpoint);
        }
        if !self.connected(target, order).await {
            return Outcome::NotSent;
        }
        let mut wakers = Wakers::new();
        let taken = {
            let mut pipe = self.lock();
            if order == Order::IfClear && pipe.owed > 0 {
                pipe.read_owed_now(&mut wakers);
            }
            if !pipe.connected
                || self.closed.load(Ordering::SeqCst)
                || (order == Order::IfClear && pipe.owed > 0)
            {
                None
            } else {
                call.write_to(&mut pipe.out);
                let number = pipe.take_call();
                let write = pipe.writer.take().map(|half| {
                    let spare = std::mem::take(&mut pipe.spare);
                    (half, std::mem::replace(&mut pipe.out, spare))
                });
                Some((number, write, pipe.epoch))
            }
        };
        wake(wakers);
        let Some((number, write, epoch)) = taken else {
            return Outcome::NotSent;
        };
        let mut taken = Taken {
            socket: self,
            call: number,
            collected: false,
        };
        if let Some(flag) = unanswered {
            flag.store(true, Ordering::SeqCst);
        }
        #[cfg(test)]
        if order == Order::AfterSocket {
            self.written_after.fetch_add(1, Ordering::SeqCst);
        }
        if let Some((half, bytes)) = write {
            self.write(half, bytes, epoch, deadline).await;
        }
        let outcome = self.outcome(&mut taken, deadline).await;
        if target.endpoint.follows_primary() && answered_read_only(&outcome) {
            // Behind Sentinel, a primary demoted with its connections left
            // open: the call wrote nothing there (a replica refuses a
            // script's first write) and goes through fred, which follows
            // the primary the sentinels name. The connection it was
            // written on is closed, not one opened since (answers of one
            // burst each come here), and the next call connects to a
            // server that answers `ROLE` as the primary (`login.rs`).
            self.lose(epoch);
        }
        if let (Some(flag), Outcome::Answered(_) | Outcome::Lost) = (unanswered, &outcome) {
            flag.store(false, Ordering::SeqCst);
        }
        outcome
    }

    /// Whether the socket is connected, connecting it if it is not and
    /// `order` allows (one caller connects; others go through fred
    /// meanwhile).
    async fn connected(&self, target: &SocketTarget<'_>, order: Order) -> bool {
        {
            let mut pipe = self.lock();
            if pipe.connected {
                return true;
            }
            if order == Order::AfterSocket || pipe.connecting {
                return false;
            }
            pipe.connecting = true;
        }
        /// Clears `connecting` however the connect ends.
        struct Connecting<'a>(&'a ScriptSocket);
        impl Drop for Connecting<'_> {
            fn drop(&mut self) {
                self.0.lock().connecting = false;
            }
        }
        let _connecting = Connecting(self);
        let Some(opened) = self.connect(target).await else {
            return false;
        };
        let mut pipe = self.lock();
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        let Opened {
            stream,
            buf,
            address,
        } = opened;
        let (read, write) = tokio::io::split(stream);
        pipe.epoch += 1;
        pipe.connected = true;
        pipe.address = address;
        pipe.writer = Some(write);
        pipe.reader = Some(Reader { half: read, buf });
        pipe.out.reserve(BUFFER);
        true
    }

    /// Writes `bytes`, and what other callers add meanwhile, then puts the
    /// write half back. A write that fails or misses `deadline` loses the
    /// socket.
    async fn write(
        &self,
        mut half: WriteHalf<GrantStream>,
        mut bytes: Vec<u8>,
        epoch: u64,
        deadline: Instant,
    ) {
        let mut writing = Writing {
            socket: self,
            epoch,
            finished: false,
        };
        loop {
            let written = tokio::time::timeout_at(deadline.into(), async {
                half.write_all(&bytes).await?;
                // TLS keeps written bytes in its session until flushed.
                half.flush().await
            })
            .await;
            if !matches!(written, Ok(Ok(()))) {
                // Failed or timed out part-way: what was written never
                // runs (Redis waits for the rest of the command, then sees
                // the socket close); the calls go through fred.
                return;
            }
            bytes.clear();
            let mut pipe = self.lock();
            if pipe.epoch != epoch {
                writing.finished = true;
                return;
            }
            if pipe.out.is_empty() {
                if bytes.capacity() <= KEEP_BUFFER {
                    pipe.spare = bytes;
                }
                pipe.writer = Some(half);
                writing.finished = true;
                return;
            }
            std::mem::swap(&mut pipe.out, &mut bytes);
        }
    }

    /// Waits for the call's outcome, reading for every caller while nobody
    /// else does.
    async fn outcome(&self, taken: &mut Taken<'_>, deadline: Instant) -> Outcome {
        loop {
            let step =
                tokio::time::timeout_at(deadline.into(), poll_fn(|cx| self.poll_step(taken, cx)))
                    .await;
            match step {
                // Left owed, by the Drop of `taken`; the caller's flag stays
                // set.
                Err(_) => return Outcome::TimedOut,
                Ok(Step::Outcome(outcome)) => return outcome,
                Ok(Step::Read(reader, epoch)) => {
                    if !self.read(reader, epoch, taken.call, deadline).await {
                        return Outcome::TimedOut;
                    }
                }
            }
        }
    }

    /// The call's outcome if it has one, else the reader if nobody reads,
    /// else waits (the waker kept in the call's slot).
    fn poll_step(&self, taken: &mut Taken<'_>, cx: &mut Context<'_>) -> Poll<Step> {
        let mut wakers = Wakers::new();
        let step = {
            let mut pipe = self.lock();
            let epoch = pipe.epoch;
            let reader = pipe.reader.take();
            let Some(slot) = pipe.slot(taken.call) else {
                pipe.reader = reader;
                return Poll::Ready(Step::Outcome(Outcome::Lost));
            };
            let outcome = match std::mem::replace(slot, Slot::Done) {
                Slot::Answered(reply) => Outcome::Answered(reply),
                Slot::Waiting(waker) => {
                    let waker = match waker {
                        Some(waker) if waker.will_wake(cx.waker()) => waker,
                        _ => cx.waker().clone(),
                    };
                    *slot = Slot::Waiting(Some(waker));
                    return match reader {
                        Some(reader) => Poll::Ready(Step::Read(reader, epoch)),
                        None => Poll::Pending,
                    };
                }
                // Lost, or never in flight.
                _ => Outcome::Lost,
            };
            pipe.reader = reader;
            taken.collected = true;
            pipe.caller_left(&mut wakers);
            Step::Outcome(outcome)
        };
        wake(wakers);
        Poll::Ready(step)
    }

    /// Reads replies and hands them out until the call `own` has its
    /// reply, or the socket fails (its calls lost), or `deadline`
    /// passes: then `false`. The reader is put back (unless the socket was
    /// lost) and the next waiting caller woken to read.
    async fn read(&self, reader: Reader, epoch: u64, own: u64, deadline: Instant) -> bool {
        let mut reading = Reading {
            socket: self,
            reader: Some(reader),
            epoch,
        };
        let read = tokio::time::timeout_at(
            deadline.into(),
            poll_fn(|cx| {
                let Some(reader) = reading.reader.as_mut() else {
                    return Poll::Ready(());
                };
                loop {
                    let (wakers, answered) = {
                        let mut pipe = self.lock();
                        if pipe.epoch != epoch {
                            // Lost by a writer: the call's slot says so.
                            reading.reader = None;
                            return Poll::Ready(());
                        }
                        let mut wakers = Wakers::new();
                        match pipe.dispatch(&mut reader.buf, own, &mut wakers) {
                            Ok(()) => {
                                let answered = !matches!(pipe.slot(own), Some(Slot::Waiting(_)));
                                (wakers, answered)
                            }
                            Err(malformed) => {
                                tracing::warn!(
                                    error = malformed.0,
                                    "fairlock's script socket read a malformed reply; closing it"
                                );
                                // The callers answered before it are woken too.
                                wakers.extend(pipe.lose());
                                drop(pipe);
                                reading.reader = None;
                                wake(wakers);
                                return Poll::Ready(());
                            }
                        }
                    };
                    wake(wakers);
                    if answered {
                        return Poll::Ready(());
                    }
                    match pin!(reader.half.read_buf(&mut reader.buf)).poll(cx) {
                        Poll::Ready(Ok(n)) if n > 0 => {}
                        Poll::Ready(_) => {
                            reading.reader = None;
                            self.lose(epoch);
                            return Poll::Ready(());
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                }
            }),
        )
        .await;
        read.is_ok()
    }

    /// Behind Sentinel: closes the connection if fred has reconnected to
    /// another server since it was opened (a fail-over), so that the call
    /// connects to the new primary. Calls in flight on the old one are
    /// lost and sent again through fred, as when Sentinel closes the
    /// demoted primary's connections.
    fn leave_old_primary(&self, endpoint: &GrantEndpoint) {
        let moved = {
            let pipe = self.lock();
            (pipe.connected && !endpoint.still_at(&pipe.address)).then_some(pipe.epoch)
        };
        if let Some(epoch) = moved {
            tracing::info!(
                "fairlock's script socket is on a server fred has left (a fail-over); connecting again"
            );
            self.lose(epoch);
        }
    }

    /// Connects and logs in, within the connect timeout; `None` (and no
    /// attempt for [`RECONNECT_PAUSE`]) if that fails.
    async fn connect(&self, target: &SocketTarget<'_>) -> Option<Opened> {
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
    /// client refuses). Waits at most `timeout` for the calls on it to
    /// end.
    pub(crate) async fn close(&self, timeout: Duration) {
        self.closed.store(true, Ordering::SeqCst);
        let idle = poll_fn(|cx| {
            let mut pipe = self.lock();
            if pipe.live == 0 {
                Poll::Ready(())
            } else {
                pipe.on_idle = Some(cx.waker().clone());
                Poll::Pending
            }
        });
        let _ = tokio::time::timeout(timeout, idle).await;
        let epoch = self.lock().epoch;
        self.lose(epoch);
    }

    /// Closes the socket's connection, if open: its calls in flight are
    /// lost (each sent again through fred) and the next call connects
    /// again. For a server that has moved (`moved_primary.rs`).
    pub(crate) fn disconnect(&self) {
        let epoch = self.lock().epoch;
        self.lose(epoch);
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
        self.lock().connected
    }

    /// Where the socket is connected now, if it is (for tests).
    #[cfg(test)]
    pub(crate) fn connected_to(&self) -> Option<String> {
        let pipe = self.lock();
        pipe.connected.then(|| pipe.address.clone())
    }

    /// The most calls that were in flight on the socket at once (for
    /// tests).
    #[cfg(test)]
    pub(crate) fn most_in_flight(&self) -> u64 {
        self.lock().most_in_flight
    }

    /// How many calls were ever taken onto the socket (for tests).
    #[cfg(test)]
    pub(crate) fn calls_taken(&self) -> u64 {
        self.lock().next_call()
    }
}
