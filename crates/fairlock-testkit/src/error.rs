//! The one error type of the test kit. Tests print it on failure, so every
//! variant carries what a reader needs to see why a server or a topology did
//! not come up (the log tail, the timeout that ran out).

use std::fmt;
use std::io;

/// Errors returned by this crate.
#[derive(Debug)]
pub enum TestkitError {
    /// `redis-server` (or `valkey-server`) is missing; the message says how to
    /// install it.
    NotInstalled(String),
    /// An I/O error (spawning, connecting, reading, writing, temp dirs, ...).
    Io(io::Error),
    /// `redis-server` did not come up. `log_tail` starts with a one-line
    /// summary of what went wrong, followed by the tail of the server's log
    /// file and of its stderr (where Redis reports configuration errors).
    StartFailed {
        /// Summary line plus the last lines of the server's log and stderr.
        log_tail: String,
    },
    /// The server sent something that is not valid RESP2, or an unexpected
    /// reply to an admin command issued by this crate.
    Protocol(String),
    /// A topology (cluster, sentinels, replication) did not reach the state
    /// waited for in time; the message names the state and the last reply.
    Timeout(String),
}

impl fmt::Display for TestkitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TestkitError::NotInstalled(msg) => f.write_str(msg),
            TestkitError::Io(e) => write!(f, "I/O error: {e}"),
            TestkitError::StartFailed { log_tail } => {
                write!(f, "redis-server failed to start: {log_tail}")
            }
            TestkitError::Protocol(msg) => write!(f, "RESP protocol error: {msg}"),
            TestkitError::Timeout(msg) => write!(f, "timed out: {msg}"),
        }
    }
}

impl std::error::Error for TestkitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TestkitError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for TestkitError {
    fn from(e: io::Error) -> Self {
        TestkitError::Io(e)
    }
}
