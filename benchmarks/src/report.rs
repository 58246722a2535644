//! The results: one JSON line per measurement (`results.jsonl`), a markdown
//! report (`results.md`) with the tables and the targets (measured value,
//! pass or miss, and by how much), and the charts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::cell::CellRun;
use plotters::prelude::SeriesLabelPosition;

use crate::charts::{line_chart, Axis, Chart, Series};
use crate::impls::{Implementation, Result};
use crate::probes::{Latency, WaiterCost};
use crate::stats::CellMetrics;

/// One cell of the matrix, or of the many-locks run, as a JSON line.
#[derive(Debug, Clone, Serialize)]
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
            wait_cdf: metrics.wait_cdf(300),
        }
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

/// 10,000 waiters on one lock, as a JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct WaitersRecord {
    /// Always "waiters".
    pub kind: &'static str,
    /// Always "fairlock".
    pub implementation: &'static str,
    /// Waiters spawned.
    pub waiters: usize,
    /// Waiters queued in Redis when measured.
    pub queued: u64,
    /// Client RSS growth per waiter, bytes.
    pub client_bytes_per_waiter: f64,
    /// Client live heap growth per waiter, bytes.
    pub client_heap_per_waiter: f64,
    /// Redis used_memory growth per waiter, bytes.
    pub redis_bytes_per_waiter: f64,
    /// Redis connections held by the process.
    pub connections: usize,
    /// Of which subscribed to pub/sub.
    pub subscriber_connections: usize,
    /// Time until all were queued, s.
    pub enqueue_s: f64,
    /// Size of the future `LockClient::lock` returns, bytes.
    pub lock_future_bytes: usize,
}

