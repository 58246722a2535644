//! Statistics of one cell, computed offline from the recorded attempts.
//!
//! Definitions (also in benchmarks/README.md):
//! * **wait**: from the moment a task starts waiting to the moment it holds
//!   the lock, for acquisitions inside the window.
//! * **handoff**: for consecutive holders P then N of one lock, where N was
//!   already waiting when P started releasing: from P's release start to
//!   N's acquisition.
//! * **overtake**: an acquisition A overtook if some other attempt B of the
//!   same lock started waiting before A did and was still waiting when A
//!   got the lock (B.wait_start < A.wait_start and B.end > A.end).
//! * **overtake by more than 1 ms**: as an overtake, but B started waiting
//!   more than 1 ms before A (B.wait_start + 1 ms < A.wait_start): the
//!   caller-side FIFO measure, tolerant of calls made at nearly the same
//!   instant on different connections.
//! * **call to ticket**: for fairlock grants that queued, from the `lock()`
//!   call to the moment Redis ran its enqueue (the ticket is the server's
//!   clock in µs; Redis runs on the same machine).
//! * **Jain's index** over the contenders' acquisitions: (sum x)^2 /
//!   (n * sum x^2); 1 is perfectly even. Counted over the largest whole
//!   number of fair-share rounds (a round = C x mean cycle time, the time
//!   in which a fair lock serves every contender once) that fits in the
//!   window, from its start: a window of 2.5 rounds would otherwise give
//!   half the contenders 3 turns and half 2 under a perfectly fair lock.
//!   The index over the raw window is kept too (`jain_window`).
//! * **violations**: per lock, |completed critical sections - final counter|;
//!   the counter is a non-atomic GET then SET, so two holders at once lose
//!   an update.

use std::collections::BTreeMap;

use crate::admin::HARNESS_COMMANDS;
use crate::cell::{Attempt, CellRun};

/// Commands Redis executed for the lock itself during the window.
#[derive(Debug, Clone, Default)]
pub struct LockCommands {
    /// Calls per command name, harness and critical-section commands removed.
    pub by_command: BTreeMap<String, u64>,
    /// Commands the clients sent (round trips).
    pub top_level: u64,
    /// Everything Redis executed, including the commands inside scripts.
    pub total: u64,
}

/// The statistics of one cell.
#[derive(Debug, Clone)]
pub struct CellMetrics {
    /// Acquisitions inside the window.
    pub cycles: u64,
    /// Length of the window, seconds.
    pub window_s: f64,
    /// Acquisitions per second.
    pub cycles_per_s: f64,
    /// Window / cycles, ms.
    pub mean_cycle_ms: f64,
    /// Mean time from acquisition to release start, ms.
    pub hold_mean_ms: f64,
    /// Sorted waits of the window's acquisitions, ms.
    pub waits_ms: Vec<f64>,
    /// Sorted handoff times, ms.
    pub handoffs_ms: Vec<f64>,
    /// Sorted times from an acquisition to the answer of the critical
    /// section's first command (its GET), ms.
    pub first_replies_ms: Vec<f64>,
    /// Lock commands in the window.
    pub commands: LockCommands,
    /// Jain's fairness index over contenders, over whole rounds.
    pub jain: f64,
    /// Whole fair-share rounds `jain` was counted over (0: the raw window,
    /// shorter than one round).
    pub jain_rounds: u64,
    /// Jain's fairness index over the raw window.
    pub jain_window: f64,
    /// Acquisitions that overtook an older waiter.
    pub overtakes: u64,
    /// Acquisitions that overtook a waiter at least 1 ms older.
    pub overtakes_over_1ms: u64,
    /// Call to ticket of the queued fairlock grants, ms, sorted.
    pub call_to_ticket_ms: Vec<f64>,
    /// For locks with queue tickets: consecutive grants (that had queued)
    /// whose tickets went down, i.e. real queue overtakes as Redis ordered
    /// the waiters. `None` for locks without tickets.
    pub ticket_inversions: Option<u64>,
    /// Lost updates and other counter mismatches.
    pub violations: u64,
    /// Completed critical sections over the whole cell.
    pub cs_completed: u64,
    /// Median PING round trip during the window, ms.
    pub ping_p50_ms: Option<f64>,
}

