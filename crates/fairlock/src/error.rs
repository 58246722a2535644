//! The errors of fairlock, each with a message that says what to do.

use std::time::Duration;

use fairlock_core::{NameError, ProtocolError};

/// Everything that can go wrong with a lock operation.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name was refused; Redis was not touched.
    #[error("invalid lock name: {0}")]
    InvalidName(#[from] NameError),

    /// An option was out of range; Redis was not touched.
    #[error("invalid option: {0}")]
    InvalidOptions(String),

    /// The wait for the lock ran out; the waiter has left the queue.
    #[error("timed out after {waited:?} waiting for lock {name:?}; raise the wait timeout or shorten the holders' critical sections")]
    WaitTimeout {
        /// The lock waited for.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// A release or extend came from someone who does not own the lock;
    /// nothing was changed.
    #[error("lock {name:?} is not held by this owner (its lease ran out, or it was force-released); the critical section may have overlapped another holder, check its fencing token")]
    NotOwner {
        /// The lock.
        name: String,
    },

    /// A key where fairlock expects one of its own holds another Redis type;
    /// nothing was changed.
    #[error("{0}; another program uses this key: choose another lock name or key prefix")]
    WrongType(String),

    /// Redis could not be reached within the configured timeout.
    #[error("Redis at {url} is unreachable: {reason}")]
    Unreachable {
        /// The URL, with any password removed.
        url: String,
        /// What failed.
        reason: String,
    },

    /// A Redis call did not answer within the command timeout.
    #[error("Redis did not answer {operation} within {timeout:?}; check the server's load and the network, or raise the command timeout")]
    Timeout {
        /// What was being done.
        operation: String,
        /// The configured command timeout.
        timeout: Duration,
    },

    /// A script was missing from Redis even right after loading it, e.g. a
    /// proxy that routes `SCRIPT LOAD` and `EVALSHA` to different servers.
    #[error("script {0} is missing from Redis even after SCRIPT LOAD; if a proxy sits in front of Redis, make it route scripts to one server")]
    ScriptMissing(String),

    /// A fenced write was refused: a holder with a newer fencing token has
    /// written to the resource since. Nothing was changed.
    #[error("fencing token {token} is stale: the resource has seen token {newest}; this holder lost the lock (its lease ran out) and must not write")]
    StaleToken {
        /// The refused token.
        token: u64,
        /// The newest token the resource has seen.
        newest: u64,
    },

    /// A script's reply had an unexpected shape.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),

    /// Any other error reported by Redis or the connection.
    #[error("Redis error: {0}")]
    Redis(String),

    /// The client was shut down.
    #[error("the fairlock client was shut down")]
    Closed,
}

/// `Result` with fairlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
