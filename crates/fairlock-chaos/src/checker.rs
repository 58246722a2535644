//! The checker: replays what Redis applied and what the workers saw, after
//! the run, and counts every way the lock could have failed.
//!
//! It is a pure function of the logs ([`RunLogs`] in, [`Report`] out) so
//! that each count can be tested on a hand-made log that has exactly the
//! failure it is meant to find. Two sources are replayed:
//!
//! * the resource logs: one Redis list per resource, appended by the same
//!   script that writes the counter, on a server the faults never touch.
//!   Their order is the order Redis applied the writes, whatever the
//!   workers' clocks say;
//! * the worker logs: every call's start and end, every grant (holder,
//!   token) and every lease-lost signal, stamped with the machine's clock.
//!
//! Orderings that come from the worker clocks are only used where a log
//! line's delay cannot fake a failure: a grant is "earlier" than another
//! only if its acquire call had returned before the other's began.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::events::{
    AppliedWrite, CallKind, FaultKind, FaultRecord, Outcome, WorkerEvent, WorkerExit,
};

/// One worker process's log and how it ended.
#[derive(Debug, Clone)]
pub struct WorkerLog {
    /// Its events, in file order.
    pub events: Vec<WorkerEvent>,
    /// How it ended.
    pub exit: WorkerExit,
}

/// What was left on the lock server after every worker stopped cleanly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Leftovers {
    /// Locks that still had an owner.
    pub owners: u64,
    /// Queue entries still present, summed over the locks.
    pub queue_entries: u64,
    /// Keys on the lock server without a TTL (every key of a lock must
    /// carry one, so that an idle lock leaves nothing behind).
    pub keys_without_ttl: u64,
}

/// Everything the checker reads.
#[derive(Debug, Clone, Default)]
pub struct RunLogs {
    /// Every worker process of the run.
    pub workers: Vec<WorkerLog>,
    /// Per resource (index = lock index): the applied writes, in order.
    pub resources: Vec<Vec<AppliedWrite>>,
    /// Per resource: the counter's final value (0 if missing).
    pub counters: Vec<i64>,
    /// The faults, in the order they were injected.
    pub faults: Vec<FaultRecord>,
    /// The lock server after the clean shutdown.
    pub leftovers: Leftovers,
    /// When the workers were told to stop.
    pub run_end_us: u64,
    /// The longest recovery allowed: lease + waiter timeout + 1 s.
    pub recovery_bound_us: u64,
}

/// The recovery after one fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recovery {
    /// The fault.
    pub kind: FaultKind,
    /// Milliseconds from the fault's end until every lock that had a
    /// waiter had a new holder; `None` if that did not happen before the
    /// next fault (or the end of the run).
    pub ms: Option<u64>,
}

/// The checker's counts. The `must_be_zero` ones decide the exit status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Faults injected, by kind.
    pub faults_by_kind: BTreeMap<String, u64>,
    /// Successful acquisitions.
    pub acquisitions: u64,
    /// Writes applied to the resources.
    pub writes_applied: u64,
    /// Fenced reads refused as stale (the fence doing its job).
    pub stale_reads_rejected: u64,
    /// Fenced writes refused as stale (the fence doing its job).
    pub stale_writes_rejected: u64,
    /// Calls that failed with another error (expected under faults).
    pub call_errors: u64,
    /// Lease-lost signals seen by holders.
    pub lease_lost_signals: u64,
    /// Applied writes whose token was lower than one applied before.
    pub stale_accepted: u64,
    /// Applied writes with the newest token but from another holder.
    pub equal_token_other_holder: u64,
    /// Applied writes whose read was not the value just before them.
    pub lost_updates: u64,
    /// Resources whose final counter differs from their last applied write.
    pub counter_mismatches: u64,
    /// Extra grants of a token another grant of the same lock already had.
    pub tokens_granted_twice: u64,
    /// Grants whose token was not above that of a grant that had returned
    /// before they were asked for.
    pub tokens_backwards: u64,
    /// Operations applied by a holder after a newer grant of its lock had
    /// returned, while it had not been told its lease was lost
    /// (informational: fencing is what makes these harmless).
    pub acted_after_lease_untold: u64,
    /// Recovery after each fault.
    pub recoveries: Vec<Recovery>,
    /// Longest recovery, in ms.
    pub longest_recovery_ms: Option<u64>,
    /// Faults after which some lock waited for was never granted again
    /// before the next fault or the run's end.
    pub unrecovered: u64,
    /// Recoveries longer than the bound (informational: a wall-clock
    /// figure of a loaded machine, reported, not a pass condition).
    pub slow_recoveries: u64,
    /// Owners and queue entries left after the clean shutdown.
    pub leftovers: Leftovers,
    /// Calls that outlived their own timeout by more than 1 s.
    pub hangs: u64,
    /// Worker processes that panicked.
    pub panics: u64,
    /// Worker processes that exited with a failure or had to be killed.
    pub bad_exits: u64,
    /// Whether any worker printed a warning about an evicting policy.
    pub eviction_warning_seen: bool,
    /// For each non-zero must-be-zero count: how many of its findings
    /// followed each kind of fault (the latest fault that started before
    /// the finding; "none" before the first fault).
    pub findings_by_fault: BTreeMap<String, BTreeMap<String, u64>>,
    /// For each non-zero must-be-zero count: its first finding, as the
    /// latest fault before it and the seconds since that fault started.
    pub first_finding: BTreeMap<String, String>,
}

