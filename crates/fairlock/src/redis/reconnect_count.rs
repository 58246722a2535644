//! Counts fred's reconnects of the two command connections, so that a
//! `WAIT` is believed only for writes made on the connection it ran on.
//!
//! `WAIT` counts the replicas that have every write *its own connection*
//! made. When fred reconnects it sends the commands in flight again on
//! the new connection, which may reach another server (a fail-over behind
//! one address, a Sentinel switch): there a `WAIT` sent again covers
//! none of the writes made before, and answers at once with whatever
//! replicas that server has. fred announces a reconnect before it sends
//! anything on the new connection, so a count read after a `WAIT`'s
//! answer includes every reconnect that answer could have come through.

use std::sync::Mutex;

use fred::prelude::{Client, EventInterface, Server};
use tokio::sync::broadcast::{error::TryRecvError, Receiver};

/// A point in a [`ReconnectCount`]: the reconnects announced before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReconnectMark(u64);

impl ReconnectMark {
    /// The mark of a client that does not count (no replica
    /// acknowledgement asked for).
    pub(crate) const NONE: ReconnectMark = ReconnectMark(0);
}

/// fred's reconnect announcements of the command connections, counted.
pub(crate) struct ReconnectCount {
    seen: Mutex<(Vec<Receiver<Server>>, u64)>,
}

impl ReconnectCount {
    /// Listens to `clients`' reconnects (before they connect, so their
    /// first connect is counted too; marks are only compared).
    pub(crate) fn new(clients: &[&Client]) -> Self {
        let receivers = clients.iter().map(|c| c.reconnect_rx()).collect();
        Self {
            seen: Mutex::new((receivers, 0)),
        }
    }

    /// The reconnects announced so far.
    pub(crate) fn mark(&self) -> ReconnectMark {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (receivers, count) = &mut *seen;
        for receiver in receivers.iter_mut() {
            loop {
                match receiver.try_recv() {
                    Ok(_) => *count += 1,
                    // Announcements dropped unread are reconnects too.
                    Err(TryRecvError::Lagged(missed)) => *count += missed,
                    Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                }
            }
        }
        ReconnectMark(*count)
    }
}
