//! How each way an acquire can end is counted: the outcome a dashboard
//! shows must be the one the caller saw, also on the paths off the happy
//! one (a caller's own timeout during the cleanup, a grant the replicas
//! did not acknowledge, a client shut down under its waiters).
//!
//! Each test records into a recorder of its own (`LocalMetrics`), set as the default of
//! its thread; the tests run on a current-thread runtime, so every task
//! of the client (cleanups included) records there.

use std::time::Duration;

use fairlock::{Error, LockClient, LockOptions};
use fairlock_metrics::{
    ACQUIRE_TOTAL, HANDOFF_TOTAL, HOLD_SECONDS, LEASE_LOST_TOTAL, LEASE_RENEWALS_TOTAL,
    WAITERS_EVICTED_TOTAL, WAIT_RECHECK_TOTAL, WAIT_SECONDS,
};
use fairlock_tests::local_metrics::LocalMetrics;
use fairlock_tests::*;

/// A wait timeout whose cleanup (the cancel, awaited) is cut short by the
/// caller's own timeout is still counted as a timeout, with its wait.
#[tokio::test]
async fn a_timeout_cut_short_during_its_cancel_is_still_counted() {
    let metrics = LocalMetrics::install();
    let server = server();
    let a = client(&server).await;
    let b = client(&server).await;
    let _holder = a.lock("x").await.expect("holder");
    // The wait times out at 2 s, the caller's own timeout fires at 3 s,
    // and writes stall from just after queueing until about 4 s: the
    // cancel that the wait timeout starts cannot finish before the
    // caller gives up (the margins leave a loaded machine 2 s to queue
    // and 1 s for the caller's timeout to fire inside the stall).
    let waiter = tokio::spawn(async move {
        let options = LockOptions::new().wait_timeout(Duration::from_secs(2));
        let waited = tokio::time::timeout(Duration::from_secs(3), b.lock_with("x", options));
        let cut_short = waited.await.is_err();
        (b, cut_short)
    });
    wait_for_queue_len(&a, "x", 1).await;
    server
        .cmd_ok(&["CLIENT", "PAUSE", "4000", "WRITE"])
        .expect("pause writes");
    let (b, cut_short) = waiter.await.expect("waiter task");
    assert!(cut_short, "the caller's timeout fired during the cancel");
    assert_eq!(metrics.value(ACQUIRE_TOTAL, &[("outcome", "timeout")]), 1.0);
    assert_eq!(
        metrics.value(&format!("{WAIT_SECONDS}_count"), &[("outcome", "timeout")]),
        1.0
    );
    assert_eq!(
        metrics.total(ACQUIRE_TOTAL),
        2.0,
        "the holder and the timeout"
    );
    b.shutdown().await;
    a.shutdown().await;
}

/// Nor is it a lost lease when its give-back finds it gone (here its
/// 100 ms lease ran out during the 1 s `WAIT`; after a fail-over, the new
/// primary may never have had it): nobody held it, so no lease-lost page.
#[tokio::test]
async fn an_unacknowledged_grant_found_gone_at_its_give_back_is_no_lost_lease() {
    let metrics = LocalMetrics::install();
    let server = server();
    let mut config = fast_config(&server);
    config.waiter_timeout = Duration::from_secs(3);
    // No watchdog check during the WAIT: the give-back is what is counted.
    config.watchdog_lease = Duration::from_secs(120);
    config.replica_acks = Some(fairlock::ReplicaAcks::new(1, Duration::from_secs(1)));
    let client = LockClient::with_config(config).await.expect("connect");
    let refused = client
        .lock_with("x", LockOptions::new().lease(Duration::from_millis(100)))
        .await;
    assert!(
        matches!(refused, Err(Error::NotReplicated { .. })),
        "{refused:?}"
    );
    client.shutdown().await;
    assert_eq!(metrics.value(ACQUIRE_TOTAL, &[("outcome", "error")]), 1.0);
    assert_eq!(metrics.total(LEASE_LOST_TOTAL), 0.0);
}