impl CellMetrics {
    /// Nearest-rank percentile of the waits, ms.
    pub fn wait(&self, q: f64) -> Option<f64> {
        percentile(&self.waits_ms, q)
    }

    /// Nearest-rank percentile of the handoffs, ms.
    pub fn handoff(&self, q: f64) -> Option<f64> {
        percentile(&self.handoffs_ms, q)
    }

    /// Nearest-rank percentile of the critical section's first command
    /// (acquisition to the GET's answer), ms.
    pub fn first_reply(&self, q: f64) -> Option<f64> {
        percentile(&self.first_replies_ms, q)
    }

    /// Nearest-rank percentile of call-to-ticket times, ms.
    pub fn call_to_ticket(&self, q: f64) -> Option<f64> {
        percentile(&self.call_to_ticket_ms, q)
    }

    /// Fraction of the window's acquisitions that overtook a waiter at
    /// least 1 ms older.
    pub fn overtake_over_1ms_fraction(&self) -> f64 {
        if self.cycles == 0 {
            0.0
        } else {
            self.overtakes_over_1ms as f64 / self.cycles as f64
        }
    }

    /// Fraction of the window's acquisitions that overtook an older waiter.
    pub fn overtake_fraction(&self) -> f64 {
        if self.cycles == 0 {
            0.0
        } else {
            self.overtakes as f64 / self.cycles as f64
        }
    }

    /// Lock commands per cycle: (top-level, total).
    pub fn commands_per_cycle(&self) -> (f64, f64) {
        let cycles = self.cycles.max(1) as f64;
        (
            self.commands.top_level as f64 / cycles,
            self.commands.total as f64 / cycles,
        )
    }

    /// Up to `points` (wait ms, cumulative fraction) pairs of the wait CDF.
    pub fn wait_cdf(&self, points: usize) -> Vec<(f64, f64)> {
        let n = self.waits_ms.len();
        if n == 0 {
            return Vec::new();
        }
        let step = (n / points.max(1)).max(1);
        let mut cdf: Vec<(f64, f64)> = (0..n)
            .step_by(step)
            .map(|i| (self.waits_ms[i], (i + 1) as f64 / n as f64))
            .collect();
        cdf.push((self.waits_ms[n - 1], 1.0));
        cdf
    }
}

/// Nearest-rank percentile of sorted `values`.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Jain's fairness index of `values` (1.0 for an empty or all-zero set).
pub fn jain(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|v| v * v).sum();
    if squares == 0.0 {
        1.0
    } else {
        sum * sum / (values.len() as f64 * squares)
    }
}

/// Splits `INFO commandstats` over the window into lock work: removes the
/// harness's own commands and the critical section's GETs and SETs, and
/// counts as top-level the script calls plus `top_level_commands`.
pub fn lock_commands(
    commandstats: &BTreeMap<String, u64>,
    data_gets: u64,
    data_sets: u64,
    top_level_commands: &[&str],
) -> LockCommands {
    let mut out = LockCommands::default();
    for (name, &calls) in commandstats {
        if HARNESS_COMMANDS.contains(&name.as_str()) {
            continue;
        }
        let calls = match name.as_str() {
            "get" => calls.saturating_sub(data_gets),
            "set" => calls.saturating_sub(data_sets),
            _ => calls,
        };
        if calls == 0 {
            continue;
        }
        let script_call =
            name.starts_with("eval") || name.starts_with("fcall") || name.starts_with("script|");
        if script_call || top_level_commands.contains(&name.as_str()) {
            out.top_level += calls;
        }
        out.total += calls;
        out.by_command.insert(name.clone(), calls);
    }
    out
}

/// For each acquisition in the window whose critical section's first
/// command was answered: the time from the acquisition to that answer, ns.
fn first_commands(attempts: &[Attempt], in_window: impl Fn(u64) -> bool) -> Vec<u64> {
    attempts
        .iter()
        .filter(|a| a.acquired && in_window(a.end) && a.first_reply >= a.end)
        .map(|a| a.first_reply - a.end)
        .collect()
}

