//! The exit codes of `fairlock`, in one place so scripts can rely on them.
//!
//! `fairlock lock` passes its child's exit status through, so its own
//! outcomes use codes from `sysexits.h` that ordinary commands rarely
//! return, and a script can tell "the command failed" from "the lock
//! failed".

/// Success, or a forced release that found nothing to free.
pub const OK: u8 = 0;
/// Any other failure (Redis error, bad name, ...); the message says what.
pub const FAILURE: u8 = 1;
// 2: bad usage, returned by clap itself.
/// `release --force --holder ID`: the lock is held by someone else now;
/// nothing was changed.
pub const HOLDER_CHANGED: u8 = 3;
/// Redis could not be reached or did not answer in time (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// `lock --wait`: the wait timed out; the command was not run (`EX_CANTCREAT`).
pub const WAIT_TIMEOUT: u8 = 73;
/// `lock`: the lease was lost while the command ran; the command was
/// signalled (SIGTERM, then SIGKILL after a grace) and may have overlapped
/// another holder (`EX_TEMPFAIL`).
pub const LEASE_LOST: u8 = 75;
/// `lock`: interrupted (SIGINT) while waiting; the command was not run.
pub const INTERRUPTED: u8 = 130;
/// `lock`: terminated (SIGTERM) while waiting; the command was not run.
pub const TERMINATED: u8 = 143;
/// `lock`: the command could not be executed (as a shell reports it).
pub const CANNOT_EXECUTE: u8 = 126;
/// `lock`: the command was not found (as a shell reports it).
pub const NOT_FOUND: u8 = 127;

/// A failed command: the exit code and the message printed on stderr.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code.
    pub code: u8,
    /// What went wrong and what to do, for people.
    pub message: String,
}

impl Failure {
    /// A failure with `code`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<fairlock::Error> for Failure {
    fn from(error: fairlock::Error) -> Self {
        let code = match error {
            fairlock::Error::Unreachable { .. } | fairlock::Error::Timeout { .. } => UNAVAILABLE,
            fairlock::Error::WaitTimeout { .. } => WAIT_TIMEOUT,
            _ => FAILURE,
        };
        Self::new(code, error.to_string())
    }
}
