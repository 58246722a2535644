//! The records of a run: one serialisable type per kind of line in
//! `results.jsonl` (`"run"`, `"ping"`, `"uncontended"`, `"waiters"`,
//! `"cell"`, `"processes"`, `"many_locks"`), built from the raw
//! measurements, and [`Results`], everything one run measured. The
//! markdown, the targets and the charts are all read from these.

use std::collections::BTreeMap;

use serde::Serialize;

use super::format::fmt_ms;
use crate::cell::CellRun;
use crate::impls::{Implementation, Result};
use crate::probes::{Latency, WaiterCost};
use crate::stats::CellMetrics;

/// One cell of the matrix, or of the many-locks run, as a JSON line.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CellRecord {
    /// "cell" (one hot lock), "processes" (one hot lock, contenders in
    /// separate OS processes) or "many_locks".
    pub kind: &'static str,
    /// Implementation label.
    pub implementation: &'static str,
    /// Contender tasks.
    pub contenders: usize,
    /// Hold time between GET and SET, ms.
    pub hold_ms: f64,
    /// Distinct locks.
    pub locks: usize,
    /// Simulated client processes.
    pub clients: usize,
    /// Measured window, s.
    pub window_s: f64,
    /// Whether every contender had acquired once before the window.
    pub warmed_up: bool,
    /// Acquisitions in the window.
    pub cycles: u64,
    /// Acquisitions per second.
    pub cycles_per_s: f64,
    /// Window / cycles, ms.
    pub mean_cycle_ms: f64,
    /// Mean time held, ms (hold time plus the GET and SET).
    pub hold_mean_ms: f64,
    /// Wait percentiles, ms.
    pub wait_p50_ms: Option<f64>,
    /// See `wait_p50_ms`.
    pub wait_p99_ms: Option<f64>,
    /// See `wait_p50_ms`.
    pub wait_max_ms: Option<f64>,
    /// Handoffs observed in the window.
    pub handoffs: u64,
    /// Handoff percentiles, ms.
    pub handoff_p50_ms: Option<f64>,
    /// See `handoff_p50_ms`.
    pub handoff_p99_ms: Option<f64>,
    /// Median time from an acquisition to the answer of the critical
    /// section's first command (a GET), ms: one round trip, plus whatever
    /// Redis or the client still had to do for the previous holder.
    pub first_command_p50_ms: Option<f64>,
    /// Median PING round trip during the window (another connection of
    /// the same process), ms.
    pub ping_p50_ms: Option<f64>,
    /// Lock commands the clients sent, per cycle.
    pub cmds_top_level_per_cycle: f64,
    /// Lock commands Redis executed, including inside scripts, per cycle.
    pub cmds_total_per_cycle: f64,
    /// Lock commands in the window by name (Redis 7 counts script-internal
    /// commands under their own names too).
    pub commands: BTreeMap<String, u64>,
    /// Jain's fairness index over contenders, counted over whole
    /// fair-share rounds (C x mean cycle time) of the window.
    pub jain: f64,
    /// The whole rounds `jain` was counted over (0: the raw window).
    pub jain_rounds: u64,
    /// Jain's fairness index over the raw window.
    pub jain_window: f64,
    /// Acquisitions that overtook an older waiter.
    pub overtakes: u64,
    /// overtakes / cycles.
    pub overtake_fraction: f64,
    /// Acquisitions that overtook a waiter at least 1 ms older.
    pub overtakes_over_1ms: u64,
    /// overtakes_over_1ms / cycles.
    pub overtake_over_1ms_fraction: f64,
    /// From the `lock()` call to its enqueue running in Redis (queued
    /// fairlock grants), p50, ms.
    pub call_to_ticket_p50_ms: Option<f64>,
    /// Same, p99, ms.
    pub call_to_ticket_p99_ms: Option<f64>,
    /// Grants out of queue-ticket order (locks with tickets only).
    pub ticket_inversions: Option<u64>,
    /// Lost updates (must be 0).
    pub violations: u64,
    /// Critical sections completed over the whole cell.
    pub cs_completed: u64,
    /// Failed calls and aborted tasks.
    pub errors: u64,
    /// The first error, if any.
    pub first_error: Option<String>,
    /// Redis CPU (user + sys) in the window, s.
    pub redis_cpu_s: f64,
    /// Redis CPU per cycle, microseconds.
    pub redis_cpu_us_per_cycle: f64,
    /// CPU of the benchmark process (lock clients and harness) in the
    /// window, s; `None` when the contenders ran in other processes.
    pub bench_cpu_s: Option<f64>,
    /// `bench_cpu_s` per cycle, microseconds.
    pub bench_cpu_us_per_cycle: Option<f64>,
    /// Cycles/s of every round of the cell, in the order they ran, when
    /// it ran in rounds (`rounds.rs`; this record is the median round);
    /// empty for a cell measured once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rounds_cycles_per_s: Vec<f64>,
    /// Wait CDF points (ms, fraction), kept for the charts only.
    #[serde(skip)]
    pub wait_cdf: Vec<(f64, f64)>,
}

