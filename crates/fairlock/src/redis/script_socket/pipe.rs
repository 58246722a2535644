//! The bookkeeping of one script socket, behind its lock: the calls in
//! flight in the order they were written, which of them still waits for
//! its reply, who holds the write and read halves, and what is to be
//! written next. No await here: the callers in `mod.rs` take what a step
//! needs under the lock and do the I/O outside it (`read_owed_now`, which
//! polls the socket once without waiting, is the one read).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use fairlock_core::Reply;
use tokio::io::{AsyncReadExt, ReadHalf, WriteHalf};

use crate::grant_stream::GrantStream;
use crate::resp2::{self, Malformed};

/// Bytes kept for replies and commands; a lock script's call or reply is
/// far smaller.
pub(super) const BUFFER: usize = 512;

/// A buffer that grew past this in a burst is not kept for the next one.
pub(super) const KEEP_BUFFER: usize = 64 * 1024;

/// The socket's halves, what is to be written and the calls in flight.
#[derive(Default)]
pub(super) struct Pipe {
    /// Counts connections opened and lost: a half taken out while an
    /// earlier connection was open is dropped, not put back.
    pub(super) epoch: u64,
    pub(super) connected: bool,
    /// The address the connection went to (see
    /// [`ScriptSocket::leave_old_primary`](super::ScriptSocket)).
    pub(super) address: String,
    /// A caller is connecting; others go through fred meanwhile.
    pub(super) connecting: bool,
    /// The write half, unless a caller is writing.
    pub(super) writer: Option<WriteHalf<GrantStream>>,
    /// The read half and what was read, unless a caller is reading.
    pub(super) reader: Option<Reader>,
    /// Commands of calls taken, not yet picked up by a writer.
    pub(super) out: Vec<u8>,
    /// The buffer the last writer gave back, to swap in for `out`.
    pub(super) spare: Vec<u8>,
    /// The calls from number `first` on: in flight, or answered and not
    /// yet collected by their callers.
    pub(super) calls: VecDeque<Slot>,
    pub(super) first: u64,
    /// The number of the call whose reply comes next.
    pub(super) next_reply: u64,
    /// Calls in flight whose callers stopped waiting.
    pub(super) owed: usize,
    /// Callers that have not yet collected their outcome.
    pub(super) live: usize,
    /// Woken when `live` falls to 0 (for [`ScriptSocket::close`]).
    pub(super) on_idle: Option<Waker>,
    /// The most calls in flight at once (for tests).
    #[cfg(test)]
    pub(super) most_in_flight: u64,
}

pub(super) struct Reader {
    pub(super) half: ReadHalf<GrantStream>,
    /// Read and not parsed yet.
    pub(super) buf: Vec<u8>,
}

/// One call, from when it is taken until its caller has its outcome (or
/// its reply, owed, was read).
pub(super) enum Slot {
    /// Waiting for its reply; the caller's waker once it waited.
    Waiting(Option<Waker>),
    /// Its caller stopped waiting; the reply is read and dropped.
    Abandoned,
    /// The reply, for its caller to collect.
    Answered(Result<Reply, String>),
    /// The socket failed before the reply came.
    Lost,
    /// Nothing more to do.
    Done,
}

/// Callers to wake once the pipe's lock is let go.
pub(super) type Wakers = Vec<Waker>;

impl Pipe {
    pub(super) fn slot(&mut self, call: u64) -> Option<&mut Slot> {
        let index = call.checked_sub(self.first)?;
        self.calls.get_mut(usize::try_from(index).ok()?)
    }

    /// The number the next call gets.
    pub(super) fn next_call(&self) -> u64 {
        self.first + self.calls.len() as u64
    }

    /// Takes a call whose command was added to `out`: its number.
    pub(super) fn take_call(&mut self) -> u64 {
        let call = self.next_call();
        self.calls.push_back(Slot::Waiting(None));
        self.live += 1;
        #[cfg(test)]
        {
            self.most_in_flight = self.most_in_flight.max(call + 1 - self.next_reply);
        }
        call
    }

    /// Drops finished calls from the front.
    fn pop_done(&mut self) {
        while matches!(self.calls.front(), Some(Slot::Done)) {
            self.calls.pop_front();
            self.first += 1;
        }
        if self.calls.is_empty() && self.calls.capacity() > BUFFER {
            self.calls.shrink_to(BUFFER / 8);
        }
    }

