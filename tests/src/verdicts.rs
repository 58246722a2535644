//! Verdicts shared by several test files: a seckill swarm's checks, and a
//! waiter whose entry was lost granted before a later caller.

/// Asserts that a seckill swarm run passed every one of its checks (sold =
/// min(stock, attempts), stock never negative, one order per sale...).
pub fn assert_swarm_passed(report: &fairlock_examples::seckill::Report) {
    let failed: Vec<String> = report
        .checks()
        .into_iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    assert!(
        failed.is_empty(),
        "{:?} run failed: {failed:#?}",
        report.variant
    );
}

/// The lost-entry tests' verdict: B (whose entry alone was removed) was
/// queued again within 10 heartbeats (`back`), and with `tokens` of A, B
/// and the newcomer C, granted after A and before C.
pub fn assert_queued_again_before_the_newcomer(back: bool, tokens: [u64; 3]) {
    let [a, b, c] = tokens;
    let grants = format!("grants: A {a}, B {b}, C {c}");
    assert!(
        back,
        "B was not queued again within 10 heartbeats of its process; {grants}"
    );
    assert!(
        a < b && b < c,
        "B came back before C arrived, so it goes before C; {grants}"
    );
}