/// Computes a cell's statistics.
pub fn summarize(run: &CellRun, top_level_commands: &[&str]) -> CellMetrics {
    let (w0, w1) = run.window;
    let in_window = |t: u64| t >= w0 && t <= w1;
    let window_s = (w1 - w0) as f64 / 1e9;
    let ms = |ns: u64| ns as f64 / 1e6;

    let mut per_task = vec![0f64; run.plan.contenders];
    let mut waits_ms = Vec::new();
    let mut hold_total = 0u64;
    for a in run
        .attempts
        .iter()
        .filter(|a| a.acquired && in_window(a.end))
    {
        per_task[a.task as usize] += 1.0;
        waits_ms.push(ms(a.end - a.wait_start));
        hold_total += a.release_start.saturating_sub(a.end);
    }
    waits_ms.sort_by(f64::total_cmp);
    let mut first_replies_ms: Vec<f64> = first_commands(&run.attempts, in_window)
        .into_iter()
        .map(ms)
        .collect();
    first_replies_ms.sort_by(f64::total_cmp);
    let cycles = waits_ms.len() as u64;

    let round_ns = (w1 - w0) as f64 * run.plan.contenders as f64 / cycles.max(1) as f64;
    let jain_rounds = if cycles == 0 {
        0
    } else {
        ((w1 - w0) as f64 / round_ns).floor() as u64
    };
    let rounds_end = if jain_rounds == 0 {
        w1
    } else {
        w0 + (jain_rounds as f64 * round_ns) as u64
    };
    let mut per_task_rounds = vec![0f64; run.plan.contenders];
    for a in &run.attempts {
        if a.acquired && a.end >= w0 && a.end <= rounds_end {
            per_task_rounds[a.task as usize] += 1.0;
        }
    }

    let mut by_lock: Vec<Vec<Attempt>> = vec![Vec::new(); run.plan.locks];
    for a in &run.attempts {
        by_lock[a.lock as usize].push(*a);
    }
    let mut overtakes = 0;
    let mut overtakes_over_1ms = 0;
    let mut ticket_inversions = None;
    let mut handoffs_ms = Vec::new();
    for attempts in &mut by_lock {
        overtakes += count_overtakes(attempts, in_window);
        overtakes_over_1ms += count_overtakes_by(attempts, 1_000_000, in_window);
        if let Some(n) = count_ticket_inversions(attempts, in_window) {
            *ticket_inversions.get_or_insert(0) += n;
        }
        handoffs_ms.extend(handoffs(attempts, in_window).into_iter().map(ms));
    }
    handoffs_ms.sort_by(f64::total_cmp);

    let violations = run
        .cs_completed
        .iter()
        .zip(&run.counters)
        .map(|(&done, &counter)| done.abs_diff(counter.max(0) as u64))
        .sum();

    let mut pings: Vec<f64> = run
        .pings
        .iter()
        .filter(|(at, _)| in_window(*at))
        .map(|(_, us)| us / 1e3)
        .collect();
    pings.sort_by(f64::total_cmp);

    CellMetrics {
        ping_p50_ms: percentile(&pings, 0.5),
        cycles,
        window_s,
        cycles_per_s: cycles as f64 / window_s.max(1e-9),
        mean_cycle_ms: if cycles == 0 {
            f64::NAN
        } else {
            window_s * 1e3 / cycles as f64
        },
        hold_mean_ms: if cycles == 0 {
            0.0
        } else {
            ms(hold_total) / cycles as f64
        },
        waits_ms,
        handoffs_ms,
        first_replies_ms,
        commands: lock_commands(
            &run.commandstats,
            run.data_gets,
            run.data_sets,
            top_level_commands,
        ),
        jain: jain(&per_task_rounds),
        jain_rounds,
        jain_window: jain(&per_task),
        overtakes,
        overtakes_over_1ms,
        call_to_ticket_ms: call_to_ticket(&run.attempts, in_window),
        ticket_inversions,
        violations,
        cs_completed: run.cs_completed.iter().sum(),
    }
}