impl From<&WaiterCost> for WaitersRecord {
    fn from(cost: &WaiterCost) -> WaitersRecord {
        WaitersRecord {
            kind: "waiters",
            implementation: "fairlock",
            waiters: cost.waiters,
            queued: cost.queued,
            client_bytes_per_waiter: cost.client_bytes_per_waiter,
            client_heap_per_waiter: cost.client_heap_per_waiter,
            redis_bytes_per_waiter: cost.redis_bytes_per_waiter,
            connections: cost.connections,
            subscriber_connections: cost.subscriber_connections,
            enqueue_s: cost.enqueue_s,
            lock_future_bytes: cost.lock_future_bytes,
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
    /// The 10,000-waiter probe.
    pub waiters: Option<WaitersRecord>,
    /// The matrix cells.
    pub cells: Vec<CellRecord>,
    /// One-hot-lock cells whose contenders ran in separate OS processes
    /// (`clients` of them).
    pub processes: Vec<CellRecord>,
    /// The many-locks cells.
    pub many_locks: Vec<CellRecord>,
}

/// Writes results.jsonl, results.md and the charts into `dir`; returns
/// the markdown.
pub fn write_all(results: &Results, dir: &Path) -> Result<String> {
    std::fs::create_dir_all(dir)?;
    let mut jsonl = String::new();
    let mut push = |value: serde_json::Value| {
        jsonl.push_str(&value.to_string());
        jsonl.push('\n');
    };
    push(serde_json::to_value(&results.info)?);
    if let Some(ping) = results.ping {
        push(serde_json::to_value(PingRecord {
            kind: "ping",
            p50_us: ping.p50_us,
            p99_us: ping.p99_us,
            mean_us: ping.mean_us,
        })?);
    }
    for record in &results.uncontended {
        push(serde_json::to_value(record)?);
    }
    for (implementation, costs) in &results.costs {
        push(
            serde_json::json!({"kind": "operation_costs", "implementation": implementation, "costs": costs}),
        );
    }
    if let Some(waiters) = &results.waiters {
        push(serde_json::to_value(waiters)?);
    }
    for cell in results
        .cells
        .iter()
        .chain(&results.processes)
        .chain(&results.many_locks)
    {
        push(serde_json::to_value(cell)?);
    }
    std::fs::write(dir.join("results.jsonl"), jsonl)?;

    let charts = write_charts(results, dir)?;
    let markdown = markdown(results, &charts);
    std::fs::write(dir.join("results.md"), &markdown)?;
    Ok(markdown)
}

fn hold_tag(hold_ms: f64) -> String {
    format!("h{}ms", hold_ms.round() as u64)
}

fn write_charts(results: &Results, dir: &Path) -> Result<Vec<(String, String)>> {
    let mut written = Vec::new();
    let cdf_cells: Vec<&CellRecord> = results
        .cells
        .iter()
        .filter(|c| c.contenders == 64 && (c.hold_ms - 1.0).abs() < 1e-9)
        .collect();
    if !cdf_cells.is_empty() {
        let series: Vec<Series> = cdf_cells
            .iter()
            .map(|c| Series {
                label: c.implementation.to_owned(),
                points: c.wait_cdf.clone(),
            })
            .collect();
        let file = "wait_cdf_c64_h1ms.svg";
        line_chart(
            &dir.join(file),
            &Chart {
                title: "Wait time CDF, one hot lock, C=64, H=1 ms",
                x_desc: "wait (ms, log scale)",
                y_desc: "fraction of acquisitions",
                x_axis: Axis::Log,
                y_axis: Axis::Linear,
                markers: false,
                legend: SeriesLabelPosition::LowerRight,
            },
            &series,
        )?;
        written.push(("Wait-time CDF at C=64, H=1 ms".to_owned(), file.to_owned()));
    }

    let mut holds: Vec<f64> = results.cells.iter().map(|c| c.hold_ms).collect();
    holds.sort_by(f64::total_cmp);
    holds.dedup();
    for hold in holds {
        let cells: Vec<&CellRecord> = results.cells.iter().filter(|c| c.hold_ms == hold).collect();
        let mut cs: Vec<usize> = cells.iter().map(|c| c.contenders).collect();
        cs.sort_unstable();
        cs.dedup();
        if cs.len() < 2 {
            continue;
        }
        let per_impl = |value: fn(&CellRecord) -> f64| -> Vec<Series> {
            Implementation::ALL
                .iter()
                .map(|imp| Series {
                    label: imp.label().to_owned(),
                    points: cells
                        .iter()
                        .filter(|c| c.implementation == imp.label())
                        .map(|c| (c.contenders as f64, value(c)))
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect()
        };
        let tag = hold_tag(hold);
        let file = format!("throughput_{tag}.svg");
        line_chart(
            &dir.join(&file),
            &Chart {
                title: &format!("Throughput vs contenders, one hot lock, H={hold} ms"),
                x_desc: "contenders C (log scale)",
                y_desc: "cycles/s",
                x_axis: Axis::Log,
                y_axis: Axis::Linear,
                markers: true,
                legend: SeriesLabelPosition::LowerLeft,
            },
            &per_impl(|c| c.cycles_per_s),
        )?;
        written.push((format!("Throughput vs C, H={hold} ms"), file));
        let file = format!("commands_per_cycle_{tag}.svg");
        line_chart(
            &dir.join(&file),
            &Chart {
                title: &format!("Redis commands sent per cycle (lock part), H={hold} ms"),
                x_desc: "contenders C (log scale)",
                y_desc: "top-level commands per cycle (log scale)",
                x_axis: Axis::Log,
                y_axis: Axis::Log,
                markers: true,
                legend: SeriesLabelPosition::UpperLeft,
            },
            &per_impl(|c| c.cmds_top_level_per_cycle),
        )?;
        written.push((format!("Redis commands per cycle vs C, H={hold} ms"), file));
    }
    Ok(written)
}

fn fmt_ms(value: Option<f64>) -> String {
    match value {
        None => "-".to_owned(),
        Some(v) if v >= 1000.0 => format!("{:.2} s", v / 1000.0),
        Some(v) if v >= 10.0 => format!("{v:.1} ms"),
        Some(v) if v >= 1.0 => format!("{v:.2} ms"),
        Some(v) => format!("{:.0} µs", v * 1000.0),
    }
}

fn markdown(results: &Results, charts: &[(String, String)]) -> String {
    let info = &results.info;
    let mut md = String::new();
    let _ = writeln!(md, "# fairlock benchmark results ({} mode)\n", info.mode);
    let _ = writeln!(
        md,
        "`{}` on {} UTC: {} x {}, redis-server {}, {} simulated client processes per cell, {:.1} s window per cell, run took {:.0} s.\n",
        info.command,
        info.date_utc,
        info.nproc,
        info.cpu_model,
        info.redis_version,
        info.clients,
        info.window_s,
        info.duration_s
    );
    let _ = writeln!(
        md,
        "Commands per cycle count the lock part only (the critical section's GET and SET and the harness's own commands are removed). \
         *sent* = commands the clients sent (script calls and plain commands: round trips); *run* = everything Redis executed, \
         including the commands inside Lua scripts, which Redis 7 counts in `INFO commandstats` as well.\n"
    );

    if !results.cells.is_empty() {
        let _ = writeln!(md, "## One hot lock\n");
        hot_lock_table(&mut md, &results.cells);
    }

    let _ = writeln!(md, "\n## Uncontended acquire + release\n");
    if let Some(ping) = results.ping {
        let _ = writeln!(
            md,
            "PING round trip (a fred connection set up as fairlock's, interleaved with fairlock's calls): p50 {:.0} µs, p99 {:.0} µs. \
             Each row's ratio uses the PINGs interleaved with its own calls.\n",
            ping.p50_us, ping.p99_us
        );
    }
    let _ = writeln!(
        md,
        "| implementation | p50 | p99 | mean | PING p50 | p50 in PING RTTs |"
    );
    let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|");
    for u in &results.uncontended {
        let _ = writeln!(
            md,
            "| {} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.2} |",
            u.implementation,
            u.acquire_release_p50_us,
            u.acquire_release_p99_us,
            u.acquire_release_mean_us,
            u.ping_p50_us,
            u.rtt_multiple
        );
    }

    let _ = writeln!(
        md,
        "\n## Redis commands per operation\n\nCommands Redis executed, counting those inside scripts and not the script call itself (`INFO commandstats`), median of 21 repetitions. The contended cycle is a second caller joining the queue while the lock is held, then the release that hands it the lock.\n"
    );
    let _ = writeln!(
        md,
        "| implementation | uncontended acquire | uncontended release | contended cycle |"
    );
    let _ = writeln!(md, "|---|--:|--:|--:|");
    for (implementation, c) in &results.costs {
        let cycle = c
            .contended_cycle
            .map_or("polls".to_owned(), |n| n.to_string());
        let _ = writeln!(
            md,
            "| {implementation} | {} | {} | {cycle} |",
            c.acquire, c.release
        );
    }

    if let Some(w) = &results.waiters {
        let _ = writeln!(
            md,
            "\n## {} waiters on one lock, one process (fairlock)\n",
            w.waiters
        );
        let _ = writeln!(
            md,
            "| queued | client heap per waiter | client RSS per waiter | Redis used_memory per waiter | connections | of which pub/sub | time to enqueue all | `lock()` future size |"
        );
        let _ = writeln!(md, "|--:|--:|--:|--:|--:|--:|--:|--:|");
        let _ = writeln!(
            md,
            "| {} | {:.0} B | {:.0} B | {:.0} B | {} | {} | {:.2} s | {} B |",
            w.queued,
            w.client_heap_per_waiter,
            w.client_bytes_per_waiter,
            w.redis_bytes_per_waiter,
            w.connections,
            w.subscriber_connections,
            w.enqueue_s,
            w.lock_future_bytes
        );
    }

    if let Some(first) = results.processes.first() {
        let _ = writeln!(
            md,
            "\n## One hot lock, contenders in {} OS processes\n",
            first.clients
        );
        let _ = writeln!(
            md,
            "The same cell as above, but contender `i` runs in OS process `i % {}` (this binary started again as a worker), \
             not in a simulated client of one process: nothing is shared between them but Redis and the machine's clock. \
             Every worker maps the parent's wall-clock start onto its own monotonic clock, so call times of different \
             processes compare directly (to a few µs).\n",
            first.clients
        );
        hot_lock_table(&mut md, &results.processes);
    }

    if !results.many_locks.is_empty() {
        let first = &results.many_locks[0];
        let _ = writeln!(
            md,
            "\n## {} distinct locks under load ({} contenders, H={} ms)\n",
            first.locks, first.contenders, first.hold_ms
        );
        let _ = writeln!(
            md,
            "| implementation | total cycles/s | Redis CPU | Redis CPU per cycle | cmds/cycle sent | cmds/cycle run | wait p99 | violations | errors |"
        );
        let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|--:|--:|");
        for c in &results.many_locks {
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:.0}% | {:.1} µs | {:.2} | {:.2} | {} | {} | {} |",
                c.implementation,
                c.cycles_per_s,
                100.0 * c.redis_cpu_s / c.window_s.max(1e-9),
                c.redis_cpu_us_per_cycle,
                c.cmds_top_level_per_cycle,
                c.cmds_total_per_cycle,
                fmt_ms(c.wait_p99_ms),
                c.violations,
                c.errors
            );
        }
    }

    let _ = writeln!(md, "\n## Targets (fairlock)\n");
    let _ = writeln!(md, "| target | measured | result |");
    let _ = writeln!(md, "|---|---|---|");
    for t in targets(results) {
        let _ = writeln!(md, "| {} | {} | {} |", t.target, t.measured, t.verdict);
    }

    if !charts.is_empty() {
        let _ = writeln!(md, "\n## Charts\n");
        for (title, file) in charts {
            let _ = writeln!(md, "![{title}]({file})\n");
        }
    }
    md
}

/// One target line: what was asked, what was measured, pass/miss by how much.
pub struct TargetRow {
    /// The target.
    pub target: String,
    /// The measured value(s).
    pub measured: String,
    /// "pass (..)", "miss (..)" or "not measured".
    pub verdict: String,
}

/// "pass (23% under)" for a value that must be at most `limit`.
fn at_most(value: f64, limit: f64) -> String {
    if !value.is_finite() {
        return "not measured".to_owned();
    }
    let off = if limit == 0.0 {
        value
    } else {
        (value / limit - 1.0) * 100.0
    };
    let unit = if limit == 0.0 { "" } else { "%" };
    if value <= limit {
        format!("pass ({:.0}{unit} under)", -off)
    } else {
        format!("**miss** ({off:.0}{unit} over)")
    }
}

/// "pass (5% above)" for a value that must be at least `limit`.
fn at_least(value: f64, limit: f64) -> String {
    if !value.is_finite() {
        return "not measured".to_owned();
    }
    let off = (value / limit - 1.0) * 100.0;
    if value >= limit {
        format!("pass ({off:.0}% above)")
    } else {
        format!("**miss** ({:.0}% below)", -off)
    }
}

fn row(target: &str, measured: String, verdict: String) -> TargetRow {
    TargetRow {
        target: target.to_owned(),
        measured,
        verdict,
    }
}

/// The one-hot-lock table: a row per cell, sorted by hold, then C.
/// A note follows for cells where some contender never got the lock
/// during warm-up.
fn hot_lock_table(md: &mut String, records: &[CellRecord]) {
    let _ = writeln!(
        md,
        "| implementation | C | H | hold measured | cycles/s | wait p50 | wait p99 | wait max | handoff p50 | handoff p99 | PING p50 in cell | cmds/cycle sent | cmds/cycle run | Jain | overtakes | overtakes > 1 ms | call → ticket p50 / p99 | violations | errors |"
    );
    let _ = writeln!(
        md,
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    let mut cells: Vec<&CellRecord> = records.iter().collect();
    cells.sort_by(|a, b| {
        (a.hold_ms, a.contenders)
            .partial_cmp(&(b.hold_ms, b.contenders))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    for c in &cells {
        let _ = writeln!(
            md,
            "| {} | {} | {} ms | {:.2} ms | {:.0} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.3} | {:.1}% | {:.2}% | {} / {} | {} | {} |",
            c.implementation,
            c.contenders,
            c.hold_ms,
            c.hold_mean_ms,
            c.cycles_per_s,
            fmt_ms(c.wait_p50_ms),
            fmt_ms(c.wait_p99_ms),
            fmt_ms(c.wait_max_ms),
            fmt_ms(c.handoff_p50_ms),
            fmt_ms(c.handoff_p99_ms),
            fmt_ms(c.ping_p50_ms),
            c.cmds_top_level_per_cycle,
            c.cmds_total_per_cycle,
            c.jain,
            c.overtake_fraction * 100.0,
            c.overtake_over_1ms_fraction * 100.0,
            fmt_ms(c.call_to_ticket_p50_ms),
            fmt_ms(c.call_to_ticket_p99_ms),
            c.violations,
            c.errors
        );
    }
    let cold: Vec<String> = cells
        .iter()
        .filter(|c| !c.warmed_up)
        .map(|c| format!("{} C={} H={}ms", c.implementation, c.contenders, c.hold_ms))
        .collect();
    if !cold.is_empty() {
        let _ = writeln!(
            md,
            "\nSome contenders never got the lock during warm-up (the window started at the warm-up limit): {}.",
            cold.join(", ")
        );
    }
}

fn cell_tag(c: &CellRecord) -> String {
    format!("C={} H={}ms", c.contenders, c.hold_ms)
}

/// fairlock's cell with the most contenders (then the longest hold).
fn largest_fairlock_cell(records: &[CellRecord]) -> Option<&CellRecord> {
    records
        .iter()
        .filter(|c| c.implementation == "fairlock")
        .max_by(|a, b| {
            (a.contenders, a.hold_ms)
                .partial_cmp(&(b.contenders, b.hold_ms))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
}

/// Evaluates the fairlock targets against what was measured.
pub fn targets(results: &Results) -> Vec<TargetRow> {
    let mut rows = Vec::new();
    let fl: Vec<&CellRecord> = results
        .cells
        .iter()
        .filter(|c| c.implementation == "fairlock")
        .collect();
    let others = |c: &CellRecord, pred: &dyn Fn(&CellRecord) -> bool| -> Option<&CellRecord> {
        results
            .cells
            .iter()
            .filter(|o| {
                o.implementation != "fairlock"
                    && o.contenders == c.contenders
                    && o.hold_ms == c.hold_ms
                    && pred(o)
            })
            .max_by(|a, b| a.cycles_per_s.total_cmp(&b.cycles_per_s))
    };
    let not_measured = || "not measured".to_owned();

    // Fairness at every C >= 8.
    let contended: Vec<&&CellRecord> = fl.iter().filter(|c| c.contenders >= 8).collect();
    match contended
        .iter()
        .max_by(|a, b| a.overtake_fraction.total_cmp(&b.overtake_fraction))
    {
        Some(worst) => {
            let total: u64 = contended.iter().map(|c| c.overtakes).sum();
            let inversions: u64 = contended.iter().filter_map(|c| c.ticket_inversions).sum();
            rows.push(row(
                "0 overtakes at every C ≥ 8",
                format!(
                    "{total} in total; worst {} ({:.2}%) at {}. By fairlock's own queue tickets, \
                     {inversions} grants out of order: the overtakes above compare client-side \
                     start times of tasks on different connections, which can reach Redis in \
                     the other order",
                    worst.overtakes,
                    worst.overtake_fraction * 100.0,
                    cell_tag(worst)
                ),
                if total == 0 {
                    "pass".to_owned()
                } else {
                    format!("**miss** ({total} overtakes)")
                },
            ))
        }
        None => rows.push(row(
            "0 overtakes at every C ≥ 8",
            not_measured(),
            not_measured(),
        )),
    }
    match contended.iter().min_by(|a, b| a.jain.total_cmp(&b.jain)) {
        Some(worst) => rows.push(row(
            "Jain ≥ 0.99 at every C ≥ 8",
            format!("lowest {:.4} at {}", worst.jain, cell_tag(worst)),
            at_least(worst.jain, 0.99),
        )),
        None => rows.push(row(
            "Jain ≥ 0.99 at every C ≥ 8",
            not_measured(),
            not_measured(),
        )),
    }

    // Commands per cycle.
    match fl.iter().max_by(|a, b| {
        a.cmds_top_level_per_cycle
            .total_cmp(&b.cmds_top_level_per_cycle)
    }) {
        Some(worst) => {
            let lo = fl
                .iter()
                .map(|c| c.cmds_top_level_per_cycle)
                .fold(f64::INFINITY, f64::min);
            let by_c: Vec<String> = fl
                .iter()
                .map(|c| {
                    format!(
                        "{}: {:.2}/{:.2}",
                        cell_tag(c),
                        c.cmds_top_level_per_cycle,
                        c.cmds_total_per_cycle
                    )
                })
                .collect();
            rows.push(row(
                "lock commands per cycle ≤ 4, flat from C=1 to 1024",
                format!(
                    "sent: highest {:.2} at {}, lowest {lo:.2} (run incl. script internals: highest {:.2}); sent/run per cell: {}",
                    worst.cmds_top_level_per_cycle,
                    cell_tag(worst),
                    fl.iter().map(|c| c.cmds_total_per_cycle).fold(0.0, f64::max),
                    by_c.join(", ")
                ),
                format!(
                    "sent {}; run {}",
                    at_most(worst.cmds_top_level_per_cycle, 4.0),
                    at_most(fl.iter().map(|c| c.cmds_total_per_cycle).fold(0.0, f64::max), 4.0)
                ),
            ));
        }
        None => rows.push(row(
            "lock commands per cycle ≤ 4",
            not_measured(),
            not_measured(),
        )),
    }

    // Throughput at H=1ms vs the best other.
    let mut ratios = Vec::new();
    for c in fl.iter().filter(|c| (c.hold_ms - 1.0).abs() < 1e-9) {
        if let Some(best) = others(c, &|_| true) {
            ratios.push((c.cycles_per_s / best.cycles_per_s, *c, best));
        }
    }
    match ratios.iter().min_by(|a, b| a.0.total_cmp(&b.0)) {
        Some((worst, c, best)) => {
            let all: Vec<String> = ratios
                .iter()
                .map(|(r, c, b)| format!("C={}: {r:.2}× {}", c.contenders, b.implementation))
                .collect();
            rows.push(row(
                "throughput at H=1ms ≥ 0.95× the best other at every C",
                format!(
                    "lowest {worst:.2}× ({:.0} vs {} {:.0} cycles/s at C={}); {}",
                    c.cycles_per_s,
                    best.implementation,
                    best.cycles_per_s,
                    c.contenders,
                    all.join(", ")
                ),
                at_least(*worst, 0.95),
            ));
        }
        None => rows.push(row(
            "throughput at H=1ms ≥ 0.95× best other",
            not_measured(),
            not_measured(),
        )),
    }

    // H=0, C=64 vs rslock.
    match fl.iter().find(|c| c.contenders == 64 && c.hold_ms == 0.0) {
        Some(c) => match others(c, &|o| o.implementation.starts_with("rslock")) {
            Some(r) => {
                let ratio = c.cycles_per_s / r.cycles_per_s;
                rows.push(row(
                    "throughput at H=0, C=64 ≥ 1.0× rslock",
                    format!(
                        "{ratio:.2}× ({:.0} vs {} {:.0} cycles/s, the faster rslock variant)",
                        c.cycles_per_s, r.implementation, r.cycles_per_s
                    ),
                    at_least(ratio, 1.0),
                ));
            }
            None => rows.push(row(
                "throughput at H=0, C=64 ≥ 1.0× rslock",
                not_measured(),
                not_measured(),
            )),
        },
        None => rows.push(row(
            "throughput at H=0, C=64 ≥ 1.0× rslock",
            not_measured(),
            not_measured(),
        )),
    }

    // Wait p99 at C=256, H=1ms.
    match fl
        .iter()
        .find(|c| c.contenders == 256 && (c.hold_ms - 1.0).abs() < 1e-9)
    {
        Some(c) => {
            let limit = 1.2 * c.contenders as f64 * c.mean_cycle_ms;
            let p99 = c.wait_p99_ms.unwrap_or(f64::NAN);
            rows.push(row(
                "wait p99 at C=256, H=1ms ≤ 1.2 × C × mean cycle time",
                format!(
                    "{} vs limit {} (mean cycle {:.3} ms)",
                    fmt_ms(Some(p99)),
                    fmt_ms(Some(limit)),
                    c.mean_cycle_ms
                ),
                at_most(p99, limit),
            ));
        }
        None => rows.push(row(
            "wait p99 at C=256, H=1ms",
            not_measured(),
            not_measured(),
        )),
    }

    // Handoff vs PING.
    let handoff_cells: Vec<&&CellRecord> =
        fl.iter().filter(|c| c.handoff_p50_ms.is_some()).collect();
    match (
        results.ping,
        handoff_cells.iter().max_by(|a, b| {
            a.handoff_p50_ms
                .unwrap_or(0.0)
                .total_cmp(&b.handoff_p50_ms.unwrap_or(0.0))
        }),
    ) {
        (Some(ping), Some(worst)) => {
            let limit = 1.5 * ping.p50_us / 1e3;
            let headline = fl
                .iter()
                .find(|c| c.contenders == 64 && (c.hold_ms - 1.0).abs() < 1e-9);
            let headline_p50 = headline.and_then(|c| c.handoff_p50_ms);
            let in_cell: Vec<String> = handoff_cells
                .iter()
                .filter_map(|c| {
                    Some(format!(
                        "{}: {:.1}×",
                        cell_tag(c),
                        c.handoff_p50_ms? / c.ping_p50_ms?
                    ))
                })
                .collect();
            let worst_p50 = worst.handoff_p50_ms.unwrap_or(f64::NAN);
            rows.push(row(
                "handoff p50 ≤ 1.5× PING RTT",
                format!(
                    "C=64 H=1ms: {}; worst {} at {}; limit {} (1.5× the idle PING p50 of {:.0} µs). \
                     Against the PING p50 measured during the same cell: {}",
                    fmt_ms(headline_p50),
                    fmt_ms(Some(worst_p50)),
                    cell_tag(worst),
                    fmt_ms(Some(limit)),
                    ping.p50_us,
                    in_cell.join(", ")
                ),
                format!(
                    "C=64 H=1ms {}; worst {}",
                    headline_p50.map_or_else(not_measured, |h| at_most(h, limit)),
                    at_most(worst_p50, limit)
                ),
            ));
        }
        _ => rows.push(row(
            "handoff p50 ≤ 1.5× PING RTT",
            not_measured(),
            not_measured(),
        )),
    }

    // Uncontended.
    match results
        .uncontended
        .iter()
        .find(|u| u.implementation == "fairlock")
    {
        Some(u) => rows.push(row(
            "uncontended acquire+release ≤ 2.5 RTT",
            format!(
                "{:.2} RTT ({:.0} µs vs PING {:.0} µs, p50)",
                u.rtt_multiple, u.acquire_release_p50_us, u.ping_p50_us
            ),
            at_most(u.rtt_multiple, 2.5),
        )),
        None => rows.push(row(
            "uncontended acquire+release ≤ 2.5 RTT",
            not_measured(),
            not_measured(),
        )),
    }

    // 10,000 waiters.
    match &results.waiters {
        Some(w) => {
            rows.push(row(
                &format!("{} waiters: client memory ≤ 2 KiB per waiter", w.waiters),
                format!(
                    "{:.0} B per waiter live heap; {:.0} B RSS growth",
                    w.client_heap_per_waiter, w.client_bytes_per_waiter
                ),
                at_most(
                    w.client_bytes_per_waiter.max(w.client_heap_per_waiter),
                    2048.0,
                ),
            ));
            rows.push(row(
                &format!("{} waiters: Redis memory ≤ 256 B per waiter", w.waiters),
                format!(
                    "{:.0} B per waiter (used_memory growth)",
                    w.redis_bytes_per_waiter
                ),
                at_most(w.redis_bytes_per_waiter, 256.0),
            ));
            rows.push(row(
                &format!("{} waiters over a single subscriber connection", w.waiters),
                format!(
                    "{} connection(s), {} subscribed to pub/sub",
                    w.connections, w.subscriber_connections
                ),
                if w.subscriber_connections == 1 {
                    "pass".to_owned()
                } else {
                    format!(
                        "**miss** ({} subscriber connections)",
                        w.subscriber_connections
                    )
                },
            ));
        }
        None => rows.push(row("10,000 waiters", not_measured(), not_measured())),
    }

    // FIFO as callers see it: overtakes of an earlier caller by more than
    // 1 ms, at the largest C, in one process and across OS processes.
    for (records, place) in [
        (
            &results.cells[..],
            format!("{} simulated clients in one process", results.info.clients),
        ),
        (
            &results.processes[..],
            format!(
                "{} OS processes",
                results.processes.first().map_or(0, |c| c.clients)
            ),
        ),
    ] {
        let target =
            format!("overtakes of an earlier caller by > 1 ms ≤ 1% at the largest C, {place}");
        match largest_fairlock_cell(records) {
            Some(c) => rows.push(row(
                &target,
                format!(
                    "{:.2}% ({} of {} acquisitions) at {}; call → ticket p50 {} p99 {}; {} grants out of ticket order",
                    c.overtake_over_1ms_fraction * 100.0,
                    c.overtakes_over_1ms,
                    c.cycles,
                    cell_tag(c),
                    fmt_ms(c.call_to_ticket_p50_ms),
                    fmt_ms(c.call_to_ticket_p99_ms),
                    c.ticket_inversions.map_or("-".to_owned(), |n| n.to_string()),
                ),
                at_most(c.overtake_over_1ms_fraction, 0.01),
            )),
            None => rows.push(row(&target, not_measured(), not_measured())),
        }
    }

    // Violations, every implementation.
    let violations: Vec<String> = results
        .cells
        .iter()
        .chain(&results.processes)
        .chain(&results.many_locks)
        .filter(|c| c.violations > 0)
        .map(|c| format!("{} {}: {}", c.implementation, cell_tag(c), c.violations))
        .collect();
    rows.push(row(
        "violations = 0 (every implementation, every cell)",
        if violations.is_empty() {
            "0 everywhere".to_owned()
        } else {
            violations.join(", ")
        },
        if violations.is_empty() {
            "pass".to_owned()
        } else {
            "**miss**".to_owned()
        },
    ));
    rows
}
