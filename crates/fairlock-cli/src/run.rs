//! `fairlock lock NAME -- CMD ARGS...`: runs a command while holding a lock.
//!
//! The command is a child process; fairlock stays its parent for its whole
//! life so it can (1) keep the lease (the client's watchdog, or a fixed
//! `--lease`), (2) stop the child the moment the lease is lost, since from
//! then on another holder may run, and (3) release the lock only after the
//! child has exited. The child learns its fencing token from
//! `FAIRLOCK_TOKEN` (and its holder id from `FAIRLOCK_HOLDER`) so it can
//! pass the token to the resource it writes to: only the token protects
//! against a child that outlives its lease anyway (a paused machine).

use std::ffi::OsStr;
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::time::Duration;

use fairlock::{LockClient, LockGuard, LockOptions};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::exit::{
    Failure, CANNOT_EXECUTE, FAILURE, INTERRUPTED, LEASE_LOST, NOT_FOUND, TERMINATED,
};
use crate::name::quoted;

/// What `fairlock lock` was asked to do.
pub struct LockRun<'a> {
    /// The lock name, UTF-8 or not.
    pub name: &'a [u8],
    /// A fixed lease, or `None` for the watchdog.
    pub lease: Option<Duration>,
    /// How long to wait for the lock, or `None` for no limit.
    pub wait: Option<Duration>,
    /// SIGTERM → SIGKILL delay on lease loss.
    pub grace: Duration,
    /// The command and its arguments.
    pub command: &'a [String],
}

/// Takes the lock, runs the command, releases; returns the exit code.
pub async fn run_locked(client: &LockClient, run: LockRun<'_>) -> Result<u8, Failure> {
    if let Some(warning) = client.eviction_warning() {
        // The lock's guarantees depend on it; a script's operator should see it.
        eprintln!("fairlock: warning: {warning}");
    }
    let mut options = LockOptions::new();
    if let Some(lease) = run.lease {
        options = options.lease(lease);
    }
    if let Some(wait) = run.wait {
        options = options.wait_timeout(wait);
    }
    let signal_error =
        |e: std::io::Error| Failure::new(FAILURE, format!("cannot install signal handlers: {e}"));
    let mut term = signal(SignalKind::terminate()).map_err(signal_error)?;
    let guard = tokio::select! {
        guard = client.lock_with(run.name, options) => guard?,
        // Dropping the acquire future leaves the queue: its cancel runs
        // before the client's shutdown closes the connections.
        _ = tokio::signal::ctrl_c() => return Err(Failure::new(INTERRUPTED, "interrupted while waiting for the lock")),
        _ = term.recv() => return Err(Failure::new(TERMINATED, "terminated while waiting for the lock")),
    };
    let (program, args) = run
        .command
        .split_first()
        .ok_or_else(|| Failure::new(FAILURE, "no command given after --"))?;
    let spawned = Command::new(program)
        .args(args)
        .env("FAIRLOCK_TOKEN", guard.token().value().to_string())
        .env("FAIRLOCK_HOLDER", guard.owner_id())
        .env("FAIRLOCK_LOCK", OsStr::from_bytes(run.name))
        .spawn();
    let child = match spawned {
        Ok(child) => child,
        Err(error) => {
            let _ = guard.release().await;
            let code = if error.kind() == ErrorKind::NotFound {
                NOT_FOUND
            } else {
                CANNOT_EXECUTE
            };
            return Err(Failure::new(
                code,
                format!("cannot run {program:?}: {error}"),
            ));
        }
    };
    let (status, lost) = supervise(child, &guard, run.grace).await?;
    if lost {
        let _ = guard.release().await;
        return Err(Failure::new(
            LEASE_LOST,
            format!(
                "lost the lease on {} while the command ran (force-released, or it could not be renewed); the command was stopped and may have overlapped another holder",
                quoted(run.name)
            ),
        ));
    }
    match guard.release().await {
        Ok(()) => Ok(exit_code(status)),
        Err(fairlock::Error::NotOwner { .. }) => Err(Failure::new(
            LEASE_LOST,
            format!(
                "the command finished but the lease on {} was gone at release; its work may have overlapped another holder",
                quoted(run.name)
            ),
        )),
        Err(error) => {
            // The lease runs out by itself; the command's own result stands.
            eprintln!(
                "fairlock: warning: release of {} failed: {error}",
                quoted(run.name)
            );
            Ok(exit_code(status))
        }
    }
}

/// Waits for the child; stops it if the lease is lost. Forwards SIGTERM and
/// SIGHUP sent to fairlock, and outlives SIGINT (the terminal sends Ctrl-C
/// to the child too), so the lock is released only once the child is gone.
/// Returns the child's status and whether the lease was lost.
async fn supervise(
    mut child: Child,
    guard: &LockGuard,
    grace: Duration,
) -> Result<(ExitStatus, bool), Failure> {
    let signal_error =
        |e: std::io::Error| Failure::new(FAILURE, format!("cannot install signal handlers: {e}"));
    let mut term = signal(SignalKind::terminate()).map_err(signal_error)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(signal_error)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let wait_error =
        |e: std::io::Error| Failure::new(FAILURE, format!("cannot wait for the command: {e}"));
    loop {
        tokio::select! {
            status = child.wait() => return Ok((status.map_err(wait_error)?, false)),
            _ = guard.lost() => break,
            _ = term.recv() => send_signal(&child, libc::SIGTERM),
            _ = hangup.recv() => send_signal(&child, libc::SIGHUP),
            _ = interrupt.recv() => {}
        }
    }
    send_signal(&child, libc::SIGTERM);
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status.map_err(wait_error)?,
        Err(_) => {
            let _ = child.start_kill();
            child.wait().await.map_err(wait_error)?
        }
    };
    Ok((status, true))
}

fn send_signal(child: &Child, signal: libc::c_int) {
    if let Some(pid) = child.id().and_then(|pid| libc::pid_t::try_from(pid).ok()) {
        // SAFETY: kill(2) has no memory effects; the pid is our own
        // unreaped child (tokio reports no id once it is reaped), so it
        // cannot name a recycled process.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// The child's exit code, or 128 + signal number if a signal ended it (as
/// shells report it).
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(FAILURE),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(FAILURE),
        (None, None) => FAILURE,
    }
}
