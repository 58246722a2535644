//! The alert rules of `dashboards/alerts.yml` with the real `promtool`:
//! the file is valid (`promtool check rules`) and each alert fires, and
//! stays quiet, exactly where `dashboards/alerts_test.yml` says
//! (`promtool test rules`, synthetic series, one test per alert).
//! Without the `prometheus` package (not root, no apt-get) the test prints
//! why and skips.

use std::path::PathBuf;
use std::process::Output;

use fairlock_testkit::{ensure_prometheus, PrometheusError};

/// The alerts `alerts_test.yml` must cover, one test each.
const ALERTS: [&str; 7] = [
    "FairlockLockHeldTooLong",
    "FairlockWaitersPilingUp",
    "FairlockLeaseLost",
    "FairlockHeartbeatsStopped",
    "FairlockProcessGone",
    "FairlockAcquireErrors",
    "FairlockWaitTimeoutsHigh",
];

fn report(output: &Output) -> String {
    format!(
        "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn promtool_checks_the_alert_rules_and_passes_their_unit_tests() {
    let bins = match ensure_prometheus() {
        Ok(bins) => bins,
        Err(PrometheusError::NotInstalled(why)) => {
            fairlock_tests::skip("alert_rules", &why);
            return;
        }
        Err(error) => panic!("{error}"),
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dashboards");

    let check = bins
        .promtool(&dir, &["check", "rules", "alerts.yml"])
        .expect("run promtool");
    assert!(check.status.success(), "{}", report(&check));
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(
        stdout.contains(&format!("SUCCESS: {} rules found", ALERTS.len())),
        "{stdout}"
    );

    // Every alert in the rules has its own test case (and the rules hold
    // no alert this list lacks: the count above).
    let rules = std::fs::read_to_string(dir.join("alerts.yml")).expect("alerts.yml");
    let tests = std::fs::read_to_string(dir.join("alerts_test.yml")).expect("alerts_test.yml");
    for alert in ALERTS {
        assert!(
            rules.contains(&format!("- alert: {alert}\n")),
            "{alert} not in alerts.yml"
        );
        assert!(
            tests.contains(&format!("- name: {alert}\n")),
            "no test case for {alert}"
        );
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} never evaluated"
        );
    }

    let test = bins
        .promtool(&dir, &["test", "rules", "alerts_test.yml"])
        .expect("run promtool");
    assert!(test.status.success(), "{}", report(&test));
}
