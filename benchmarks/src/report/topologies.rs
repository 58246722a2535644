//! `topologies.md`: the tables of `fairlock-bench --topologies`, one row
//! per topology and implementation: the 1,000-lock run, and one lock with
//! one contender (in rounds).

use std::fmt::Write as _;

use super::format::{fmt_ms, fmt_rounds};
use super::CellRecord;
use crate::cell::CellPlan;

/// One topology's measured cell for one implementation.
pub struct TopologyRow {
    /// The topology's name, as the README's table names it.
    pub topology: &'static str,
    /// The cell's record (for a cell in rounds, its median round).
    pub record: CellRecord,
}

/// What a `--topologies` run measured, and how.
pub struct TopologyRun<'a> {
    /// The 1,000-lock cells.
    pub many: &'a [TopologyRow],
    /// Their plan.
    pub many_plan: &'a CellPlan,
    /// The one-lock cells (C=1, H=0), medians of their rounds.
    pub one: &'a [TopologyRow],
    /// Their plan.
    pub one_plan: &'a CellPlan,
    /// Rounds of each one-lock cell.
    pub rounds: usize,
    /// `--quick`.
    pub quick: bool,
}

/// The markdown of `topologies.md`.
pub fn render(run: &TopologyRun<'_>) -> String {
    let (plan, rows) = (run.many_plan, run.many);
    let mut md = String::new();
    let _ = writeln!(md, "# fairlock per topology\n");
    let _ = writeln!(
        md,
        "`cargo run --release -p fairlock-bench -- --topologies{}`: {} locks, {} contenders on {} \
         simulated client processes, hold {} ms (a GET, the hold, a SET), {:.1} s window. \
         Every server on 127.0.0.1, started by the test kit; Redis CPU summed over the primaries.\n",
        if run.quick { " --quick" } else { "" },
        plan.locks,
        plan.contenders,
        plan.clients,
        plan.hold.as_millis(),
        plan.measure.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "| topology | implementation | cycles/s | vs fairlock-fred | vs spin-10ms | wait p99 | Redis CPU per cycle | violations | errors |"
    );
    let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|");
    for row in rows {
        // Sentinel with acks is compared with Sentinel's (the TLS rows
        // each have their own).
        let of_topology = |implementation| {
            find(rows, row.topology, implementation)
                .or_else(|| find(rows, "Sentinel", implementation))
        };
        let c = &row.record;
        let middle = [
            ratio(c, of_topology("fairlock-fred")),
            ratio(c, of_topology("spin-10ms")),
            fmt_ms(c.wait_p99_ms),
        ];
        write_row(&mut md, row, middle);
    }
    one_lock_table(&mut md, run);
    md
}

/// The one-lock cells: what a single lock's cycle costs on each topology,
/// and, beside fairlock with its defaults, fairlock with every call
/// through fred (`fairlock-fred`), so the script sockets' share shows on
/// each topology.
fn one_lock_table(md: &mut String, run: &TopologyRun<'_>) {
    if run.one.is_empty() {
        return;
    }
    let plan = run.one_plan;
    let _ = writeln!(
        md,
        "\n## One lock, {} contender, H = {} ms\n\n\
         {:.1} s window, in {} round(s): every implementation once per round, their order rotating from round to round; \
         each row is its median round, every round's cycles/s listed in the order they ran. `fairlock-fred` is fairlock \
         with `direct_calls(false)`: every call through fred, none on the script sockets (which are used on one primary, \
         behind Sentinel and on a cluster). Not measured with `replica_acks`.\n",
        plan.contenders,
        plan.hold.as_millis(),
        plan.measure.as_secs_f64(),
        run.rounds
    );
    let _ = writeln!(
        md,
        "| topology | implementation | cycles/s | each round | vs fairlock-fred | vs spin-10ms | Redis CPU per cycle | violations | errors |"
    );
    let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|");
    for row in run.one {
        let c = &row.record;
        let middle = [
            fmt_rounds(&c.rounds_cycles_per_s),
            ratio(c, find(run.one, row.topology, "fairlock-fred")),
            ratio(c, find(run.one, row.topology, "spin-10ms")),
        ];
        write_row(md, row, middle);
    }
}

