//! The guards a caller holds while its call is on the socket: each puts
//! the socket right if the caller's future is dropped part-way (a call
//! abandoned leaves its reply owed, a write cut short loses the socket, a
//! reader gives the read half back and wakes the next caller to read).

use super::pipe::{wake, Reader, Slot, Wakers};
use super::ScriptSocket;

/// A caller's call on the socket; dropped before its outcome was
/// collected, the call is abandoned and its reply owed.
pub(super) struct Taken<'a> {
    pub(super) socket: &'a ScriptSocket,
    pub(super) call: u64,
    pub(super) collected: bool,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if self.collected {
            return;
        }
        let mut wakers = Wakers::new();
        {
            let mut pipe = self.socket.lock();
            let owed = match pipe.slot(self.call) {
                Some(slot @ Slot::Waiting(_)) => {
                    *slot = Slot::Abandoned;
                    true
                }
                Some(slot) => {
                    *slot = Slot::Done;
                    false
                }
                None => false,
            };
            if owed {
                pipe.owed += 1;
            }
            pipe.caller_left(&mut wakers);
            // This caller may have been the one woken to read.
            if pipe.reader.is_some() {
                wakers.extend(pipe.next_reader());
            }
        }
        wake(wakers);
    }
}

/// The write half taken out with the bytes to write; dropped part-way,
/// the socket is lost (the rest of a command would never come).
pub(super) struct Writing<'a> {
    pub(super) socket: &'a ScriptSocket,
    pub(super) epoch: u64,
    pub(super) finished: bool,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.socket.lose(self.epoch);
        }
    }
}

/// The read half taken out; put back when the reading caller is done or
/// dropped, and the next waiting caller woken to read.
pub(super) struct Reading<'a> {
    pub(super) socket: &'a ScriptSocket,
    pub(super) reader: Option<Reader>,
    pub(super) epoch: u64,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let Some(reader) = self.reader.take() else {
            return;
        };
        let next = {
            let mut pipe = self.socket.lock();
            if pipe.epoch != self.epoch {
                return;
            }
            pipe.reader = Some(reader);
            pipe.next_reader()
        };
        if let Some(waker) = next {
            waker.wake();
        }
    }
}