    /// A caller has its outcome or stopped waiting.
    pub(super) fn caller_left(&mut self, wakers: &mut Wakers) {
        self.live -= 1;
        self.pop_done();
        if self.live == 0 {
            wakers.extend(self.on_idle.take());
        }
    }

    /// Hands out the complete replies in the reader's buffer, in call
    /// order, adding the callers to wake to `wakers` (not `own`, which is
    /// reading). On a malformed reply the callers answered before it are
    /// in `wakers` too: the caller wakes them as it loses the socket.
    pub(super) fn dispatch(
        &mut self,
        buf: &mut Vec<u8>,
        own: u64,
        wakers: &mut Wakers,
    ) -> Result<(), Malformed> {
        let mut used = 0;
        while let Some((reply, len)) = resp2::reply(&buf[used..])? {
            used += len;
            let call = self.next_reply;
            let Some(slot) = self.slot(call) else {
                return Err(Malformed("a reply with no call in flight"));
            };
            let owed = match std::mem::replace(slot, Slot::Done) {
                Slot::Waiting(waker) => {
                    *slot = Slot::Answered(reply);
                    if call != own {
                        wakers.extend(waker);
                    }
                    false
                }
                Slot::Abandoned => true,
                // Every call from `next_reply` on is waiting or abandoned.
                other => {
                    *slot = other;
                    false
                }
            };
            self.next_reply += 1;
            if owed {
                self.owed -= 1;
            }
        }
        buf.drain(..used);
        if buf.is_empty() && buf.capacity() > KEEP_BUFFER {
            buf.shrink_to(BUFFER);
        }
        self.pop_done();
        Ok(())
    }

    /// The waker of the oldest caller still waiting, which is to read next
    /// (the reader has been put back).
    pub(super) fn next_reader(&mut self) -> Option<Waker> {
        let from = usize::try_from(self.next_reply.saturating_sub(self.first)).ok()?;
        self.calls
            .iter_mut()
            .skip(from)
            .find_map(|slot| match slot {
                Slot::Waiting(waker) => Some(waker.take()),
                _ => None,
            })?
    }

    /// The socket failed: every call in flight is lost, the halves (those
    /// taken out too, by the epoch) are dropped.
    pub(super) fn lose(&mut self) -> Wakers {
        self.epoch += 1;
        self.connected = false;
        self.writer = None;
        self.reader = None;
        self.out.clear();
        self.owed = 0;
        let mut wakers = Wakers::new();
        let from = usize::try_from(self.next_reply.saturating_sub(self.first)).unwrap_or(0);
        for slot in self.calls.iter_mut().skip(from) {
            match std::mem::replace(slot, Slot::Done) {
                Slot::Waiting(waker) => {
                    *slot = Slot::Lost;
                    wakers.extend(waker);
                }
                Slot::Abandoned => {}
                other => *slot = other,
            }
        }
        self.next_reply = self.next_call();
        self.pop_done();
        wakers
    }

    /// Reads the owed replies that have arrived, without waiting, if
    /// nobody is reading; the callers answered on the way.
    pub(super) fn read_owed_now(&mut self, wakers: &mut Wakers) {
        let Some(mut reader) = self.reader.take() else {
            return;
        };
        let mut context = Context::from_waker(Waker::noop());
        loop {
            match self.dispatch(&mut reader.buf, u64::MAX, wakers) {
                Ok(()) => {}
                Err(_) => {
                    wakers.extend(self.lose());
                    return;
                }
            }
            if self.owed == 0 {
                break;
            }
            // One poll: the bytes the socket has now, if any.
            match pin!(reader.half.read_buf(&mut reader.buf)).poll(&mut context) {
                Poll::Ready(Ok(n)) if n > 0 => {}
                Poll::Ready(_) => {
                    wakers.extend(self.lose());
                    return;
                }
                Poll::Pending => break,
            }
        }
        self.reader = Some(reader);
        // A caller woken to read next may have had its reply read here and
        // will leave without reading: the oldest caller still waiting
        // reads instead.
        wakers.extend(self.next_reader());
    }
}

pub(super) fn wake(wakers: Wakers) {
    wakers.into_iter().for_each(Waker::wake);
}