/// Acquisitions (inside the window) that overtook an older waiter of the
/// same lock. Sweeps the attempts in order of wait start, keeping the
/// latest end among strictly earlier starters: O(n log n).
fn count_overtakes(attempts: &mut [Attempt], in_window: impl Fn(u64) -> bool) -> u64 {
    attempts.sort_by_key(|a| a.wait_start);
    let mut overtakes = 0;
    let mut latest_end_before = 0u64;
    let mut i = 0;
    while i < attempts.len() {
        // Attempts that started waiting at the same instant do not overtake
        // each other.
        let start = attempts[i].wait_start;
        let mut j = i;
        while j < attempts.len() && attempts[j].wait_start == start {
            let a = &attempts[j];
            if a.acquired && in_window(a.end) && latest_end_before > a.end {
                overtakes += 1;
            }
            j += 1;
        }
        for a in &attempts[i..j] {
            latest_end_before = latest_end_before.max(a.end);
        }
        i = j;
    }
    overtakes
}

/// Acquisitions (inside the window) that overtook a waiter of the same lock
/// that started more than `margin_ns` earlier. `attempts` are sorted by
/// wait start ([`count_overtakes`] sorts them); a second pointer keeps the
/// latest end among attempts that started before `start - margin`.
fn count_overtakes_by(
    attempts: &[Attempt],
    margin_ns: u64,
    in_window: impl Fn(u64) -> bool,
) -> u64 {
    let mut overtakes = 0;
    let mut latest_end = 0u64;
    let mut older = 0;
    for a in attempts {
        let limit = a.wait_start.saturating_sub(margin_ns);
        while older < attempts.len() && attempts[older].wait_start < limit {
            latest_end = latest_end.max(attempts[older].end);
            older += 1;
        }
        if a.acquired && in_window(a.end) && latest_end > a.end {
            overtakes += 1;
        }
    }
    overtakes
}