impl Report {
    /// The counts that must be zero, with their names.
    pub fn must_be_zero(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("stale_accepted", self.stale_accepted),
            ("equal_token_other_holder", self.equal_token_other_holder),
            ("lost_updates", self.lost_updates),
            ("counter_mismatches", self.counter_mismatches),
            ("tokens_granted_twice", self.tokens_granted_twice),
            ("tokens_backwards", self.tokens_backwards),
            ("unrecovered", self.unrecovered),
            ("leftover_owners", self.leftovers.owners),
            ("leftover_queue_entries", self.leftovers.queue_entries),
            ("keys_without_ttl", self.leftovers.keys_without_ttl),
            ("hangs", self.hangs),
            ("panics", self.panics),
            ("bad_exits", self.bad_exits),
        ]
    }

    /// Whether every must-be-zero count is zero.
    pub fn passed(&self) -> bool {
        self.must_be_zero().iter().all(|(_, n)| *n == 0)
    }
}

/// A must-be-zero finding, with the time it happened (to tell which fault
/// it followed).
pub type Finding = (&'static str, u64);

/// What replaying one resource log finds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceReplay {
    /// Entries with a token lower than the newest applied before them.
    pub stale_accepted: u64,
    /// Entries with the newest token but another holder.
    pub equal_token_other_holder: u64,
    /// Entries whose read differs from the previous entry's written value.
    pub lost_updates: u64,
    /// The last written value (0 for an empty log).
    pub last_written: i64,
    /// Each of the above, with the writer's time.
    pub findings: Vec<Finding>,
}

/// Replays one resource's applied writes in the order Redis applied them.
pub fn replay_resource(log: &[AppliedWrite]) -> ResourceReplay {
    let mut replay = ResourceReplay::default();
    let mut newest: Option<(u64, &str)> = None;
    for entry in log {
        match newest {
            Some((token, _)) if entry.token < token => {
                replay.stale_accepted += 1;
                replay.findings.push(("stale_accepted", entry.at_us));
            }
            Some((token, holder)) if entry.token == token && entry.holder != holder => {
                replay.equal_token_other_holder += 1;
                replay
                    .findings
                    .push(("equal_token_other_holder", entry.at_us));
            }
            Some((token, _)) if entry.token == token => {}
            _ => newest = Some((entry.token, &entry.holder)),
        }
        if entry.read != replay.last_written {
            replay.lost_updates += 1;
            replay.findings.push(("lost_updates", entry.at_us));
        }
        replay.last_written = entry.written;
    }
    replay
}

/// One grant as a worker saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Index of the lock.
    pub lock: usize,
    /// Owner id of the guard.
    pub holder: String,
    /// Its token.
    pub token: u64,
    /// When the acquire call started.
    pub begin_us: u64,
    /// When it returned.
    pub end_us: u64,
}

