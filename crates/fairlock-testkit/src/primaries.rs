//! N unrelated primaries for a RedLock mode: [`IndependentPrimaries`].
//!
//! RedLock's claims are about a majority of independent servers surviving
//! while a minority dies or restarts empty, so the type's helpers are exactly
//! those faults: kill some, restart one without its data.

use crate::{RedisServer, TestkitError};

/// `n` standalone primaries on 127.0.0.1 that know nothing of each other
/// (no replication, no cluster), each killed on drop.
///
/// ```no_run
/// use fairlock_testkit::IndependentPrimaries;
///
/// let mut primaries = IndependentPrimaries::start(5)?;
/// let urls = primaries.urls();
/// primaries.kill(&[0, 1]); // a minority is gone
/// # Ok::<(), fairlock_testkit::TestkitError>(())
/// ```
#[derive(Debug)]
pub struct IndependentPrimaries {
    servers: Vec<RedisServer>,
}

impl IndependentPrimaries {
    /// Starts `n` servers (3 or 5 for RedLock).
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`].
    pub fn start(n: usize) -> Result<IndependentPrimaries, TestkitError> {
        let servers = (0..n)
            .map(|_| RedisServer::start())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IndependentPrimaries { servers })
    }

    /// The servers, in start order.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// `redis://127.0.0.1:<port>` of each server, in start order.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// SIGKILLs the servers at `indexes` (out-of-range indexes are ignored).
    pub fn kill(&mut self, indexes: &[usize]) {
        for &i in indexes {
            if let Some(server) = self.servers.get_mut(i) {
                server.kill();
            }
        }
    }

    /// Restarts server `index` on its port, empty (no persistence), as after
    /// a crash without an append-only file.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::restart`], or [`TestkitError::Protocol`] for an
    /// index out of range.
    pub fn restart(&mut self, index: usize) -> Result<(), TestkitError> {
        self.servers
            .get_mut(index)
            .ok_or_else(|| TestkitError::Protocol(format!("no primary number {index}")))?
            .restart()
    }

    /// How many servers are running.
    pub fn running(&mut self) -> usize {
        self.servers
            .iter_mut()
            .filter_map(|s| s.is_running().then_some(()))
            .count()
    }
}
