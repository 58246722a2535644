//! The run's shape (how long, how many workers, how many locks) and the
//! protocol timings every worker uses.
//!
//! The timings are short on purpose: a 2 s lease lets a two-minute run
//! see many leases expire, and the recovery bound the checker enforces
//! (lease + waiter timeout + 1 s) follows from them.

use std::time::Duration;

use fairlock::ClientConfig;

use crate::events::FaultKind;

/// Watchdog lease of every hold.
pub const LEASE: Duration = Duration::from_secs(2);
/// A waiter without heartbeat for this long is dead.
pub const WAITER_TIMEOUT: Duration = Duration::from_secs(2);
/// How often workers refresh their waiters.
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// Limit of every Redis call.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// Limit for connecting.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one acquire may wait.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(6);
/// Longest recovery the checker accepts after a fault.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(5);

/// Client settings shared by every worker.
pub fn client_config(url: &str) -> ClientConfig {
    let mut config = ClientConfig::new(url);
    config.connect_timeout = CONNECT_TIMEOUT;
    config.command_timeout = COMMAND_TIMEOUT;
    config.heartbeat_interval = HEARTBEAT;
    config.waiter_timeout = WAITER_TIMEOUT;
    config.watchdog_lease = LEASE;
    config
}

/// The lock name of lock `index`.
pub fn lock_name(index: usize) -> String {
    format!("chaos:lock:{index}")
}

/// How a run is shaped.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Worker processes.
    pub workers: usize,
    /// Locks (and resources) they contend on.
    pub locks: usize,
    /// Time during which faults are injected.
    pub fault_phase: Duration,
    /// Quiet time at the end, so the last fault's effects clear before the
    /// clean shutdown is checked.
    pub quiet_phase: Duration,
    /// Shortest and longest pause between faults. The shortest is above
    /// [`RECOVERY_BOUND`], so a recovery within the bound always completes
    /// before the next fault starts.
    pub fault_gap: (Duration, Duration),
    /// Seed of the fault schedule (printed, so a run can be repeated).
    pub seed: u64,
    /// Inject only this kind of fault (to see which counts it alone
    /// breaks); every kind in turn when `None`.
    pub only: Option<FaultKind>,
}

impl RunConfig {
    /// The CI run: under 2.5 minutes on 2 cores.
    pub fn short(seed: u64) -> Self {
        Self {
            workers: 4,
            locks: 3,
            fault_phase: Duration::from_secs(108),
            quiet_phase: Duration::from_secs(6),
            fault_gap: (Duration::from_millis(5_200), Duration::from_millis(5_600)),
            seed,
            only: None,
        }
    }

    /// The long run: 30 minutes.
    pub fn long(seed: u64) -> Self {
        Self {
            workers: 6,
            fault_phase: Duration::from_secs(30 * 60 - 20),
            quiet_phase: Duration::from_secs(20),
            fault_gap: (Duration::from_millis(5_500), Duration::from_secs(12)),
            ..Self::short(seed)
        }
    }
}
