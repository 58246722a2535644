//! The run's summary, as text for people and as `summary.json` for the CI
//! test, which asserts the zeros from it.

use std::fmt::Write as _;
use std::path::Path;

use crate::config::{RunConfig, LEASE, RECOVERY_BOUND, WAITER_TIMEOUT};
use crate::runner::RunResult;

/// The first line: what is about to run, and where its files go.
pub fn header(config: &RunConfig, out: &Path) -> String {
    format!(
        "fairlock-chaos: seed {}, {} workers, {} locks, {} s of faults + {} s quiet, lease {:?}, waiter timeout {:?}; logs in {}",
        config.seed,
        config.workers,
        config.locks,
        config.fault_phase.as_secs(),
        config.quiet_phase.as_secs(),
        LEASE,
        WAITER_TIMEOUT,
        out.display()
    )
}

/// The summary printed at the end.
pub fn render(result: &RunResult) -> String {
    let r = &result.report;
    let mut out = String::new();
    let faults: Vec<String> = r
        .faults_by_kind
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    let _ = writeln!(out, "faults by kind: {}", faults.join(", "));
    for (fault, recovery) in result.faults.iter().zip(&r.recoveries) {
        let ms = recovery
            .ms
            .map_or_else(|| "not recovered".to_owned(), |ms| format!("{ms} ms"));
        let _ = writeln!(out, "  {:<24} recovery {ms}", fault.kind.name());
    }
    let _ = writeln!(
        out,
        "acquisitions {}, writes applied {}, stale reads rejected {}, stale writes rejected {}, other call errors {}, lease-lost signals {}",
        r.acquisitions,
        r.writes_applied,
        r.stale_reads_rejected,
        r.stale_writes_rejected,
        r.call_errors,
        r.lease_lost_signals
    );
    let _ = writeln!(
        out,
        "longest recovery {}; {} over {} ms (informational)",
        r.longest_recovery_ms
            .map_or_else(|| "n/a".to_owned(), |ms| format!("{ms} ms")),
        r.slow_recoveries,
        RECOVERY_BOUND.as_millis()
    );
    let _ = writeln!(
        out,
        "holders acting after their lease ended, untold (informational): {}",
        r.acted_after_lease_untold
    );
    let _ = writeln!(
        out,
        "eviction-policy warning in a worker's log: {}",
        if r.eviction_warning_seen { "yes" } else { "no" }
    );
    let _ = writeln!(out, "must be zero:");
    for (name, n) in r.must_be_zero() {
        let after = r
            .findings_by_fault
            .get(name)
            .map(|by| {
                let parts: Vec<String> = by.iter().map(|(k, n)| format!("{k} {n}")).collect();
                let first = r.first_finding.get(name).cloned().unwrap_or_default();
                format!("  (first: {first}; after: {})", parts.join(", "))
            })
            .unwrap_or_default();
        let _ = writeln!(out, "  {name:<26} {n}{after}");
    }
    if !result.keys_without_ttl.is_empty() {
        let _ = writeln!(
            out,
            "keys without a TTL on the lock server: {}",
            result.keys_without_ttl.join(" ")
        );
    }
    let _ = write!(
        out,
        "{}",
        if r.passed() {
            "PASS"
        } else {
            "FAIL: a must-be-zero count is not zero"
        }
    );
    out
}

/// Writes the configuration, the faults and the report as JSON.
pub fn write_json(config: &RunConfig, result: &RunResult, path: &Path) -> Result<(), String> {
    let value = serde_json::json!({
        "seed": config.seed,
        "workers": config.workers,
        "locks": config.locks,
        "fault_phase_secs": config.fault_phase.as_secs(),
        "passed": result.report.passed(),
        "must_be_zero": result.report.must_be_zero().into_iter().collect::<std::collections::BTreeMap<_, _>>(),
        "report": result.report,
        "faults": result.faults,
        "keys_without_ttl": result.keys_without_ttl,
    });
    let text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
