//! The records the runner and the workers write, one JSON object a line.
//!
//! Workers and the fault injector only ever append; the checker reads the
//! files after the run. Keeping the format in one module is what lets the
//! checker be a pure function of these types, tested on hand-made logs.

use serde::{Deserialize, Serialize};

/// Microseconds since the Unix epoch. Every process on the machine reads
/// the same clock, so records of different workers can be ordered.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Which client call a [`WorkerEvent::Begin`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// `LockClient::lock_with`.
    Acquire,
    /// The fenced read of the counter.
    Read,
    /// The fenced write of read + 1 that also appends to the resource log.
    Write,
    /// `LockGuard::release`.
    Release,
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "is", rename_all = "snake_case")]
pub enum Outcome {
    /// It succeeded.
    Ok,
    /// The fence refused the token: the resource has seen `newest`.
    Stale {
        /// The newest token the resource had seen.
        newest: u64,
    },
    /// Any other error, with its message.
    Error {
        /// `Display` of the error.
        message: String,
    },
}

/// One line of a worker's log. A worker process writes one file; a
/// restarted worker writes a new one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum WorkerEvent {
    /// The process is connected and starts working.
    Started {
        /// Worker slot (a restarted worker keeps its slot).
        slot: usize,
        /// OS process id.
        pid: u32,
        /// When.
        at_us: u64,
    },
    /// A call starts. `limit_ms` is the longest it may take by its own
    /// timeouts; past `limit_ms` + 1 s it counts as a hang.
    Begin {
        /// Sequence number within this file, matched by [`WorkerEvent::End`].
        seq: u64,
        /// The call.
        call: CallKind,
        /// Index of the lock (and of its resource).
        lock: usize,
        /// The guard's owner id, for calls made under a grant.
        holder: Option<String>,
        /// The guard's token, for calls made under a grant.
        token: Option<u64>,
        /// When.
        at_us: u64,
        /// The call's own time limit.
        limit_ms: u64,
    },
    /// The call `seq` ended.
    End {
        /// As in the matching `Begin`.
        seq: u64,
        /// When.
        at_us: u64,
        /// How it ended.
        outcome: Outcome,
    },
    /// An acquire returned a guard.
    Acquired {
        /// Index of the lock.
        lock: usize,
        /// The guard's owner id: unique per grant.
        holder: String,
        /// Its fencing token.
        token: u64,
        /// When the acquire call started.
        begin_us: u64,
        /// When it returned.
        at_us: u64,
    },
    /// The guard's lease-lost signal was seen set.
    Lost {
        /// Index of the lock.
        lock: usize,
        /// The guard's owner id.
        holder: String,
        /// When it was first seen.
        at_us: u64,
    },
    /// The worker stopped at the end of the run, cleanly.
    Finished {
        /// When.
        at_us: u64,
    },
}

/// One entry of a resource's log list, appended by the same script that
/// writes the counter, so the list is the order in which Redis applied the
/// writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedWrite {
    /// The writer's fencing token.
    pub token: u64,
    /// The writer's owner id (one per grant).
    pub holder: String,
    /// The counter value the writer had read.
    pub read: i64,
    /// The value it wrote (read + 1).
    pub written: i64,
    /// When the writer sent it (µs since the epoch), to tell which fault
    /// a bad entry followed.
    pub at_us: u64,
}

/// The kinds of fault the injector picks from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL the process holding a lock, then start it again.
    KillHolder,
    /// SIGKILL a process that holds nothing (it waits), then start it again.
    KillWaiter,
    /// SIGSTOP a holder past its lease, then SIGCONT it.
    StopHolder,
    /// `CLIENT KILL TYPE normal` on the lock server.
    ClientKillNormal,
    /// `CLIENT KILL TYPE pubsub` on the lock server.
    ClientKillPubsub,
    /// `SCRIPT FLUSH` on the lock server.
    ScriptFlush,
    /// `DEBUG SLEEP` shorter than the lease.
    DebugSleepShort,
    /// `DEBUG SLEEP` longer than the lease.
    DebugSleepLong,
    /// Restart the lock server; its AOF (`appendfsync always`) keeps the data.
    RestartAof,
    /// Restart the lock server after deleting its AOF: every lock key is lost.
    RestartNoPersistence,
    /// A tiny `maxmemory` with `allkeys-lru`, so lock keys get evicted,
    /// while one worker reconnects (to see the connect-time warning).
    MaxmemoryEvict,
    /// Delay every packet between one worker and the lock server.
    ProxyDelay,
    /// Stop all traffic between one worker and the lock server.
    ProxyPartition,
}

impl FaultKind {
    /// Every kind, in the order the summary lists them.
    pub const ALL: [FaultKind; 13] = [
        FaultKind::KillHolder,
        FaultKind::KillWaiter,
        FaultKind::StopHolder,
        FaultKind::ClientKillNormal,
        FaultKind::ClientKillPubsub,
        FaultKind::ScriptFlush,
        FaultKind::DebugSleepShort,
        FaultKind::DebugSleepLong,
        FaultKind::RestartAof,
        FaultKind::RestartNoPersistence,
        FaultKind::MaxmemoryEvict,
        FaultKind::ProxyDelay,
        FaultKind::ProxyPartition,
    ];

    /// The snake_case name used in the logs and the summary.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillHolder => "kill_holder",
            FaultKind::KillWaiter => "kill_waiter",
            FaultKind::StopHolder => "stop_holder",
            FaultKind::ClientKillNormal => "client_kill_normal",
            FaultKind::ClientKillPubsub => "client_kill_pubsub",
            FaultKind::ScriptFlush => "script_flush",
            FaultKind::DebugSleepShort => "debug_sleep_short",
            FaultKind::DebugSleepLong => "debug_sleep_long",
            FaultKind::RestartAof => "restart_aof",
            FaultKind::RestartNoPersistence => "restart_no_persistence",
            FaultKind::MaxmemoryEvict => "maxmemory_evict",
            FaultKind::ProxyDelay => "proxy_delay",
            FaultKind::ProxyPartition => "proxy_partition",
        }
    }
}

/// One injected fault, written by the runner when it ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRecord {
    /// What was done.
    pub kind: FaultKind,
    /// The worker log file of the process it targeted, if any.
    pub target: Option<String>,
    /// When it started.
    pub start_us: u64,
    /// When it ended (the server is back, the process resumed, the
    /// network healed). Recovery is measured from here.
    pub end_us: u64,
    /// Free text: the sleep length, the maxmemory set, the replaced pid.
    pub detail: String,
}

/// How a worker process ended, written by the runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerExit {
    /// The worker's log file.
    pub log: String,
    /// Killed on purpose by the fault injector (unfinished calls are
    /// expected then).
    pub killed_by_fault: bool,
    /// The exit code, if it exited by itself.
    pub code: Option<i32>,
    /// The runner had to kill it after the run (it did not stop in time).
    pub killed_at_shutdown: bool,
    /// Its stderr mentioned a panic.
    pub panicked: bool,
    /// Its stderr carried a warning about an evicting `maxmemory-policy`.
    pub eviction_warning: bool,
}