/// One row of either table: the topology, the implementation and its
/// cycles/s, the table's own three columns, then Redis CPU per cycle,
/// violations and errors.
fn write_row(md: &mut String, row: &TopologyRow, middle: [String; 3]) {
    let c = &row.record;
    let [a, b, d] = middle;
    let _ = writeln!(
        md,
        "| {} | {} | {:.0} | {a} | {b} | {d} | {:.1} µs | {} | {} |",
        row.topology,
        c.implementation,
        c.cycles_per_s,
        c.redis_cpu_us_per_cycle,
        c.violations,
        c.errors
    );
}

/// The row of `implementation` on `topology`, if measured.
fn find<'a>(
    rows: &'a [TopologyRow],
    topology: &str,
    implementation: &str,
) -> Option<&'a TopologyRow> {
    rows.iter()
        .find(|r| r.topology == topology && r.record.implementation == implementation)
}

/// `record`'s cycles/s over `base`'s, or "-".
fn ratio(record: &CellRecord, base: Option<&TopologyRow>) -> String {
    base.filter(|b| b.record.cycles_per_s > 0.0)
        .map(|b| format!("{:.2}×", record.cycles_per_s / b.record.cycles_per_s))
        .unwrap_or_else(|| "-".to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{render, TopologyRow, TopologyRun};
    use crate::cell::CellPlan;
    use crate::report::CellRecord;

    fn record(implementation: &'static str, contenders: usize, rounds: &[f64]) -> CellRecord {
        let mut sorted = rounds.to_vec();
        sorted.sort_by(f64::total_cmp);
        CellRecord {
            implementation,
            contenders,
            cycles_per_s: sorted[(sorted.len() - 1) / 2],
            rounds_cycles_per_s: rounds.to_vec(),
            ..CellRecord::default()
        }
    }

    fn plan(contenders: usize, locks: usize) -> CellPlan {
        CellPlan {
            contenders,
            hold: Duration::ZERO,
            locks,
            clients: 1,
            warmup_min: Duration::ZERO,
            warmup_max: Duration::ZERO,
            measure: Duration::from_secs(3),
        }
    }

    /// Both tables give each row's ratio to fairlock-fred and to the spin
    /// lock of its own topology, not another's; the one-lock table lists
    /// every round.
    #[test]
    fn the_one_lock_table_compares_within_each_topology() {
        let row = |topology, implementation, rounds: &[f64]| TopologyRow {
            topology,
            record: record(implementation, 1, rounds),
        };
        let one = [
            row("one primary", "fairlock", &[300.0, 400.0, 350.0]),
            row("one primary", "fairlock-fred", &[200.0, 200.0, 200.0]),
            row("one primary", "spin-10ms", &[500.0, 500.0, 500.0]),
            row("Sentinel", "fairlock", &[90.0, 100.0, 110.0]),
            row("Sentinel", "fairlock-fred", &[50.0, 50.0, 50.0]),
            row("Sentinel", "spin-10ms", &[400.0, 400.0, 400.0]),
        ];
        let many = [
            row("one primary", "fairlock", &[1_000.0]),
            row("one primary", "fairlock-fred", &[800.0]),
            row("one primary", "spin-10ms", &[2_000.0]),
        ];
        let md = render(&TopologyRun {
            many: &many,
            many_plan: &plan(2_000, 1_000),
            one: &one,
            one_plan: &plan(1, 1),
            rounds: 3,
            quick: false,
        });
        assert!(
            md.contains("| one primary | fairlock | 1000 | 1.25× | 0.50× | - | 0.0 µs | 0 | 0 |"),
            "{md}"
        );
        assert!(md.contains("## One lock, 1 contender, H = 0 ms"), "{md}");
        assert!(
            md.contains("| one primary | fairlock | 350 | 300 / 400 / 350 | 1.75× | 0.70× |"),
            "{md}"
        );
        assert!(
            md.contains("| Sentinel | fairlock | 100 | 90 / 100 / 110 | 2.00× | 0.25× |"),
            "{md}"
        );
        assert!(
            md.contains("| Sentinel | fairlock-fred | 50 | 50 / 50 / 50 | 1.00× | 0.12× |"),
            "{md}"
        );
    }
}
