//! The README's demo (`examples/demo.rs`, its swarm in
//! `fairlock_examples::demo`), in a small configuration: its invariants
//! hold, and however it ends it leaves nothing queued or held, which
//! matters when it runs against a shared server (`REDIS_URL`).

use std::time::Duration;

use fairlock_examples::demo::{self, DemoConfig};
use fairlock_tests::*;

fn small() -> DemoConfig {
    DemoConfig {
        clients: 2,
        workers_per_client: 4,
        run_for: Duration::from_millis(600),
        hold: Duration::from_millis(1),
    }
}

/// Nothing of the demo's lock is held or queued in Redis.
fn assert_left_nothing(server: &RedisServer) {
    assert_eq!(owner_in_redis(server, demo::LOCK), None, "no holder left");
    assert_eq!(zcard(server, keys(demo::LOCK).queue()), 0, "no waiter left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_keeps_its_invariants_and_leaves_nothing() {
    let server = server();
    let report = demo::run(&server.url(), small(), std::future::pending())
        .await
        .expect("demo run");
    assert!(!report.interrupted);
    assert!(!report.grants.is_empty());
    assert_eq!(report.lost_updates(), 0);
    assert_eq!(report.overtakes(), 0);
    assert!(report.passed());
    assert!(
        report.grants.iter().any(|g| g.ticket.is_some()),
        "8 workers on one lock queue"
    );
    assert_left_nothing(&server);
}

/// Stopped midway (Ctrl-C in the program), the demo's workers holding or
/// queued for the lock give it up before `run` returns: nothing is left
/// behind. It once exited with the lock held (its watchdog lease kept
/// for 30 s) and its waiters queued. On a one-thread runtime, where the
/// releases of the guards its stop drops run only after the shutdown has
/// begun (they were once refused as `Closed` then).
#[tokio::test]
async fn an_interrupted_demo_leaves_nothing_queued_or_held() {
    let server = server();
    let mut config = small();
    config.run_for = Duration::from_secs(30);
    config.hold = Duration::from_millis(20);
    // Interrupted while workers hold and queue: once the lock has a
    // holder and waiters, and then some more grants.
    let url = server.url();
    let running = async {
        wait_for_owner(&server, demo::LOCK, true).await;
        wait_for_zcard(&server, keys(demo::LOCK).queue(), 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let report = demo::run(&url, config, running).await.expect("demo run");
    assert!(report.interrupted);
    assert!(!report.grants.is_empty(), "the swarm was running");
    assert_left_nothing(&server);
}

/// An unreachable server is an error, not a hang or a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_reports_an_unreachable_server() {
    let server = server();
    let url = server.url();
    drop(server);
    let failed = demo::run(&url, small(), std::future::pending()).await;
    assert!(failed.is_err(), "{failed:?}");
}