/// Counts tokens handed to two grants, and grants whose token is not above
/// a grant that had already returned when they were asked for. Both are
/// per lock. The findings carry the later grant's time.
pub fn check_grants(grants: &[Grant]) -> (u64, u64, Vec<Finding>) {
    let mut findings = Vec::new();
    let mut by_lock: BTreeMap<usize, Vec<&Grant>> = BTreeMap::new();
    for g in grants {
        by_lock.entry(g.lock).or_default().push(g);
    }
    let (mut twice, mut backwards) = (0, 0);
    for grants in by_lock.values() {
        let mut holders: HashMap<u64, HashSet<&str>> = HashMap::new();
        let mut in_time_order = grants.clone();
        in_time_order.sort_by_key(|g| g.end_us);
        for g in in_time_order {
            let seen = holders.entry(g.token).or_default();
            if seen.insert(&g.holder) && seen.len() > 1 {
                twice += 1;
                findings.push(("tokens_granted_twice", g.end_us));
            }
        }

        let mut by_end: Vec<&Grant> = grants.clone();
        by_end.sort_by_key(|g| g.end_us);
        let mut by_begin: Vec<&Grant> = grants.clone();
        by_begin.sort_by_key(|g| g.begin_us);
        let mut done = 0;
        let mut max_before: Option<u64> = None;
        for g in by_begin {
            while done < by_end.len() && by_end[done].end_us < g.begin_us {
                max_before = max_before.max(Some(by_end[done].token));
                done += 1;
            }
            if max_before.is_some_and(|m| g.token <= m) {
                backwards += 1;
                findings.push(("tokens_backwards", g.begin_us));
            }
        }
    }
    (twice, backwards, findings)
}

/// One call with its end, if it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    kind: CallKind,
    lock: usize,
    holder: Option<String>,
    token: Option<u64>,
    begin_us: u64,
    limit_ms: u64,
    end: Option<(u64, Outcome)>,
}

fn calls_of(events: &[WorkerEvent]) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut index: HashMap<u64, usize> = HashMap::new();
    for event in events {
        match event {
            WorkerEvent::Begin {
                seq,
                call,
                lock,
                holder,
                token,
                at_us,
                limit_ms,
            } => {
                index.insert(*seq, calls.len());
                calls.push(Call {
                    kind: *call,
                    lock: *lock,
                    holder: holder.clone(),
                    token: *token,
                    begin_us: *at_us,
                    limit_ms: *limit_ms,
                    end: None,
                });
            }
            WorkerEvent::End {
                seq,
                at_us,
                outcome,
            } => {
                if let Some(&i) = index.get(seq) {
                    calls[i].end = Some((*at_us, outcome.clone()));
                }
            }
            _ => {}
        }
    }
    calls
}

/// Whether `[begin, end]` overlaps a SIGSTOP of the worker writing `log`
/// (a stopped process's calls look slow without being slow).
fn overlaps_stop(faults: &[FaultRecord], log: &str, begin: u64, end: u64) -> bool {
    faults.iter().any(|f| {
        f.kind == FaultKind::StopHolder
            && f.target.as_deref() == Some(log)
            && f.start_us <= end
            && begin <= f.end_us
    })
}

/// Counts calls that took longer than their limit + 1 s, and calls that
/// never ended in a process that was not killed on purpose.
fn hangs(worker: &WorkerLog, calls: &[Call], faults: &[FaultRecord]) -> Vec<Finding> {
    let mut hangs = Vec::new();
    for call in calls {
        match &call.end {
            Some((end, _)) => {
                let limit = call.begin_us + (call.limit_ms + 1000) * 1000;
                if *end > limit && !overlaps_stop(faults, &worker.exit.log, call.begin_us, *end) {
                    hangs.push(("hangs", call.begin_us));
                }
            }
            None if !worker.exit.killed_by_fault => hangs.push(("hangs", call.begin_us)),
            None => {}
        }
    }
    hangs
}