/// A grant the replicas did not acknowledge never reached the caller: it
/// is an error, not an acquisition, and no hold is sampled for it.
#[tokio::test]
async fn an_unacknowledged_grant_is_an_error_not_a_hold() {
    let metrics = LocalMetrics::install();
    let server = server();
    let mut config = fast_config(&server);
    config.replica_acks = Some(fairlock::ReplicaAcks::new(1, Duration::from_millis(50)));
    let client = LockClient::with_config(config).await.expect("connect");
    let refused = client.lock("x").await;
    assert!(
        matches!(refused, Err(Error::NotReplicated { .. })),
        "{refused:?}"
    );
    assert_eq!(
        metrics.value(ACQUIRE_TOTAL, &[("outcome", "acquired")]),
        0.0
    );
    assert_eq!(metrics.value(ACQUIRE_TOTAL, &[("outcome", "error")]), 1.0);
    assert_eq!(metrics.total(&format!("{HOLD_SECONDS}_count")), 0.0);
    client.shutdown().await;
}

/// A release that comes after its lease ran out is refused, yet hands the
/// free lock on as a heartbeat would, past dead waiters: what it purged
/// is counted, and the purge goes on until the queue is clean. Before,
/// the refusal carried no purge counts: nothing was counted, and the dead
/// waiters past the script's first batch stayed (nobody here waits, so no
/// heartbeat came for them).
#[tokio::test]
async fn a_refused_release_counts_and_finishes_the_purge_it_began() {
    const DEAD: usize = 200;
    let metrics = LocalMetrics::install();
    let server = server();
    let client = client(&server).await;
    let lease = LockOptions::new().lease(Duration::from_millis(300));
    let holder = client.lock_with("late", lease).await.expect("holder");
    let keys = keys("late");
    plant_dead_waiters(&server, &keys, DEAD);
    wait_for_owner(&server, "late", false).await;
    let refused = holder.release().await;
    assert!(
        matches!(refused, Err(Error::NotOwner { .. })),
        "{refused:?}"
    );
    // Counted once each purge call's reply is back, after Redis ran it.
    within("the dead waiters purged to be counted", async {
        while metrics.total(WAITERS_EVICTED_TOTAL) < DEAD as f64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(metrics.total(WAITERS_EVICTED_TOTAL), DEAD as f64);
    assert_eq!(zcard(&server, keys.queue()), 0, "dead waiters left");
    client.shutdown().await;
}

/// Waiters ended by `shutdown()` were given up by their own side: each
/// is counted as cancelled, and neither as a Redis error nor as a
/// recheck of its wait.
#[tokio::test]
async fn waiters_ended_by_shutdown_are_counted_as_cancelled() {
    const WAITERS: usize = 5;
    let metrics = LocalMetrics::install();
    let server = server();
    let holder = client(&server).await;
    let waiting = client(&server).await;
    let _guard = holder.lock("x").await.expect("holder");
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let waiting = waiting.clone();
            tokio::spawn(async move { waiting.lock("x").await.map(drop) })
        })
        .collect();
    wait_for_queue_len(&holder, "x", WAITERS as u64).await;
    waiting.shutdown().await;
    for task in tasks {
        let ended = task.await.expect("waiter task");
        assert!(matches!(ended, Err(Error::Closed)), "{ended:?}");
    }
    assert_eq!(
        metrics.value(ACQUIRE_TOTAL, &[("outcome", "cancelled")]),
        WAITERS as f64
    );
    assert_eq!(metrics.value(ACQUIRE_TOTAL, &[("outcome", "error")]), 0.0);
    assert_eq!(metrics.total(WAIT_RECHECK_TOTAL), 0.0);
    holder.shutdown().await;
}