/// Call-to-ticket times (ms, sorted) of the window's grants that queued.
fn call_to_ticket(attempts: &[Attempt], in_window: impl Fn(u64) -> bool) -> Vec<f64> {
    let mut times: Vec<f64> = attempts
        .iter()
        .filter(|a| a.acquired && in_window(a.end))
        .filter_map(|a| {
            a.ticket
                .map(|t| t.saturating_sub(a.call_unix_us) as f64 / 1e3)
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times
}

/// Handoff times (ns) of one lock: release start of a holder to the
/// acquisition of the next holder, if that one was already waiting.
fn handoffs(attempts: &[Attempt], in_window: impl Fn(u64) -> bool) -> Vec<u64> {
    let mut acquired: Vec<&Attempt> = attempts.iter().filter(|a| a.acquired).collect();
    acquired.sort_by_key(|a| a.end);
    acquired
        .windows(2)
        .filter(|pair| in_window(pair[1].end) && pair[1].wait_start < pair[0].release_start)
        .map(|pair| pair[1].end.saturating_sub(pair[0].release_start))
        .collect()
}

/// Grants that had queued, in grant order, whose ticket is lower than the
/// previous one's: a waiter served after a younger one, by the lock's own
/// (server-assigned) order. Client clocks play no part, unlike overtakes.
fn count_ticket_inversions(attempts: &[Attempt], in_window: impl Fn(u64) -> bool) -> Option<u64> {
    let mut granted: Vec<(u64, u64)> = attempts
        .iter()
        .filter(|a| a.acquired && in_window(a.end))
        .filter_map(|a| a.ticket.map(|t| (a.end, t)))
        .collect();
    if granted.is_empty() {
        return None;
    }
    granted.sort_unstable();
    Some(granted.windows(2).filter(|w| w[1].1 < w[0].1).count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(task: u32, wait_start: u64, end: u64, release_start: u64) -> Attempt {
        Attempt {
            task,
            lock: 0,
            wait_start,
            end,
            acquired: end != u64::MAX,
            release_start,
            first_reply: 0,
            ticket: None,
            call_unix_us: 0,
        }
    }

    #[test]
    fn overtakes_by_a_margin_ignore_near_simultaneous_calls() {
        let all = |_| true;
        // 1 starts at 1 and waits until 30; 2 starts at 2 (1 ns later) and
        // 3 at 5,000,000 (5 ms later), both granted at 20: both overtake,
        // only 3 by more than 1 ms.
        let mut attempts = vec![
            attempt(0, 0, 0, 10),
            attempt(1, 1, 30, 31),
            attempt(2, 2, 20, 21),
            attempt(3, 5_000_000, 5_000_020, 5_000_021),
            attempt(4, 5_000_001, 5_000_040, 5_000_041),
        ];
        attempts[3].end = 20;
        assert_eq!(count_overtakes(&mut attempts, all), 2);
        assert_eq!(count_overtakes_by(&attempts, 1_000_000, all), 1);
    }

    #[test]
    fn ticket_inversions_count_grants_against_queue_order() {
        let all = |_| true;
        let with_ticket = |end: u64, ticket: u64| Attempt {
            ticket: Some(ticket),
            ..attempt(0, 0, end, end + 1)
        };
        let in_order = [with_ticket(10, 1), with_ticket(20, 2), with_ticket(30, 5)];
        assert_eq!(count_ticket_inversions(&in_order, all), Some(0));
        let swapped = [with_ticket(10, 2), with_ticket(20, 1), with_ticket(30, 3)];
        assert_eq!(count_ticket_inversions(&swapped, all), Some(1));
        assert_eq!(count_ticket_inversions(&[attempt(0, 0, 5, 6)], all), None);
    }

    #[test]
    fn fifo_has_no_overtakes_and_barging_does() {
        let all = |_| true;
        // Task 0 holds 0..10; 1 waits from 1, 2 from 2: granted in order.
        let mut fifo = vec![
            attempt(0, 0, 0, 10),
            attempt(1, 1, 11, 20),
            attempt(2, 2, 21, 30),
        ];
        assert_eq!(count_overtakes(&mut fifo, all), 0);
        // Task 2 barges ahead of task 1.
        let mut barge = vec![
            attempt(0, 0, 0, 10),
            attempt(1, 1, 21, 30),
            attempt(2, 2, 11, 20),
        ];
        assert_eq!(count_overtakes(&mut barge, all), 1);
        // A waiter still waiting at the end counts as overtaken.
        let mut starved = vec![attempt(1, 1, u64::MAX, 0), attempt(2, 2, 11, 20)];
        assert_eq!(count_overtakes(&mut starved, all), 1);
    }

    #[test]
    fn handoff_only_to_waiters() {
        let all = |_| true;
        let attempts = vec![
            attempt(0, 0, 0, 10),
            attempt(1, 1, 12, 20),  // waited since 1: handoff 2
            attempt(2, 25, 26, 30), // arrived after release start: no handoff
        ];
        assert_eq!(handoffs(&attempts, all), vec![2]);
    }

    #[test]
    fn first_commands_only_of_answered_acquisitions_in_the_window() {
        let with_reply = |end: u64, first_reply: u64| Attempt {
            first_reply,
            ..attempt(0, 0, end, end + 100)
        };
        let attempts = [
            with_reply(10, 40),
            // Its GET failed: no answer recorded.
            with_reply(20, 0),
            // Never acquired.
            attempt(1, 0, u64::MAX, 0),
            // Outside the window.
            with_reply(900, 950),
        ];
        assert_eq!(first_commands(&attempts, |t| t < 500), vec![30]);
    }

    #[test]
    fn percentiles_and_jain() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), Some(2.0));
        assert_eq!(percentile(&v, 0.99), Some(4.0));
        assert_eq!(percentile(&[], 0.5), None);
        assert!((jain(&[5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn script_internals_are_not_top_level() {
        let stats: BTreeMap<String, u64> = [
            ("evalsha", 10),
            ("get", 25),
            ("set", 40),
            ("del", 10),
            ("info", 1),
            ("config|resetstat", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let c = lock_commands(&stats, 15, 15, &["set"]);
        assert_eq!(c.top_level, 10 + 25);
        assert_eq!(c.total, 10 + 10 + 25 + 10);
    }
}
