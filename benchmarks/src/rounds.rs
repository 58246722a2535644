//! Interleaved rounds of the benchmark's cells: one hot lock in one
//! process or across processes, and the 1,000 locks.
//!
//! This machine's speed drifts by tens of percent within minutes (the
//! PING round trip of one cell can be 40 µs and of the next 130 µs), and
//! the implementations of a cell run one after the other: with one window
//! each, a ratio between two of them measured the drift as much as the
//! locks. So the full run measures every cell in rounds: each
//! round runs every implementation once, the order rotating from round to
//! round (with three implementations A B C, then B C A, then C A B), and
//! each implementation's row in the report is its median round by
//! cycles/s. The rounds' cycles/s are all kept beside it
//! ([`CellRecord::rounds_cycles_per_s`]), and its violations and errors
//! are those of every round, and it counts as warmed up only if every
//! round was, so a bad round is never hidden by the median.

use crate::impls::{Implementation, Result};
use crate::progress::Progress;
use crate::report::CellRecord;

/// Measures one cell in `rounds` rounds, every implementation of `impls`
/// once per round in rotating order, and returns each implementation's
/// median round ([`Rounds::medians`]). `what` names the cell on the
/// progress line, `seconds` is one measurement's estimated length, and
/// `measure` measures one implementation once.
pub(crate) async fn in_rounds(
    impls: &[Implementation],
    rounds: usize,
    progress: &Progress,
    what: &str,
    seconds: f64,
    mut measure: impl AsyncFnMut(Implementation) -> Result<CellRecord>,
) -> Result<Vec<CellRecord>> {
    let mut records = Rounds::new(impls);
    for round in 0..rounds {
        for imp in order(impls, round) {
            let of = if rounds > 1 {
                format!(" (round {} of {rounds})", round + 1)
            } else {
                String::new()
            };
            progress.step(&format!("{} {what}{of}", imp.label()), seconds);
            let record = measure(imp).await?;
            progress.println(&record.summary());
            records.add(record);
        }
    }
    Ok(records.medians())
}

/// The implementations in the order they run in round `round`.
pub(crate) fn order(impls: &[Implementation], round: usize) -> Vec<Implementation> {
    let mut order = impls.to_vec();
    if !order.is_empty() {
        order.rotate_left(round % impls.len());
    }
    order
}

/// The records of one cell's rounds, per implementation.
pub(crate) struct Rounds {
    per_impl: Vec<(&'static str, Vec<CellRecord>)>,
}

impl Rounds {
    /// No round yet; rows come out in the order of `impls`.
    pub(crate) fn new(impls: &[Implementation]) -> Rounds {
        Rounds {
            per_impl: impls.iter().map(|imp| (imp.label(), Vec::new())).collect(),
        }
    }

    /// One round's record of one implementation.
    pub(crate) fn add(&mut self, record: CellRecord) {
        if let Some((_, records)) = self
            .per_impl
            .iter_mut()
            .find(|(label, _)| *label == record.implementation)
        {
            records.push(record);
        }
    }

    /// Each implementation's median round by cycles/s (the lower of the
    /// two middle ones for an even count), carrying every round's cycles/s
    /// in the order they ran, the violations and errors of all rounds, and
    /// warmed up only if every round was.
    pub(crate) fn medians(self) -> Vec<CellRecord> {
        self.per_impl
            .into_iter()
            .filter_map(|(_, records)| {
                let rounds: Vec<f64> = records.iter().map(|r| r.cycles_per_s).collect();
                let violations = records.iter().map(|r| r.violations).sum();
                let errors = records.iter().map(|r| r.errors).sum();
                let first_error = records.iter().find_map(|r| r.first_error.clone());
                let warmed_up = records.iter().all(|r| r.warmed_up);
                let mut sorted = records;
                sorted.sort_by(|a, b| a.cycles_per_s.total_cmp(&b.cycles_per_s));
                let middle = sorted.len().checked_sub(1)? / 2;
                let mut median = sorted.swap_remove(middle);
                median.rounds_cycles_per_s = rounds;
                median.violations = violations;
                median.errors = errors;
                median.warmed_up = warmed_up;
                median.first_error = median.first_error.or(first_error);
                Some(median)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(imp: Implementation, cycles_per_s: f64, violations: u64) -> CellRecord {
        CellRecord {
            implementation: imp.label(),
            cycles_per_s,
            violations,
            warmed_up: true,
            ..CellRecord::default()
        }
    }

    #[test]
    fn the_order_rotates_so_each_implementation_runs_in_each_place() {
        let impls = [
            Implementation::Fairlock,
            Implementation::Rslock,
            Implementation::Spin10,
        ];
        let firsts: Vec<_> = (0..3).map(|round| order(&impls, round)[0]).collect();
        assert_eq!(firsts, impls.to_vec());
        assert_eq!(order(&impls, 3), impls.to_vec());
        assert!(order(&[], 2).is_empty());
    }

    #[test]
    fn each_row_is_the_median_round_and_keeps_every_round() {
        let mut rounds = Rounds::new(&[Implementation::Fairlock, Implementation::Rslock]);
        for (fair, rs) in [(900.0, 1000.0), (700.0, 1200.0), (800.0, 1100.0)] {
            rounds.add(record(Implementation::Rslock, rs, 0));
            rounds.add(record(Implementation::Fairlock, fair, 0));
        }
        let rows = rounds.medians();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].implementation, Implementation::Fairlock.label());
        assert_eq!(rows[0].cycles_per_s, 800.0);
        assert_eq!(rows[0].rounds_cycles_per_s, vec![900.0, 700.0, 800.0]);
        assert_eq!(rows[1].cycles_per_s, 1100.0);
        // An even count takes the lower middle round.
        let mut rounds = Rounds::new(&[Implementation::Fairlock]);
        rounds.add(record(Implementation::Fairlock, 10.0, 0));
        rounds.add(record(Implementation::Fairlock, 30.0, 0));
        assert_eq!(rounds.medians()[0].cycles_per_s, 10.0);
    }

    #[test]
    fn a_violation_or_a_cold_start_in_any_round_stays_in_the_row() {
        let mut rounds = Rounds::new(&[Implementation::Rslock]);
        rounds.add(record(Implementation::Rslock, 100.0, 2));
        rounds.add(record(Implementation::Rslock, 200.0, 0));
        rounds.add(CellRecord {
            warmed_up: false,
            ..record(Implementation::Rslock, 300.0, 0)
        });
        let rows = rounds.medians();
        assert_eq!(rows[0].cycles_per_s, 200.0);
        assert_eq!(rows[0].violations, 2);
        assert!(!rows[0].warmed_up, "a round that never warmed up is listed");
    }

    #[test]
    fn an_implementation_without_rounds_has_no_row() {
        let mut rounds = Rounds::new(&[Implementation::Fairlock, Implementation::Rslock]);
        rounds.add(record(Implementation::Rslock, 100.0, 0));
        let rows = rounds.medians();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].implementation, Implementation::Rslock.label());
    }
}