impl CellRecord {
    /// Builds the record of a cell.
    pub fn new(
        kind: &'static str,
        imp: Implementation,
        run: &CellRun,
        metrics: &CellMetrics,
    ) -> CellRecord {
        let (top, total) = metrics.commands_per_cycle();
        CellRecord {
            kind,
            implementation: imp.label(),
            contenders: run.plan.contenders,
            hold_ms: run.plan.hold.as_secs_f64() * 1e3,
            locks: run.plan.locks,
            clients: run.plan.clients,
            window_s: metrics.window_s,
            warmed_up: run.warmed_up,
            cycles: metrics.cycles,
            cycles_per_s: metrics.cycles_per_s,
            mean_cycle_ms: metrics.mean_cycle_ms,
            hold_mean_ms: metrics.hold_mean_ms,
            wait_p50_ms: metrics.wait(0.5),
            wait_p99_ms: metrics.wait(0.99),
            wait_max_ms: metrics.wait(1.0),
            handoffs: metrics.handoffs_ms.len() as u64,
            handoff_p50_ms: metrics.handoff(0.5),
            handoff_p99_ms: metrics.handoff(0.99),
            first_command_p50_ms: metrics.first_reply(0.5),
            ping_p50_ms: metrics.ping_p50_ms,
            cmds_top_level_per_cycle: top,
            cmds_total_per_cycle: total,
            commands: metrics.commands.by_command.clone(),
            jain: metrics.jain,
            jain_rounds: metrics.jain_rounds,
            jain_window: metrics.jain_window,
            overtakes: metrics.overtakes,
            overtake_fraction: metrics.overtake_fraction(),
            overtakes_over_1ms: metrics.overtakes_over_1ms,
            overtake_over_1ms_fraction: metrics.overtake_over_1ms_fraction(),
            call_to_ticket_p50_ms: metrics.call_to_ticket(0.5),
            call_to_ticket_p99_ms: metrics.call_to_ticket(0.99),
            ticket_inversions: metrics.ticket_inversions,
            violations: metrics.violations,
            cs_completed: metrics.cs_completed,
            errors: run.errors,
            first_error: run.first_error.clone(),
            redis_cpu_s: run.redis_cpu_s,
            redis_cpu_us_per_cycle: run.redis_cpu_s * 1e6 / metrics.cycles.max(1) as f64,
            bench_cpu_s: run.bench_cpu_s,
            bench_cpu_us_per_cycle: run
                .bench_cpu_s
                .map(|cpu| cpu * 1e6 / metrics.cycles.max(1) as f64),
            rounds_cycles_per_s: Vec::new(),
            wait_cdf: metrics.wait_cdf(300),
        }
    }

    /// "C=64 H=1ms": the cell's place in the matrix, as the targets name it.
    pub fn tag(&self) -> String {
        format!("C={} H={}ms", self.contenders, self.hold_ms)
    }

    /// One-line summary for the console.
    pub fn summary(&self) -> String {
        format!(
            "{:<11} C={:<4} H={}ms  {:>8.0} cycles/s  wait p99 {}  cmds/cycle {:.1}/{:.1}  overtakes {:.1}%  Jain {:.3}  violations {}{}",
            self.implementation,
            self.contenders,
            self.hold_ms,
            self.cycles_per_s,
            fmt_ms(self.wait_p99_ms),
            self.cmds_top_level_per_cycle,
            self.cmds_total_per_cycle,
            self.overtake_fraction * 100.0,
            self.jain,
            self.violations,
            if self.errors > 0 {
                format!("  errors {}", self.errors)
            } else {
                String::new()
            }
        )
    }
}

/// Uncontended acquire+release of one implementation, as a JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct UncontendedRecord {
    /// Always "uncontended".
    pub kind: &'static str,
    /// Implementation label.
    pub implementation: &'static str,
    /// Acquire+release latency, microseconds.
    pub acquire_release_p50_us: f64,
    /// See `acquire_release_p50_us`.
    pub acquire_release_p99_us: f64,
    /// See `acquire_release_p50_us`.
    pub acquire_release_mean_us: f64,
    /// PING round trip (fred connection), microseconds.
    pub ping_p50_us: f64,
    /// acquire_release_p50_us / ping_p50_us.
    pub rtt_multiple: f64,
}

