//! The errors of fairlock, each with a message that says what to do.

use std::time::Duration;

use fairlock_core::{NameError, ProtocolError};

/// The error type of the Redis client fairlock uses (fred), kept as the
/// [`std::error::Error::source`] of [`Error::Redis`] and
/// [`Error::Unreachable`].
pub use fred::error::{Error as RedisError, ErrorKind as RedisErrorKind};

/// Everything that can go wrong with a lock operation.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name was refused; Redis was not touched.
    #[error("invalid lock name: {0}")]
    InvalidName(#[from] NameError),

    /// An option was out of range; Redis was not touched. One exception:
    /// a RedLock lease found too short once a majority was won (the
    /// attempt took longer than the lease less its drift allowance); the
    /// votes it won were given back.
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

    /// Deadline-aware admission: the caller's place in the queue means it
    /// cannot be served within its wait timeout; it has left the queue.
    #[error("lock {name:?}: the holder and {position} callers are ahead and the lock is granted about every {per_grant:?}, so the wait of about {expected:?} would miss the {budget:?} wait timeout; try again later or raise the wait timeout")]
    WouldMissDeadline {
        /// The lock.
        name: String,
        /// Callers ahead in the queue.
        position: u64,
        /// The time a turn of the queue takes, as this client has seen it
        /// on the lock (a turn grants one caller of a lock, or as many as
        /// fit together in a permit set).
        per_grant: Duration,
        /// The expected wait: the holder's turn and the turns of the
        /// callers ahead.
        expected: Duration,
        /// What was left of the wait timeout.
        budget: Duration,
    },

    /// A release or extend came from someone who does not own the lock;
    /// nothing was changed.
    #[error("lock {name:?} is not held by this owner (its lease ran out, or it was force-released); the critical section may have overlapped another holder, check its fencing token")]
    NotOwner {
        /// The lock.
        name: String,
    },

    /// The lease ended while the work ran (see [`crate::LockClient::with_lock`]):
    /// the work was stopped, and another holder may have run meanwhile.
    #[error("the lease on lock {name:?} was lost while the work ran; the work was stopped, and another holder may have overlapped it: check the fencing token on every write")]
    LeaseLost {
        /// The lock.
        name: String,
    },

    /// A key where fairlock expects one of its own holds another Redis type;
    /// nothing was changed.
    #[error("{0}; another program uses this key: choose another lock name or key prefix")]
    WrongType(String),

    /// Redis could not be reached within the configured timeout.
    #[error("Redis at {url} is unreachable: {reason}; check that Redis runs at that address and accepts this host (and the URL's TLS scheme, user and password), or raise the connect timeout")]
    Unreachable {
        /// The URL, with any password removed.
        url: String,
        /// What failed.
        reason: String,
        /// The Redis client's error, if the failure came from it (`None`
        /// when the connect timeout ran out first).
        #[source]
        source: Option<RedisError>,
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

    /// The server's settings break the lock's guarantees (an eviction
    /// policy that can evict lock keys) and the client was configured to
    /// refuse such a server.
    #[error("{0}")]
    UnsafeServer(String),

    /// Fewer replicas than [`crate::ClientConfig::replica_acks`] asks for
    /// acknowledged a lock write in time. An acquire has given back what it
    /// took; a release has happened on the primary but may be lost in a
    /// fail-over.
    #[error("only {acked} of {wanted} replicas acknowledged the lock write in time; check replication (INFO replication) or lower replica_acks")]
    NotReplicated {
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },

    /// Redis refused a write because the server is a read-only replica
    /// (`READONLY`); nothing was changed.
    #[error("Redis refused a write, the server is a read-only replica ({0}); point the client at the primary, or at Sentinel or Cluster so it follows fail-overs")]
    ReadOnly(String),

    /// Redis refused a write because it reached `maxmemory` under the
    /// `noeviction` policy (`OOM`); nothing was changed.
    #[error("Redis is out of memory and refuses writes ({0}); free memory or raise maxmemory, but keep maxmemory-policy noeviction: an evicting policy can evict lock keys")]
    OutOfMemory(String),

    /// Redis is busy running another (long) script past its
    /// `busy-reply-threshold` and answers nothing else (`BUSY`); nothing
    /// was changed.
    #[error("Redis is busy running another script ({0}); find and stop it (SCRIPT KILL, or FUNCTION KILL for a function), then retry")]
    Busy(String),

    /// The Redis user lacks a permission fairlock needs (`NOPERM`): a
    /// command, a key or a channel. Nothing was changed.
    #[error("the Redis user lacks a permission fairlock needs ({0}); grant it the commands +evalsha +script|load +subscribe +ping +config|get, the keys ~<prefix>* and the channels &<prefix>notify:*")]
    NoPermission(String),

    /// A script failed inside Redis with an error of its own (not one of
    /// the errors above). From a fairlock lock script it should not happen:
    /// report it, with the message, as a bug. From a fenced write it is the
    /// write Redis refused (`IncrBy` on a value that is not an integer, or
    /// past the 64-bit range), and from a fenced user script
    /// ([`crate::FencedScript`]) that script's error: the token was not
    /// recorded.
    #[error("script {script} failed in Redis: {detail}; in a fairlock lock script this is a bug, please report it with this message (in a fenced write, the target's value refused the operation; in a fenced user script, fix the script)")]
    ScriptFailed {
        /// The script that failed.
        script: String,
        /// Redis's message.
        detail: String,
    },

    /// A script's reply had an unexpected shape.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),

    /// Any other error reported by Redis or the connection; the Redis
    /// client's error is kept as the [`std::error::Error::source`].
    #[error("Redis failed {operation}: {source}; check the Redis server's log and the network, then retry")]
    Redis {
        /// What was being done.
        operation: String,
        /// The Redis client's error (its kind and Redis's message).
        #[source]
        source: RedisError,
    },

    /// The client was shut down.
    #[error("the fairlock client was shut down; connect a new client to lock again")]
    Closed,

    /// RedLock: fewer than a majority of the primaries could take part in
    /// an operation (down, too slow, refusing, or restarted too recently to
    /// vote). An acquire has given back whatever it took; nothing waits.
    #[error("lock {name:?}: only {answered} of {primaries} primaries took part and RedLock needs {needed}; {}; bring the failed primaries back (a primary restarted without persistence votes again once the restart delay has passed)", describe_failures(.failures))]
    NoQuorum {
        /// The lock.
        name: String,
        /// Primaries that answered.
        answered: usize,
        /// Primaries configured.
        primaries: usize,
        /// The majority needed.
        needed: usize,
        /// Each primary that failed, and why.
        failures: Vec<PrimaryFailure>,
    },
}

/// One RedLock primary that could not take part in an operation (see
/// [`Error::NoQuorum`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryFailure {
    /// Its position in the configured list of URLs.
    pub index: usize,
    /// Its URL, with any password removed.
    pub url: String,
    /// Why it failed.
    pub kind: PrimaryFailureKind,
}

