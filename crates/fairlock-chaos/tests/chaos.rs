//! Runs the real `fairlock-chaos` binary in its short (CI) configuration
//! and asserts what the issue asks of it: every fault kind was injected,
//! the workers did real work, and every must-be-zero count is zero (no
//! stale or lost write applied, no token granted twice or going backwards,
//! recovery within lease + waiter timeout + 1 s, nothing left after a clean
//! shutdown, no hang, no panic).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn short_chaos_run_keeps_every_invariant() {
    let out: PathBuf =
        std::env::temp_dir().join(format!("fairlock-chaos-ci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_fairlock-chaos"))
        .args(["--seed", "20261123", "--out"])
        .arg(&out)
        .output()
        .expect("run fairlock-chaos");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let text = std::fs::read_to_string(out.join("summary.json"))
        .unwrap_or_else(|e| panic!("no summary.json ({e}); stdout:\n{stdout}\nstderr:\n{stderr}"));
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    let report = &summary["report"];

    let faults = report["faults_by_kind"].as_object().unwrap();
    assert_eq!(faults.len(), 13, "{stdout}");
    for (kind, n) in faults {
        assert!(
            n.as_u64().unwrap() >= 1,
            "fault {kind} never injected:\n{stdout}"
        );
    }
    assert!(report["acquisitions"].as_u64().unwrap() > 100, "{stdout}");
    assert!(report["writes_applied"].as_u64().unwrap() > 100, "{stdout}");

    let zeros = summary["must_be_zero"].as_object().unwrap();
    assert!(zeros.len() >= 12, "{zeros:?}");
    let failed: Vec<String> = zeros
        .iter()
        .filter(|(_, n)| n.as_u64() != Some(0))
        .map(|(name, n)| format!("{name} = {n}"))
        .collect();
    assert!(
        failed.is_empty(),
        "non-zero: {failed:?}\n{stdout}\nlogs kept in {}",
        out.display()
    );
    assert!(run.status.success(), "{stdout}\n{stderr}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The soak in its CI size (100 waiters on 50 held locks, a few seconds):
/// nobody evicted or lost while alive, every waiter granted in ticket
/// order once the holders release, nothing left after the clean shutdown.
/// The 10-minute run of the issue is `fairlock-chaos soak --long`.
#[test]
fn short_soak_drops_no_live_waiter_and_leaves_nothing() {
    let out: PathBuf =
        std::env::temp_dir().join(format!("fairlock-soak-ci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_fairlock-chaos"))
        .args(["soak", "--out"])
        .arg(&out)
        .output()
        .expect("run fairlock-chaos soak");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let text = std::fs::read_to_string(out.join("soak.json"))
        .unwrap_or_else(|e| panic!("no soak.json ({e}); stdout:\n{stdout}\nstderr:\n{stderr}"));
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();

    let samples = report["samples"].as_array().unwrap();
    assert!(samples.len() >= 2, "{stdout}");
    for sample in samples {
        assert_eq!(sample["evicted"], 0, "{stdout}");
        assert_eq!(sample["leases_lost"], 0, "{stdout}");
        // The background work ran: heartbeats and renewals reached Redis.
        assert!(sample["script_calls"].as_u64().unwrap() > 0, "{stdout}");
    }
    assert_eq!(report["granted"], 100, "{stdout}");
    assert_eq!(report["failed"], 0, "{stdout}");
    assert_eq!(report["out_of_order"], 0, "{stdout}");
    assert_eq!(report["keys_left"], 0, "{stdout}");
    assert!(run.status.success(), "{stdout}\n{stderr}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `--help` prints the usage, and an unknown or misspelled argument is a
/// usage error: neither starts a run. Before, both started the two-minute
/// run (servers, workers, faults) with the argument ignored.
#[test]
fn help_and_unknown_arguments_start_no_run() {
    for (args, code) in [
        (vec!["--help"], 0),
        (vec!["--seed=5"], 2),
        (vec!["--sede", "5"], 2),
        (vec!["soak", "--minute", "1"], 2),
    ] {
        let run = Command::new(env!("CARGO_BIN_EXE_fairlock-chaos"))
            .args(&args)
            .output()
            .expect("run fairlock-chaos");
        assert_eq!(run.status.code(), Some(code), "{args:?}: {run:?}");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(text.contains("usage:"), "{args:?}: {text}");
    }
}