/// `fairlock_lease_renewals_total` counts locks, whatever the result: a
/// failed watchdog call for a batch of locks is one failed renewal per
/// lock (it once counted one per batch, so an outage looked like a
/// trickle of errors beside hundreds of renewals).
#[tokio::test]
async fn failed_renewals_are_counted_per_lock() {
    const HELD: usize = 7;
    let metrics = LocalMetrics::install();
    let server = server();
    let mut config = fast_config(&server);
    // The watchdog checks every lock each 100 ms heartbeat (renewing at a
    // third of the 6 s lease); a call stalled longer than 500 ms fails. No
    // lease runs out during the stall (at most 4.5 s after the last
    // renewal), so every failed check covers all the locks.
    config.command_timeout = Duration::from_millis(500);
    config.watchdog_lease = Duration::from_secs(6);
    let client = LockClient::with_config(config).await.expect("connect");
    let mut guards = Vec::new();
    for i in 0..HELD {
        guards.push(client.lock(format!("held-{i}")).await.expect("lock"));
    }
    // Every call stalls for 2.5 s: a few watchdog rounds fail.
    server
        .cmd_ok(&["CLIENT", "PAUSE", "2500", "ALL"])
        .expect("pause");
    let errors = || metrics.value(LEASE_RENEWALS_TOTAL, &[("result", "error")]);
    for _ in 0..600 {
        if errors() > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let errors = errors();
    assert!(
        errors > 0.0 && errors % HELD as f64 == 0.0,
        "{errors} failed renewals for {HELD} locks a round"
    );
    drop(guards);
    client.shutdown().await;
}

/// A watchdog check refused because the client is shutting down is not a
/// failed renewal: `shutdown()` waits for a release still in flight while
/// the watchdog goes on with its rounds, each refused with
/// `Error::Closed`. Before, each counted as `result="error"` (and logged
/// a warning), so every deploy's shutdown showed as a renewal outage.
#[tokio::test]
async fn watchdog_checks_refused_while_shutting_down_are_not_failed_renewals() {
    let metrics = LocalMetrics::install();
    let server = server();
    let (proxy, client) = client_behind_proxy(&server, |_| {}).await;
    let _kept = client.lock("kept").await.expect("lock");
    let dropped = client.lock("dropped").await.expect("lock");
    // The dropped guard's release runs at once; its reply comes 2 s later,
    // and `shutdown()` waits for it (its watchdog checks, on another
    // connection, are answered at once).
    proxy.hold_reply_to(dropped.owner_id(), Duration::from_secs(2));
    drop(dropped);
    within("the release to be sent", async {
        while !proxy.reply_dropped() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    client.shutdown().await;
    assert_eq!(
        metrics.value(LEASE_RENEWALS_TOTAL, &[("result", "error")]),
        0.0
    );
}

/// A guard still held when its client shut down runs out its lease by
/// design (the watchdog has stopped): its holder is told (the lost signal
/// fires), but no lost lease is counted, as `RedLock` does after
/// `close()`. Before, every deploy's shutdown with a guard alive counted a
/// lost lease and paged `FairlockLeaseLost`.
#[tokio::test]
async fn a_lease_that_runs_out_after_shutdown_is_not_counted_lost() {
    let metrics = LocalMetrics::install();
    let server = server();
    let mut config = fast_config(&server);
    config.watchdog_lease = Duration::from_millis(1_500);
    let client = LockClient::with_config(config).await.expect("connect");
    let kept = client.lock("kept").await.expect("lock");
    client.shutdown().await;
    within("the lease to run out", kept.lost()).await;
    assert!(kept.is_lost());
    assert_eq!(metrics.total(LEASE_LOST_TOTAL), 0.0);
}

/// A grant a queued waiter learns of on a re-check (its message reached
/// nobody, the heartbeat found it) is a handoff like one announced by
/// message, for a lock and for a semaphore's permit. Before, a lock's
/// counted (the heartbeat names the holder) and a permit's did not (the
/// permit heartbeat has the waiter re-run its acquire), which inflated the
/// "holders die" alarm (contended minus handoffs) for semaphores.
#[tokio::test]
async fn a_grant_found_by_the_heartbeat_is_a_handoff_for_locks_and_permits() {
    let metrics = LocalMetrics::install();
    let server = server();
    let holder = client(&server).await;
    let waiting = client(&server).await;
    // A lock.
    let held = holder.lock("found").await.expect("lock");
    let waiter = spawn_lock(&waiting, "found");
    wait_for_queue_len(&holder, "found", 1).await;
    let cut_off = cut_off_subscribers(&server);
    held.release().await.expect("release");
    let granted = granted(waiter, "the lock's waiter").await;
    drop(cut_off);
    granted.release().await.expect("release");
    assert_eq!(metrics.total(HANDOFF_TOTAL), 1.0, "the lock's grant");
    // Both clients' grant connections are back before the next cut.
    wait_for_subscribed_connections(&server, 2).await;
    // A permit.
    let semaphore = |client: &LockClient| client.semaphore("found-set", 1).expect("semaphore");
    let permit = semaphore(&holder).acquire().await.expect("permit");
    let waiter = tokio::spawn({
        let semaphore = semaphore(&waiting);
        async move { semaphore.acquire().await }
    });
    let queue = permit_keys("found-set", fairlock_core::PermitFamily::Semaphore);
    wait_for_zcard(&server, queue.queue(), 1).await;
    let cut_off = cut_off_subscribers(&server);
    permit.release().await.expect("release");
    let granted = within("the permit's waiter", waiter)
        .await
        .expect("task")
        .expect("permit");
    drop(cut_off);
    granted.release().await.expect("release");
    assert_eq!(metrics.total(HANDOFF_TOTAL), 2.0, "and the permit's");
    holder.shutdown().await;
    waiting.shutdown().await;
}

/// With a `lock` label, a lock's lost-lease counter exists at 0 from its
/// first grant: Prometheus's `increase()` misses the events already in a
/// series' first sample, so the first lost lease of each lock would never
/// fire `FairlockLeaseLost`.
#[tokio::test]
async fn a_labelled_lock_has_its_lost_lease_counter_from_the_first_grant() {
    let metrics = LocalMetrics::install();
    let server = server();
    let mut config = fast_config(&server);
    config.metrics_lock_label = fairlock::MetricsLockLabel::Name;
    let client = LockClient::with_config(config).await.expect("connect");
    client
        .lock("report")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    let text = metrics.handle().render();
    assert!(
        text.contains(&format!("{LEASE_LOST_TOTAL}{{lock=\"report\"}} 0")),
        "{text}"
    );
    client.shutdown().await;
}

/// `fairlock_lease_renewals_total{result="lost"}` counts the watchdog's
/// own locks that its check found gone; a fixed lease found gone by the
/// same check is a lost lease, not a lost renewal.
#[tokio::test]
async fn a_lost_watchdog_lease_is_a_lost_renewal_and_a_fixed_one_is_not() {
    let metrics = LocalMetrics::install();
    let server = server();
    let client = client(&server).await;
    let watched = client.lock("watched").await.expect("watchdog lock");
    let fixed = client
        .lock_with("fixed", LockOptions::new().lease(Duration::from_secs(60)))
        .await
        .expect("fixed-lease lock");
    // Taken away behind the client's back (no revocation notice): only
    // the watchdog's next check can find out.
    for name in ["watched", "fixed"] {
        server
            .cmd_ok(&["DEL", keys(name).owner()])
            .expect("DEL owner");
    }
    within("the watchdog lock's loss", watched.lost()).await;
    within("the fixed lease's loss", fixed.lost()).await;
    assert_eq!(
        metrics.value(LEASE_RENEWALS_TOTAL, &[("result", "lost")]),
        1.0
    );
    assert_eq!(metrics.total(LEASE_LOST_TOTAL), 2.0);
    client.shutdown().await;
}
