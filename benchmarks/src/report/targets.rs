//! fairlock's targets (from issue 11), evaluated against what the run
//! measured: for each, the measured value, pass or miss, and by how much.
//! Reported, never asserted; a target whose cells the run did not measure
//! says "not measured".

use super::format::fmt_ms;
use super::records::{CellRecord, Results};

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
pub fn evaluate(results: &Results) -> Vec<TargetRow> {
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
                    worst.tag()
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
            format!("lowest {:.4} at {}", worst.jain, worst.tag()),
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
                        c.tag(),
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
                    worst.tag(),
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
                        c.tag(),
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
                    worst.tag(),
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
    match results.waiters.iter().find(|w| w.locks == 1) {
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
                    c.tag(),
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
        .map(|c| format!("{} {}: {}", c.implementation, c.tag(), c.violations))
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
