//! What recording costs when no recorder is installed, the state of every
//! process that uses fairlock without exporting metrics. A measurement,
//! not an assertion, so it is ignored by default; run it in release mode:
//!
//! ```sh
//! cargo test --release -p fairlock-metrics --test no_recorder_cost -- --ignored --nocapture
//! ```
//!
//! No recorder is installed in this test binary (it has no other test).

use std::hint::black_box;
use std::time::Instant;

use fairlock_metrics::{ACQUIRE_TOTAL, CONTENDED_TOTAL, QUEUE_DEPTH, WAIT_SECONDS};

const CALLS: u32 = 10_000_000;

fn time(what: &str, mut record: impl FnMut(u32)) -> f64 {
    // Warm up, then measure.
    for i in 0..CALLS / 10 {
        record(i);
    }
    let started = Instant::now();
    for i in 0..CALLS {
        record(black_box(i));
    }
    let ns = started.elapsed().as_nanos() as f64 / f64::from(CALLS);
    println!("{what:<58} {ns:>6.2} ns/op");
    ns
}

#[test]
#[ignore = "a measurement; run with --release -- --ignored --nocapture"]
fn recording_without_a_recorder() {
    println!("{CALLS} calls each, no recorder installed:");
    time("counter!(CONTENDED_TOTAL).increment(1)", |_| {
        metrics::counter!(CONTENDED_TOTAL).increment(1);
    });
    time(
        "counter!(ACQUIRE_TOTAL, \"outcome\" => \"acquired\").increment(1)",
        |_| {
            metrics::counter!(ACQUIRE_TOTAL, "outcome" => "acquired").increment(1);
        },
    );
    time(
        "histogram!(WAIT_SECONDS, \"outcome\" => ..).record(x)",
        |i| {
            metrics::histogram!(WAIT_SECONDS, "outcome" => "acquired").record(f64::from(i) * 1e-6);
        },
    );
    time("gauge!(QUEUE_DEPTH).set(x)", |i| {
        metrics::gauge!(QUEUE_DEPTH).set(f64::from(i % 64));
    });
    // The client's pattern for a lock's metrics: its optional `lock` label
    // (none by default) is cloned into a Vec with the outcome label, then
    // one counter and one histogram are recorded.
    let lock_labels: Vec<metrics::Label> = Vec::new();
    time(
        "acquire outcome: Vec<Label> built + counter + histogram",
        |i| {
            let mut labels = lock_labels.clone();
            labels.push(metrics::Label::new("outcome", "acquired"));
            metrics::counter!(ACQUIRE_TOTAL, labels.iter()).increment(1);
            metrics::histogram!(WAIT_SECONDS, labels.iter()).record(f64::from(i) * 1e-6);
        },
    );
    let baseline = time("baseline: black_box only", |i| {
        black_box(i);
    });
    println!("(the loop itself costs {baseline:.2} ns/op; subtract it)");
}