/// Recovery after each fault: from its end until every lock that had a
/// waiter (an acquire in flight at that moment, or begun before the next
/// fault) saw an acquire succeed.
fn recoveries(
    faults: &[FaultRecord],
    acquires: &[(usize, u64, Option<u64>, bool)],
    run_end_us: u64,
) -> Vec<Recovery> {
    let mut out = Vec::new();
    for (i, fault) in faults.iter().enumerate() {
        let from = fault.end_us;
        let until = faults
            .get(i + 1)
            .map_or(run_end_us, |next| next.start_us)
            .max(from);
        let waiting: HashSet<usize> = acquires
            .iter()
            .filter(|(_, begin, end, _)| {
                (*begin <= from && end.is_none_or(|e| e > from))
                    || (*begin > from && *begin < until)
            })
            .map(|(lock, ..)| *lock)
            .collect();
        let mut worst = Some(0u64);
        for lock in waiting {
            let first = acquires
                .iter()
                .filter(|(l, _, end, ok)| *l == lock && *ok && end.is_some_and(|e| e >= from))
                .filter_map(|(_, _, end, _)| *end)
                .min()
                .filter(|e| *e <= until);
            worst = match (worst, first) {
                (Some(w), Some(e)) => Some(w.max((e - from) / 1000)),
                _ => None,
            };
        }
        out.push(Recovery {
            kind: fault.kind,
            ms: worst,
        });
    }
    out
}

/// Runs every check over the run's logs.
pub fn check(logs: &RunLogs) -> Report {
    let mut report = Report {
        leftovers: logs.leftovers,
        ..Report::default()
    };
    for kind in FaultKind::ALL {
        report.faults_by_kind.insert(kind.name().to_owned(), 0);
    }
    for fault in &logs.faults {
        *report
            .faults_by_kind
            .entry(fault.kind.name().to_owned())
            .or_default() += 1;
    }

    let mut findings: Vec<Finding> = Vec::new();
    for (i, log) in logs.resources.iter().enumerate() {
        let replay = replay_resource(log);
        findings.extend(replay.findings.iter().copied());
        report.writes_applied += log.len() as u64;
        report.stale_accepted += replay.stale_accepted;
        report.equal_token_other_holder += replay.equal_token_other_holder;
        report.lost_updates += replay.lost_updates;
        if logs.counters.get(i).copied().unwrap_or(0) != replay.last_written {
            report.counter_mismatches += 1;
            findings.push(("counter_mismatches", logs.run_end_us));
        }
    }

    let mut grants = Vec::new();
    let mut acquires = Vec::new();
    let mut lost_at: HashMap<String, u64> = HashMap::new();
    let mut applied_ops: Vec<(usize, u64, String, u64)> = Vec::new();
    for worker in &logs.workers {
        let calls = calls_of(&worker.events);
        let hung = hangs(worker, &calls, &logs.faults);
        report.hangs += hung.len() as u64;
        findings.extend(hung);
        for event in &worker.events {
            match event {
                WorkerEvent::Acquired {
                    lock,
                    holder,
                    token,
                    begin_us,
                    at_us,
                } => grants.push(Grant {
                    lock: *lock,
                    holder: holder.clone(),
                    token: *token,
                    begin_us: *begin_us,
                    end_us: *at_us,
                }),
                WorkerEvent::Lost { holder, at_us, .. } => {
                    report.lease_lost_signals += 1;
                    lost_at.entry(holder.clone()).or_insert(*at_us);
                }
                _ => {}
            }
        }
        for call in &calls {
            let outcome = call.end.as_ref().map(|(_, o)| o);
            match (call.kind, outcome) {
                (CallKind::Read, Some(Outcome::Stale { .. })) => report.stale_reads_rejected += 1,
                (CallKind::Write, Some(Outcome::Stale { .. })) => report.stale_writes_rejected += 1,
                (_, Some(Outcome::Error { .. })) => report.call_errors += 1,
                _ => {}
            }
            if call.kind == CallKind::Acquire {
                acquires.push((
                    call.lock,
                    call.begin_us,
                    call.end.as_ref().map(|(e, _)| *e),
                    matches!(outcome, Some(Outcome::Ok)),
                ));
            }
            if matches!(call.kind, CallKind::Read | CallKind::Write)
                && matches!(outcome, Some(Outcome::Ok))
            {
                if let (Some(holder), Some(token)) = (&call.holder, call.token) {
                    applied_ops.push((call.lock, token, holder.clone(), call.begin_us));
                }
            }
        }
        if worker.exit.panicked {
            report.panics += 1;
        }
        let clean = worker.exit.killed_by_fault || worker.exit.code == Some(0);
        if !clean || worker.exit.killed_at_shutdown {
            report.bad_exits += 1;
        }
        report.eviction_warning_seen |= worker.exit.eviction_warning;
    }
    report.acquisitions = grants.len() as u64;
    let (twice, backwards, grant_findings) = check_grants(&grants);
    report.tokens_granted_twice = twice;
    report.tokens_backwards = backwards;
    findings.extend(grant_findings);

    for (lock, token, holder, begin) in &applied_ops {
        let superseded = grants
            .iter()
            .any(|g| g.lock == *lock && g.token > *token && g.end_us < *begin);
        let told = lost_at.get(holder).is_some_and(|at| at <= begin);
        if superseded && !told {
            report.acted_after_lease_untold += 1;
        }
    }

    report.recoveries = recoveries(&logs.faults, &acquires, logs.run_end_us);
    report.longest_recovery_ms = report.recoveries.iter().filter_map(|r| r.ms).max();
    report.unrecovered = report.recoveries.iter().filter(|r| r.ms.is_none()).count() as u64;
    report.slow_recoveries = report
        .recoveries
        .iter()
        .filter(|r| r.ms.is_some_and(|ms| ms * 1000 > logs.recovery_bound_us))
        .count() as u64;
    for (fault, recovery) in logs.faults.iter().zip(&report.recoveries) {
        if recovery.ms.is_none() {
            findings.push(("unrecovered", fault.start_us));
        }
    }
    report.findings_by_fault = attribute(&findings, &logs.faults);
    findings.sort_by_key(|(_, at)| *at);
    for (name, at) in &findings {
        report
            .first_finding
            .entry((*name).to_owned())
            .or_insert_with(|| match latest_fault_before(&logs.faults, *at) {
                Some(f) => format!(
                    "{} +{:.1}s",
                    f.kind.name(),
                    at.saturating_sub(f.start_us) as f64 / 1e6
                ),
                None => "before any fault".to_owned(),
            });
    }
    report
}