/// Why a RedLock primary could not take part.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrimaryFailureKind {
    /// Not connected (down, or never reached); the client keeps reconnecting.
    Disconnected,
    /// No answer within the call timeout.
    Timeout,
    /// Restarted less than the restart delay ago: it may have lost, without
    /// persistence, a vote it gave before, so it does not vote yet.
    RestartedRecently {
        /// Its uptime when asked.
        uptime: Duration,
    },
    /// Any other error, with its message.
    Failed(String),
}

impl Error {
    /// Whether Redis could not be reached or did not answer in time (a
    /// restart, a fail-over, a stall, a client still reconnecting), as
    /// opposed to an answer refusing the call.
    pub(crate) fn is_outage(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::Unreachable { .. } => true,
            Error::Redis { source, .. } => matches!(source.kind(), RedisErrorKind::IO),
            _ => false,
        }
    }
}

impl std::fmt::Display for PrimaryFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "primary {} ({}) ", self.index, self.url)?;
        match &self.kind {
            PrimaryFailureKind::Disconnected => f.write_str("is not connected"),
            PrimaryFailureKind::Timeout => f.write_str("did not answer in time"),
            PrimaryFailureKind::RestartedRecently { uptime } => {
                write!(f, "restarted {uptime:?} ago and may not vote yet")
            }
            PrimaryFailureKind::Failed(detail) => write!(f, "failed: {detail}"),
        }
    }
}

fn describe_failures(failures: &[PrimaryFailure]) -> String {
    if failures.is_empty() {
        return "no primary failed outright".to_owned();
    }
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// `Result` with fairlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
