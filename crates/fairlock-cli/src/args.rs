//! The command line grammar (clap derive). Only parsing lives here; each
//! subcommand's behaviour is in its own module.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration::{parse_duration, parse_period};

/// Inspect, list, force-release and watch fairlock locks, or run a command
/// under one.
///
/// A lock NAME is the raw bytes of its argument, UTF-8 or not (in bash,
/// `$'job\xff'` for a byte 0xff). A name that is not UTF-8 is shown as a
/// Rust byte string, `b"..."` escaped as Rust's `escape_ascii` does, and
/// `--json` adds its exact bytes as hex (`name_hex`).
///
/// Exit codes: 0 ok; 1 error; 2 usage; 3 `release --holder` found another
/// holder; 69 Redis unreachable; `lock` passes the command's own code
/// through, or 73 if the wait timed out, 75 if the lease was lost while the
/// command ran, 126/127 if it could not be run, 130 if interrupted while
/// waiting.
#[derive(Debug, Parser)]
#[command(name = "fairlock", version)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand takes.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Redis URL, `redis://[user:password@]host:port[/db]` (`rediss://` for
    /// TLS when built with the `tls` feature). Default: $REDIS_URL, else
    /// redis://127.0.0.1:6379.
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// Key prefix of the locks (the client's `ClientConfig::prefix`).
    #[arg(long, global = true, default_value = "fairlock:")]
    pub prefix: String,
    /// Machine-readable output (one JSON document per line).
    #[arg(long, global = true)]
    pub json: bool,
    /// Limit for connecting and for every Redis call.
    #[arg(long, global = true, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Holder, token, lease left and the queue of one lock.
    Inspect {
        /// The lock name: the argument's bytes, UTF-8 or not.
        name: OsString,
        /// How many waiters to list, oldest first.
        #[arg(long, default_value_t = 50)]
        limit: u64,
    },
    /// Locks that have a holder or waiters (SCAN, bounded).
    ///
    /// A name that is not UTF-8 is shown as a Rust byte string, `b"..."`
    /// with its bytes escaped as Rust's `escape_ascii` does (`b"job\xff"`);
    /// with `--json`, `name_hex` holds its exact bytes as hex (null for a
    /// UTF-8 name, whose `name` is exact).
    List {
        /// List at most this many locks.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Stop after this many SCAN calls (of COUNT 1000 keys each); the
        /// output then says it may be incomplete.
        #[arg(long, default_value_t = 1_000)]
        max_scans: u32,
    },
    /// ADMIN: free a lock from its holder and hand it to the next waiter.
    Release {
        /// Required: this bypasses the holder, who loses the lock.
        #[arg(long, required = true)]
        force: bool,
        /// Free the lock only if this holder still has it: its owner id as
        /// `inspect` shows it under `holder` (optionally followed by a space
        /// and the token), or just the owner id's nonce (`inspect --json`'s
        /// `nonce`); otherwise change nothing and exit with code 3.
        #[arg(long)]
        holder: Option<String>,
        /// The lock name: the argument's bytes, UTF-8 or not.
        name: OsString,
    },
    /// Run a command while holding the lock; its exit code is passed through.
    ///
    /// The child sees FAIRLOCK_TOKEN (the fencing token) and FAIRLOCK_HOLDER
    /// (the holder id). If the lease is lost, the child gets SIGTERM (SIGKILL
    /// after --grace) and fairlock exits with 75; if --wait runs out, 73.
    Lock {
        /// A fixed lease; without it the watchdog renews the lease while the
        /// command runs.
        #[arg(long, value_parser = parse_duration)]
        lease: Option<Duration>,
        /// Give up waiting for the lock after this long (exit code 73).
        #[arg(long, value_parser = parse_duration)]
        wait: Option<Duration>,
        /// After SIGTERM on lease loss, wait this long before SIGKILL.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        grace: Duration,
        /// The lock name: the argument's bytes, UTF-8 or not.
        name: OsString,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Redraw holder and queue every interval until Ctrl-C.
    Watch {
        /// The lock name: the argument's bytes, UTF-8 or not.
        name: OsString,
        /// Time between snapshots (1ms or more).
        #[arg(long, default_value = "1s", value_parser = parse_period)]
        interval: Duration,
        /// Waiters shown per snapshot.
        #[arg(long, default_value_t = 20)]
        limit: u64,
        /// Stop after this many snapshots (default: until Ctrl-C).
        #[arg(long)]
        count: Option<u64>,
    },
}
