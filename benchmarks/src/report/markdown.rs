//! results.md: one markdown table per kind of measurement, the targets
//! table and links to the charts. Only formatting lives here; the targets
//! are evaluated in `targets.rs`.

use std::fmt::Write as _;

use super::format::{fmt_ms, fmt_rounds};
use super::records::{CellRecord, Results, WaitersRecord};
use super::targets::evaluate;

/// results.md: the run's description, a table per measurement, the
/// targets and the charts (`charts`: (title, file name) pairs).
pub fn document(results: &Results, charts: &[(String, String)]) -> String {
    let info = &results.info;
    let mut md = String::new();
    let _ = writeln!(md, "# fairlock benchmark results ({} mode)\n", info.mode);
    let _ = writeln!(
        md,
        "`{}` on {} UTC: {} x {}, redis-server {}, {} simulated client processes per cell, {:.1} s window per cell{}, run took {:.0} s.\n",
        info.command,
        info.date_utc,
        info.nproc,
        info.cpu_model,
        info.redis_version,
        info.clients,
        info.window_s,
        if info.rounds > 1 {
            format!(" (each cell in {} rounds)", info.rounds)
        } else {
            String::new()
        },
        info.duration_s
    );
    if info.busy_cpus > 0 {
        let _ = writeln!(
            md,
            "**A diagnostic run, not a measure (`--busy-cpus`):** {} spinners at the lowest priority (`SCHED_IDLE`) kept every CPU \
             busy, so no CPU went idle between two messages. Its ratios tell how much of a gap is the machine waking idle CPUs; \
             the targets below are judged on runs without it.\n",
            info.busy_cpus
        );
    }
    let _ = writeln!(
        md,
        "Commands per cycle count the lock part only (the critical section's GET and SET and the harness's own commands are removed). \
         *sent* = commands the clients sent (script calls and plain commands: round trips); *run* = everything Redis executed, \
         including the commands inside Lua scripts, which Redis 7 counts in `INFO commandstats` as well.\n"
    );

    if !results.cells.is_empty() {
        let _ = writeln!(md, "## One hot lock\n");
        hot_lock_table(&mut md, &results.cells);
        rounds_table(&mut md, &results.cells, info.rounds);
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

    waiters_table(&mut md, &results.waiters, results.info.mode);

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
        rounds_table(&mut md, &results.processes, results.info.rounds);
    }

    many_locks_table(&mut md, &results.many_locks, results.info.mode);
    rounds_table(&mut md, &results.many_locks, results.info.rounds);

    let _ = writeln!(md, "\n## Targets (fairlock)\n");
    let _ = writeln!(md, "| target | measured | result |");
    let _ = writeln!(md, "|---|---|---|");
    for t in evaluate(results) {
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

/// The waiter probes, a row each: what waiting costs the client process
/// and Redis.
fn waiters_table(md: &mut String, records: &[WaitersRecord], mode: &str) {
    if records.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## Waiters in one process (fairlock)\n");
    let _ = writeln!(
        md,
        "One `LockClient`; a task of it holds each lock while the waiters, tasks of the same client, queue behind. \
         Per waiter: growth of the client's live heap and RSS, and of Redis's `used_memory`, from the held locks \
         to every waiter queued.{}\n",
        if mode == "quick" {
            " Quick mode shrinks the second probe (the full run: 100,000 waiters over 1,000 locks)."
        } else {
            ""
        }
    );
    let _ = writeln!(
        md,
        "| waiters | locks | queued | client heap per waiter | client RSS per waiter | Redis used_memory per waiter | connections | of which pub/sub | time to enqueue all | `lock()` future size |"
    );
    let _ = writeln!(md, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for w in records.iter().map(|w| &w.cost) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} B | {:.0} B | {:.0} B | {} | {} | {:.2} s | {} B |",
            w.waiters,
            w.locks,
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
}

/// The many-locks table: total throughput and what a cycle costs, one
/// row per implementation.
fn many_locks_table(md: &mut String, records: &[CellRecord], mode: &str) {
    let Some(first) = records.first() else {
        return;
    };
    let per_lock = first.contenders / first.locks.max(1);
    let _ = writeln!(
        md,
        "\n## {} distinct locks, {per_lock} contenders each, one process ({} contenders, H={} ms)\n",
        first.locks, first.contenders, first.hold_ms
    );
    if mode == "quick" {
        let _ = writeln!(
            md,
            "Quick mode: {per_lock} contenders per lock, not the 64 of the full run.\n"
        );
    }
    let _ = writeln!(
        md,
        "Contender `j` of lock `l` runs on simulated client `(l + j) % {}`. Redis CPU and the benchmark \
         process's CPU (lock clients and harness, same machine) are over the {:.1} s window.\n",
        first.clients, first.window_s
    );
    let _ = writeln!(
        md,
        "| implementation | total cycles/s | hold measured | wait p99 | Redis CPU | Redis CPU per cycle | benchmark process CPU per cycle | cmds/cycle sent | cmds/cycle run | violations | errors |"
    );
    let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for c in records {
        let _ = writeln!(
            md,
            "| {} | {:.0} | {} | {} | {:.0}% | {} | {} | {} | {} | {} | {} |",
            c.implementation,
            c.cycles_per_s,
            per_cycle(c, Some(c.hold_mean_ms), |ms| format!("{ms:.2} ms")),
            fmt_ms(c.wait_p99_ms),
            100.0 * c.redis_cpu_s / c.window_s.max(1e-9),
            per_cycle(c, Some(c.redis_cpu_us_per_cycle), |us| format!(
                "{us:.1} µs"
            )),
            per_cycle(c, c.bench_cpu_us_per_cycle, |us| format!("{us:.1} µs")),
            per_cycle(c, Some(c.cmds_top_level_per_cycle), |n| format!("{n:.2}")),
            per_cycle(c, Some(c.cmds_total_per_cycle), |n| format!("{n:.2}")),
            c.violations,
            c.errors
        );
    }
    cold_cells_note(md, records);
}

/// The one-hot-lock table: a row per cell, sorted by hold, then C.
/// A note follows for cells where some contender never got the lock
/// during warm-up.
fn hot_lock_table(md: &mut String, records: &[CellRecord]) {
    let _ = writeln!(
        md,
        "| implementation | C | H | hold measured | first command p50 | cycles/s | wait p50 | wait p99 | wait max | handoff p50 | handoff p99 | PING p50 in cell | cmds/cycle sent | cmds/cycle run | Jain | overtakes | overtakes > 1 ms | call → ticket p50 / p99 | violations | errors |"
    );
    let _ = writeln!(
        md,
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
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
            "| {} | {} | {} ms | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.1}% | {:.2}% | {} / {} | {} | {} |",
            c.implementation,
            c.contenders,
            c.hold_ms,
            per_cycle(c, Some(c.hold_mean_ms), |ms| format!("{ms:.2} ms")),
            fmt_ms(c.first_command_p50_ms),
            c.cycles_per_s,
            fmt_ms(c.wait_p50_ms),
            fmt_ms(c.wait_p99_ms),
            fmt_ms(c.wait_max_ms),
            fmt_ms(c.handoff_p50_ms),
            fmt_ms(c.handoff_p99_ms),
            fmt_ms(c.ping_p50_ms),
            per_cycle(c, Some(c.cmds_top_level_per_cycle), |n| format!("{n:.2}")),
            per_cycle(c, Some(c.cmds_total_per_cycle), |n| format!("{n:.2}")),
            c.jain,
            c.overtake_fraction * 100.0,
            c.overtake_over_1ms_fraction * 100.0,
            fmt_ms(c.call_to_ticket_p50_ms),
            fmt_ms(c.call_to_ticket_p99_ms),
            c.violations,
            c.errors
        );
    }
    cold_cells_note(md, records);
}

/// The cycles/s of every round of the cells above (one hot lock in one
/// process or across processes, or the 1,000 locks), when they ran in
/// rounds: the table above shows each implementation's median round.
fn rounds_table(md: &mut String, records: &[CellRecord], rounds: usize) {
    if !records.iter().any(|c| c.rounds_cycles_per_s.len() > 1) {
        return;
    }
    let _ = writeln!(
        md,
        "\nEach cell ran in {rounds} rounds, every implementation once per round and their order rotating from round to round \
         (this machine's speed drifts within minutes; see `benchmarks/src/rounds.rs`). Each row above is its implementation's \
         median round by cycles/s; its violations and errors count every round. Cycles/s of each round, in the order they ran:\n"
    );
    let mut impls: Vec<&str> = Vec::new();
    for c in records {
        if !impls.contains(&c.implementation) {
            impls.push(c.implementation);
        }
    }
    let _ = writeln!(md, "| cell | {} |", impls.join(" | "));
    let _ = writeln!(md, "|---|{}", "--:|".repeat(impls.len()));
    let mut tags: Vec<(f64, usize)> = Vec::new();
    for c in records {
        if !tags.contains(&(c.hold_ms, c.contenders)) {
            tags.push((c.hold_ms, c.contenders));
        }
    }
    tags.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    for (hold_ms, contenders) in tags {
        let row: Vec<String> = impls
            .iter()
            .map(|imp| {
                records
                    .iter()
                    .find(|c| {
                        c.implementation == *imp
                            && c.hold_ms == hold_ms
                            && c.contenders == contenders
                    })
                    .map_or("-".to_owned(), |c| fmt_rounds(&c.rounds_cycles_per_s))
            })
            .collect();
        let cell = match records
            .iter()
            .find(|c| c.contenders == contenders && c.locks > 1)
        {
            Some(c) => format!(
                "{} locks × {} H={hold_ms} ms",
                c.locks,
                contenders / c.locks
            ),
            None => format!("C={contenders} H={hold_ms} ms"),
        };
        let _ = writeln!(md, "| {cell} | {} |", row.join(" | "));
    }
}

/// A note listing the cells where some contender never got the lock
/// during warm-up (their window opened at the warm-up limit).
fn cold_cells_note(md: &mut String, records: &[CellRecord]) {
    let cold: Vec<String> = records
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

/// A per-cycle figure of `cell`, or "-" when the cell completed no cycle
/// (its totals would otherwise be printed as if per cycle).
fn per_cycle(cell: &CellRecord, value: Option<f64>, show: impl Fn(f64) -> String) -> String {
    match value {
        Some(value) if cell.cycles > 0 => show(value),
        _ => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::RunInfo;

    fn results(busy_cpus: usize) -> Results {
        Results::new(RunInfo {
            kind: "run",
            mode: "full",
            command: "cargo run --release -p fairlock-bench -- --busy-cpus --out x".to_owned(),
            date_utc: String::new(),
            nproc: 2,
            cpu_model: String::new(),
            redis_version: String::new(),
            clients: 8,
            window_s: 1.0,
            rounds: 1,
            busy_cpus,
            duration_s: 0.0,
        })
    }

    /// A fairlock row of `contenders` over `locks` at H=1 ms that ran in
    /// the rounds given, each round's cycles/s.
    fn row_of_rounds(
        contenders: usize,
        locks: usize,
        clients: usize,
        rounds: &[f64],
    ) -> CellRecord {
        CellRecord {
            implementation: "fairlock",
            contenders,
            locks,
            hold_ms: 1.0,
            clients,
            cycles: 10,
            cycles_per_s: rounds[0],
            rounds_cycles_per_s: rounds.to_vec(),
            ..CellRecord::default()
        }
    }

    /// Asserts that the section found by `heading` lists its rounds,
    /// `row` among them.
    fn assert_rounds_listed(results: &Results, heading: &str, row: &str) {
        let md = document(results, &[]);
        let at = md.find(heading).expect(heading);
        let section = &md[at..];
        let count = format!("Each cell ran in {} rounds", results.info.rounds);
        assert!(section.contains(&count), "{section}");
        assert!(section.contains(row), "{section}");
    }

    #[test]
    fn the_cell_across_processes_lists_its_rounds() {
        let mut results = results(0);
        results.info.rounds = 2;
        results.processes = vec![row_of_rounds(1024, 1, 4, &[700.0, 650.0])];
        assert_rounds_listed(
            &results,
            "contenders in 4 OS processes",
            "| C=1024 H=1 ms | 700 / 650 |",
        );
    }

    #[test]
    fn the_many_locks_cell_lists_its_rounds() {
        let mut results = results(0);
        results.info.rounds = 3;
        results.many_locks = vec![row_of_rounds(
            64_000,
            1000,
            8,
            &[10_500.0, 9_800.0, 12_000.0],
        )];
        assert_rounds_listed(
            &results,
            "1000 distinct locks",
            "| 1000 locks × 64 H=1 ms | 10500 / 9800 / 12000 |",
        );
    }

    #[test]
    fn a_busy_cpus_run_says_at_its_top_that_it_is_a_diagnostic() {
        let banner = "A diagnostic run, not a measure";
        let busy = document(&results(2), &[]);
        let top: String = busy.lines().take(6).collect::<Vec<_>>().join("\n");
        assert!(top.contains(banner), "no banner near the top:\n{top}");
        assert!(
            top.contains("--busy-cpus --out x"),
            "the command as given is missing:\n{top}"
        );
        assert!(!document(&results(0), &[]).contains(banner));
    }
}