fn latest_fault_before(faults: &[FaultRecord], at: u64) -> Option<&FaultRecord> {
    faults
        .iter()
        .filter(|f| f.start_us <= at)
        .max_by_key(|f| f.start_us)
}

/// Groups findings by the latest fault that started before each.
fn attribute(
    findings: &[Finding],
    faults: &[FaultRecord],
) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for (name, at) in findings {
        let fault = latest_fault_before(faults, *at).map_or("none", |f| f.kind.name());
        *out.entry((*name).to_owned())
            .or_default()
            .entry(fault.to_owned())
            .or_default() += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(token: u64, holder: &str, read: i64) -> AppliedWrite {
        AppliedWrite {
            token,
            holder: holder.into(),
            read,
            written: read + 1,
            at_us: 0,
        }
    }

    fn grant(lock: usize, holder: &str, token: u64, begin_us: u64, end_us: u64) -> Grant {
        Grant {
            lock,
            holder: holder.into(),
            token,
            begin_us,
            end_us,
        }
    }

    fn exit(log: &str) -> WorkerExit {
        WorkerExit {
            log: log.into(),
            killed_by_fault: false,
            code: Some(0),
            killed_at_shutdown: false,
            panicked: false,
            eviction_warning: false,
        }
    }

    fn begin(seq: u64, call: CallKind, at_us: u64) -> WorkerEvent {
        WorkerEvent::Begin {
            seq,
            call,
            lock: 0,
            holder: None,
            token: None,
            at_us,
            limit_ms: 1000,
        }
    }

    fn end(seq: u64, at_us: u64) -> WorkerEvent {
        WorkerEvent::End {
            seq,
            at_us,
            outcome: Outcome::Ok,
        }
    }

    fn fault(kind: FaultKind, target: Option<&str>, start_us: u64, end_us: u64) -> FaultRecord {
        FaultRecord {
            kind,
            target: target.map(Into::into),
            start_us,
            end_us,
            detail: String::new(),
        }
    }

    #[test]
    fn a_clean_history_replays_without_findings() {
        let log = [w(1, "a", 0), w(1, "a", 1), w(2, "b", 2), w(5, "c", 3)];
        let replay = replay_resource(&log);
        assert_eq!(
            replay,
            ResourceReplay {
                last_written: 4,
                ..ResourceReplay::default()
            }
        );
    }

    #[test]
    fn a_lower_token_applied_late_is_a_stale_write_accepted() {
        // b (token 2) wrote, then a paused holder with token 1 got through.
        let replay = replay_resource(&[w(1, "a", 0), w(2, "b", 1), w(1, "a", 2)]);
        assert_eq!(replay.stale_accepted, 1);
        assert_eq!(replay.lost_updates, 0);
    }

    #[test]
    fn the_same_token_from_another_holder_is_counted() {
        // After the lock keys were lost, tokens restarted and a new holder
        // reached the token an old one had used.
        let replay = replay_resource(&[w(3, "old", 0), w(3, "new", 1)]);
        assert_eq!(replay.equal_token_other_holder, 1);
        assert_eq!(replay.stale_accepted, 0);
    }

    #[test]
    fn a_write_based_on_an_old_read_is_a_lost_update() {
        // Both read 0; the second write overwrote the first one's 1.
        let replay = replay_resource(&[w(1, "a", 0), w(2, "b", 0)]);
        assert_eq!(replay.lost_updates, 1);
        assert_eq!(replay.last_written, 1);
    }

    #[test]
    fn tokens_granted_twice_are_counted_per_lock() {
        let grants = [
            grant(0, "a", 7, 0, 10),
            grant(0, "b", 7, 20, 30),
            grant(1, "c", 7, 0, 10), // Another lock may reuse the number.
        ];
        let (twice, _, findings) = check_grants(&grants);
        assert_eq!(twice, 1);
        assert!(
            findings.contains(&("tokens_granted_twice", 30)),
            "{findings:?}"
        );
    }

    #[test]
    fn a_token_below_an_earlier_returned_grant_goes_backwards() {
        // "b" asked after "a" had its token 9 and still got 1 (the keys were
        // lost and the counter restarted).
        let grants = [grant(0, "a", 9, 0, 10), grant(0, "b", 1, 20, 30)];
        assert_eq!(
            check_grants(&grants),
            (0, 1, vec![("tokens_backwards", 20)])
        );
    }

    #[test]
    fn overlapping_acquire_calls_do_not_fake_backwards_tokens() {
        // "b" was asked before "a" returned: their order is unknown, so a
        // lower token for "b" proves nothing (a log line may be late).
        let grants = [grant(0, "a", 9, 0, 50), grant(0, "b", 5, 20, 30)];
        assert_eq!(check_grants(&grants), (0, 0, vec![]));
    }

    #[test]
    fn a_slow_call_is_a_hang_unless_its_process_was_stopped() {
        let events = vec![
            begin(1, CallKind::Read, 0),
            end(1, 3_000_000), // limit 1 s + 1 s grace: a hang
            begin(2, CallKind::Read, 10_000_000),
            end(2, 14_000_000), // during a SIGSTOP: not a hang
            begin(3, CallKind::Release, 20_000_000),
            end(3, 21_500_000),                    // within limit + 1 s
            begin(4, CallKind::Write, 30_000_000), // never ended
        ];
        let worker = WorkerLog {
            events,
            exit: exit("w0"),
        };
        let faults = [fault(
            FaultKind::StopHolder,
            Some("w0"),
            11_000_000,
            13_000_000,
        )];
        let calls = calls_of(&worker.events);
        assert_eq!(
            hangs(&worker, &calls, &faults),
            [("hangs", 0), ("hangs", 30_000_000)]
        );
        let killed = WorkerLog {
            exit: WorkerExit {
                killed_by_fault: true,
                ..exit("w0")
            },
            ..worker
        };
        assert_eq!(hangs(&killed, &calls, &faults), [("hangs", 0)]);
    }

    #[test]
    fn recovery_is_measured_until_every_waited_lock_is_granted() {
        let acquires = [
            // Lock 0: waiting at the fault's end (2 s), granted at 3 s.
            (0, 1_000_000, Some(3_000_000), true),
            // Lock 1: asked at 2.5 s, failed, asked again, granted at 4.2 s.
            (1, 2_500_000, Some(2_600_000), false),
            (1, 2_700_000, Some(4_200_000), true),
            // Lock 2: nobody waited.
        ];
        let faults = [
            fault(FaultKind::ScriptFlush, None, 1_500_000, 2_000_000),
            fault(FaultKind::ScriptFlush, None, 10_000_000, 10_000_000),
        ];
        let got = recoveries(&faults, &acquires, 20_000_000);
        assert_eq!(got[0].ms, Some(2_200));
        // Nobody waited after the second fault.
        assert_eq!(got[1].ms, Some(0));
        // A waiter that is never granted before the next fault: no recovery.
        let stuck = [(0, 1_000_000, None, false)];
        assert_eq!(recoveries(&faults, &stuck, 20_000_000)[0].ms, None);
    }

    #[test]
    fn check_combines_the_counts_and_decides_pass_or_fail() {
        let worker = WorkerLog {
            events: vec![
                WorkerEvent::Acquired {
                    lock: 0,
                    holder: "a".into(),
                    token: 1,
                    begin_us: 0,
                    at_us: 10,
                },
                WorkerEvent::Begin {
                    seq: 1,
                    call: CallKind::Write,
                    lock: 0,
                    holder: Some("a".into()),
                    token: Some(1),
                    at_us: 100,
                    limit_ms: 1000,
                },
                WorkerEvent::End {
                    seq: 1,
                    at_us: 200,
                    outcome: Outcome::Ok,
                },
                WorkerEvent::Acquired {
                    lock: 0,
                    holder: "b".into(),
                    token: 2,
                    begin_us: 20,
                    at_us: 50,
                },
                WorkerEvent::Begin {
                    seq: 2,
                    call: CallKind::Write,
                    lock: 0,
                    holder: Some("b".into()),
                    token: Some(2),
                    at_us: 300,
                    limit_ms: 1000,
                },
                WorkerEvent::End {
                    seq: 2,
                    at_us: 400,
                    outcome: Outcome::Stale { newest: 3 },
                },
            ],
            exit: exit("w0"),
        };
        let mut logs = RunLogs {
            workers: vec![worker],
            resources: vec![vec![w(1, "a", 0)]],
            counters: vec![1],
            run_end_us: 1_000,
            recovery_bound_us: 5_000_000,
            ..RunLogs::default()
        };
        let report = check(&logs);
        assert_eq!(report.acquisitions, 2);
        assert_eq!(report.stale_writes_rejected, 1);
        // "a" wrote at 100 us after "b" (token 2) had returned at 50 us.
        assert_eq!(report.acted_after_lease_untold, 1);
        assert!(report.passed(), "{report:?}");

        logs.counters = vec![5];
        logs.leftovers.queue_entries = 2;
        logs.leftovers.keys_without_ttl = 1;
        logs.faults = vec![fault(FaultKind::RestartNoPersistence, None, 5, 6)];
        let report = check(&logs);
        assert_eq!(report.counter_mismatches, 1);
        assert_eq!(
            report.findings_by_fault["counter_mismatches"]["restart_no_persistence"],
            1
        );
        assert!(!report.passed());
    }

    /// A recovery that never came fails the run; a slow one is reported
    /// and does not (a wall-clock figure of a loaded machine).
    #[test]
    fn only_a_recovery_that_never_came_fails_the_run() {
        let asked = |at_us, limit_ms| WorkerEvent::Begin {
            seq: 1,
            call: CallKind::Acquire,
            lock: 0,
            holder: None,
            token: None,
            at_us,
            limit_ms,
        };
        let logs = |events| RunLogs {
            workers: vec![WorkerLog {
                events,
                exit: exit("w0"),
            }],
            run_end_us: 60_000_000,
            recovery_bound_us: 5_000_000,
            faults: vec![fault(FaultKind::ScriptFlush, None, 1_000_000, 2_000_000)],
            ..RunLogs::default()
        };
        // Waiting from 1.5 s, granted at 9 s: 7 s after the fault's end.
        let slow = check(&logs(vec![
            asked(1_500_000, 10_000),
            WorkerEvent::End {
                seq: 1,
                at_us: 9_000_000,
                outcome: Outcome::Ok,
            },
        ]));
        assert_eq!((slow.unrecovered, slow.slow_recoveries), (0, 1));
        assert!(slow.passed(), "{slow:?}");
        // Waiting from 1.5 s, never granted.
        let stuck = logs(vec![asked(1_500_000, 10_000)]);
        let stuck = check(&stuck);
        assert_eq!(stuck.unrecovered, 1, "{stuck:?}");
        assert!(!stuck.passed());
    }
}