impl UncontendedRecord {
    /// Builds the record from the two measurements.
    pub fn new(imp: Implementation, latency: Latency, ping: Latency) -> UncontendedRecord {
        UncontendedRecord {
            kind: "uncontended",
            implementation: imp.label(),
            acquire_release_p50_us: latency.p50_us,
            acquire_release_p99_us: latency.p99_us,
            acquire_release_mean_us: latency.mean_us,
            ping_p50_us: ping.p50_us,
            rtt_multiple: latency.p50_us / ping.p50_us,
        }
    }
}

/// The PING round trip, as a JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct PingRecord {
    /// Always "ping".
    pub kind: &'static str,
    /// Round trip, microseconds.
    pub p50_us: f64,
    /// See `p50_us`.
    pub p99_us: f64,
    /// See `p50_us`.
    pub mean_us: f64,
}

/// One waiter probe (10,000 waiters on one lock, or 100,000 over 1,000
/// locks), as a JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct WaitersRecord {
    /// Always "waiters".
    pub kind: &'static str,
    /// Always "fairlock".
    pub implementation: &'static str,
    /// What the probe measured, as fields of this same line.
    #[serde(flatten)]
    pub cost: WaiterCost,
}

impl From<&WaiterCost> for WaitersRecord {
    fn from(cost: &WaiterCost) -> WaitersRecord {
        WaitersRecord {
            kind: "waiters",
            implementation: "fairlock",
            cost: cost.clone(),
        }
    }
}

/// Where and how the run was made.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    /// Always "run".
    pub kind: &'static str,
    /// "quick" or "full".
    pub mode: &'static str,
    /// The command that produced the results.
    pub command: String,
    /// UTC date of the run.
    pub date_utc: String,
    /// Logical CPUs.
    pub nproc: usize,
    /// CPU model from /proc/cpuinfo.
    pub cpu_model: String,
    /// Redis server version.
    pub redis_version: String,
    /// Simulated client processes per cell.
    pub clients: usize,
    /// Measured window per cell, s.
    pub window_s: f64,
    /// Rounds of each cell: one hot lock, across processes, 1,000 locks
    /// (`rounds.rs`).
    pub rounds: usize,
    /// Spinners that kept every CPU busy (`--busy-cpus`, a diagnostic; 0
    /// in a measuring run).
    pub busy_cpus: usize,
    /// Wall-clock time of the whole run, s.
    pub duration_s: f64,
}

/// Everything one run measured.
pub struct Results {
    /// Run metadata.
    pub info: RunInfo,
    /// PING round trip.
    pub ping: Option<Latency>,
    /// Uncontended latency per implementation.
    pub uncontended: Vec<UncontendedRecord>,
    /// Redis commands per operation, per implementation.
    pub costs: Vec<(String, crate::probes::OperationCosts)>,
    /// The waiter probes: 10,000 on one lock, then 100,000 over 1,000.
    pub waiters: Vec<WaitersRecord>,
    /// The matrix cells.
    pub cells: Vec<CellRecord>,
    /// One-hot-lock cells whose contenders ran in separate OS processes
    /// (`clients` of them).
    pub processes: Vec<CellRecord>,
    /// The many-locks cells.
    pub many_locks: Vec<CellRecord>,
}

impl Results {
    /// A run with nothing measured yet.
    pub fn new(info: RunInfo) -> Results {
        Results {
            info,
            ping: None,
            uncontended: Vec::new(),
            costs: Vec::new(),
            waiters: Vec::new(),
            cells: Vec::new(),
            processes: Vec::new(),
            many_locks: Vec::new(),
        }
    }

    /// The run as JSON lines, one object per measurement, in the order
    /// the README lists them.
    pub fn to_jsonl(&self) -> Result<String> {
        let mut jsonl = String::new();
        let mut push = |value: serde_json::Value| {
            jsonl.push_str(&value.to_string());
            jsonl.push('\n');
        };
        push(serde_json::to_value(&self.info)?);
        if let Some(ping) = self.ping {
            push(serde_json::to_value(PingRecord {
                kind: "ping",
                p50_us: ping.p50_us,
                p99_us: ping.p99_us,
                mean_us: ping.mean_us,
            })?);
        }
        for record in &self.uncontended {
            push(serde_json::to_value(record)?);
        }
        for (implementation, costs) in &self.costs {
            push(
                serde_json::json!({"kind": "operation_costs", "implementation": implementation, "costs": costs}),
            );
        }
        for waiters in &self.waiters {
            push(serde_json::to_value(waiters)?);
        }
        for cell in self
            .cells
            .iter()
            .chain(&self.processes)
            .chain(&self.many_locks)
        {
            push(serde_json::to_value(cell)?);
        }
        Ok(jsonl)
    }
}
