//! RedLock records the same metrics as `LockClient`, so that the same
//! dashboard and alerts cover it: each acquire counted once as the outcome
//! its caller saw (with its wait), a hold sample per release or dropped
//! guard, renewals per lock by result, and each lost lease once.
//!
//! Each test records into a recorder of its own, set as the default of
//! its thread; the tests run on a current-thread runtime, so every task of
//! the client (watchdogs, releases of dropped guards) records there. The
//! primaries are real redis-servers started by the test kit. Counts and
//! invariants only: no assertion on how long anything took.

use std::time::{Duration, Instant};

use fairlock::redlock::{RedLockConfig, RedLockOptions};
use fairlock::Error;
use fairlock_metrics::{
    ACQUIRE_TOTAL, HOLD_SECONDS, LEASE_LOST_TOTAL, LEASE_RENEWALS_TOTAL, WAIT_SECONDS,
};
use fairlock_testkit::IndependentPrimaries;
use fairlock_tests::local_metrics::LocalMetrics;

/// A hang guard for waits that must end on their own.
const HANG: Duration = Duration::from_secs(20);

/// What these tests read from their [`LocalMetrics`].
trait Counts {
    fn acquires(&self, outcome: &str) -> f64;
    fn waits(&self, outcome: &str) -> f64;
    fn renewals(&self, result: &str) -> f64;
    fn holds(&self) -> f64;
    fn leases_lost(&self) -> f64;
    fn has_line(&self, line: &str) -> bool;
    async fn settle(&self, done: impl Fn(&Self) -> bool);
}

impl Counts for LocalMetrics {
    /// `fairlock_acquire_total{outcome}`.
    fn acquires(&self, outcome: &str) -> f64 {
        self.value(ACQUIRE_TOTAL, &[("outcome", outcome)])
    }

    /// The number of waits sampled for `outcome`.
    fn waits(&self, outcome: &str) -> f64 {
        self.value(&format!("{WAIT_SECONDS}_count"), &[("outcome", outcome)])
    }

    /// `fairlock_lease_renewals_total{result}`.
    fn renewals(&self, result: &str) -> f64 {
        self.value(LEASE_RENEWALS_TOTAL, &[("result", result)])
    }

    /// Hold samples.
    fn holds(&self) -> f64 {
        self.value(&format!("{HOLD_SECONDS}_count"), &[])
    }

    /// Lost leases.
    fn leases_lost(&self) -> f64 {
        self.value(LEASE_LOST_TOTAL, &[])
    }

    /// Whether the rendered text has a line that is exactly `line`.
    fn has_line(&self, line: &str) -> bool {
        self.handle().render().lines().any(|l| l == line)
    }

    /// Waits (yielding to the client's tasks) until `done` holds or the
    /// hang guard runs out; the caller asserts afterwards.
    async fn settle(&self, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + HANG;
        while !done(self) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn primaries(n: usize) -> IndependentPrimaries {
    IndependentPrimaries::start(n).expect("start independent primaries")
}

fn config(primaries: &IndependentPrimaries) -> RedLockConfig {
    fairlock_tests::redlock_config(primaries.urls())
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HANG, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {HANG:?}"))
}

/// Every way an acquire can end on a healthy set of primaries is counted
/// once, as the outcome its caller saw, with one wait sample per count:
/// a grant, a busy `try_lock`, a wait timeout, a `lock` future dropped
/// mid-wait; calls refused before any primary is touched are not
/// counted. A released guard and a dropped one each leave a hold sample.
/// The counters the lease alert watches exist at 0 once a client is up.
#[tokio::test]
async fn each_acquire_is_counted_once_as_its_outcome_with_its_wait() {
    let metrics = LocalMetrics::install();
    let servers = primaries(3);
    let a = fairlock_tests::redlock_connect(config(&servers)).await;
    let b = fairlock_tests::redlock_connect(config(&servers)).await;
    assert!(
        metrics.has_line(&format!("{LEASE_LOST_TOTAL} 0")),
        "the lost-lease counter exists at 0 from the start:\n{}",
        metrics.handle().render()
    );
    assert!(
        metrics.has_line(&format!("{LEASE_RENEWALS_TOTAL}{{result=\"lost\"}} 0")),
        "the lost-renewal counter exists at 0 from the start:\n{}",
        metrics.handle().render()
    );

    let held = within("lock", a.lock("x")).await.expect("lock");
    let busy = within("try_lock", b.try_lock("x")).await.expect("answers");
    assert!(busy.is_none(), "try_lock found the lock held");
    let short = RedLockOptions::new().wait_timeout(Duration::from_millis(300));
    let timed_out = within("a wait with a timeout", b.lock_with("x", short)).await;
    assert!(
        matches!(timed_out, Err(Error::WaitTimeout { .. })),
        "{timed_out:?}"
    );
    let dropped = tokio::time::timeout(Duration::from_millis(300), b.lock("x")).await;
    assert!(dropped.is_err(), "still waiting when dropped");
    // Refused before any primary is touched: not counted.
    assert!(matches!(b.lock("").await, Err(Error::InvalidName(_))));
    let too_long = RedLockOptions::new().lease(Duration::from_secs(3600));
    assert!(matches!(
        b.lock_with("x", too_long).await,
        Err(Error::InvalidOptions(_))
    ));

    within("release", held.release()).await.expect("release");
    let again = within(
        "lock after the release",
        b.lock_with("x", RedLockOptions::new().wait_timeout(HANG)),
    )
    .await
    .expect("lock after the release");
    // Released in the background: its hold is sampled there.
    drop(again);
    metrics.settle(|m| m.holds() >= 2.0).await;

    let counted: Vec<(&str, f64, f64)> = ["acquired", "busy", "timeout", "cancelled", "error"]
        .into_iter()
        .map(|outcome| (outcome, metrics.acquires(outcome), metrics.waits(outcome)))
        .collect();
    assert_eq!(
        counted,
        vec![
            ("acquired", 2.0, 2.0),
            ("busy", 1.0, 1.0),
            ("timeout", 1.0, 1.0),
            ("cancelled", 1.0, 1.0),
            ("error", 0.0, 0.0),
        ],
        "(outcome, acquire count, wait samples)"
    );
    assert_eq!(
        metrics.value(ACQUIRE_TOTAL, &[]),
        5.0,
        "nothing else counted"
    );
    assert_eq!(
        metrics.holds(),
        2.0,
        "one hold sample per release and per dropped guard"
    );
    assert_eq!(metrics.leases_lost(), 0.0);
    a.close().await;
    b.close().await;
}

/// With a majority of primaries dead, `lock` and `try_lock` fail with
/// `NoQuorum`, each counted as an `error`. The holder's renewals fail
/// (`error`, not `lost`: nobody refused them), its lost signal fires and
/// is counted once, and its release (also `NoQuorum`) still samples the
/// hold.
#[tokio::test]
async fn no_quorum_is_an_error_and_a_lease_that_ran_out_is_lost_once() {
    let metrics = LocalMetrics::install();
    let mut servers = primaries(3);
    let redlock = fairlock_tests::redlock_connect(config(&servers)).await;
    let held = within("lock", redlock.lock("report")).await.expect("lock");
    servers.kill(&[0, 2]);

    let tried = within("try_lock", redlock.try_lock("other")).await;
    assert!(matches!(tried, Err(Error::NoQuorum { .. })), "{tried:?}");
    let locked = within("lock", redlock.lock("report")).await;
    assert!(matches!(locked, Err(Error::NoQuorum { .. })), "{locked:?}");

    within("the lease-lost signal", held.lost()).await;
    assert!(held.is_lost());
    let released = within("release", held.release()).await;
    assert!(
        matches!(released, Err(Error::NoQuorum { .. })),
        "{released:?}"
    );

    assert_eq!(metrics.acquires("error"), 2.0);
    assert_eq!(metrics.waits("error"), 2.0);
    assert_eq!(metrics.acquires("acquired"), 1.0);
    assert_eq!(metrics.value(ACQUIRE_TOTAL, &[]), 3.0);
    assert!(
        metrics.renewals("error") >= 1.0,
        "the renewals with a majority dead failed: {}",
        metrics.renewals("error")
    );
    assert_eq!(metrics.renewals("lost"), 0.0, "nobody refused a renewal");
    assert_eq!(metrics.leases_lost(), 1.0, "the lease is lost once");
    assert_eq!(metrics.holds(), 1.0, "the release sampled the hold");
    redlock.close().await;
}

/// Watchdog renewals are counted per lock (`renewed`); a lock taken by
/// another owner on every primary is a `lost` renewal and a lost lease,
/// a fixed lease that runs out is a lost lease only; the releases that
/// follow count no loss again, and each samples its hold.
#[tokio::test]
async fn renewals_are_counted_per_lock_and_each_lost_lease_once() {
    let metrics = LocalMetrics::install();
    let servers = primaries(3);
    let redlock = fairlock_tests::redlock_connect(config(&servers)).await;
    let watched = within("lock", redlock.lock("watched")).await.expect("lock");
    let kept = within("lock", redlock.lock("kept")).await.expect("lock");
    let fixed = within(
        "lock",
        redlock.lock_with(
            "fixed",
            RedLockOptions::new().lease(Duration::from_millis(1_500)),
        ),
    )
    .await
    .expect("lock");
    // The watchdog renews each lock every second (a 3 s lease).
    metrics.settle(|m| m.renewals("renewed") >= 4.0).await;
    assert!(
        metrics.renewals("renewed") >= 4.0,
        "two watchdog locks renewed twice each: {}",
        metrics.renewals("renewed")
    );

    // Another owner id on every primary: the next renewal round is
    // refused by all of them.
    for server in servers.servers() {
        server
            .cmd_ok(&[
                "SET",
                "fairlock:redlock:{watched}:owner",
                "0123456789abcdef0123456789abcdef",
                "PX",
                "60000",
            ])
            .expect("SET another owner");
    }
    within("the taken lock's lost signal", watched.lost()).await;
    within("the fixed lease's end", fixed.lost()).await;
    assert_eq!(
        metrics.renewals("lost"),
        1.0,
        "one renewal found the lock taken"
    );
    assert_eq!(metrics.leases_lost(), 2.0, "two leases lost");

    let refused = within("release", watched.release()).await;
    assert!(
        matches!(refused, Err(Error::NotOwner { .. })),
        "{refused:?}"
    );
    // Its keys expire a little after its validity ended (the drift
    // allowance): once they have, its release frees nothing.
    within("the fixed lease's keys to expire", async {
        while servers.servers().iter().any(|server| {
            server
                .cmd(&["EXISTS", "fairlock:redlock:{fixed}:owner"])
                .ok()
                .and_then(|reply| reply.as_int())
                != Some(0)
        }) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let late = within("release", fixed.release()).await;
    assert!(matches!(late, Err(Error::NotOwner { .. })), "{late:?}");
    within("release", kept.release()).await.expect("release");
    assert_eq!(metrics.leases_lost(), 2.0, "no loss counted twice");
    assert_eq!(metrics.renewals("lost"), 1.0, "only the taken lock's");
    assert_eq!(metrics.holds(), 3.0, "one hold sample per release");
    assert_eq!(metrics.acquires("acquired"), 3.0);
    redlock.close().await;
}

/// Waiters of a client closed under them end with `Error::Closed` (not
/// `NoQuorum` once their connections are gone), each counted as
/// `cancelled`, as `LockClient::shutdown` does; an acquire on the closed
/// client is refused the same way. A guard the closed client still holds
/// runs out its lease, as `LockClient`'s do after `shutdown()`, without
/// counting failed renewals or a lost lease (a deploy that closes its
/// client must not page).
#[tokio::test]
async fn waiters_of_a_closed_client_are_counted_as_cancelled() {
    const WAITERS: usize = 3;
    let metrics = LocalMetrics::install();
    let servers = primaries(3);
    let holder = fairlock_tests::redlock_connect(config(&servers)).await;
    let waiting = fairlock_tests::redlock_connect(config(&servers)).await;
    let held = within("lock", holder.lock("x")).await.expect("lock");
    let kept = within("lock", waiting.lock("kept")).await.expect("lock");
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let waiting = waiting.clone();
            tokio::spawn(async move { waiting.lock("x").await.map(drop) })
        })
        .collect();
    // Waiting: the client subscribed to the lock's release notices.
    let deadline = Instant::now() + HANG;
    while !servers.servers().iter().all(|s| {
        s.cmd(&["PUBSUB", "NUMSUB", "fairlock:redlock:{x}:released"])
            .ok()
            .and_then(|r| r.as_array().and_then(|a| a.get(1)).and_then(|n| n.as_int()))
            == Some(1)
    }) {
        assert!(Instant::now() < deadline, "the waiters never subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    waiting.close().await;
    for task in tasks {
        let ended = within("a waiter of the closed client", task)
            .await
            .expect("waiter task");
        assert!(matches!(ended, Err(Error::Closed)), "{ended:?}");
    }
    let after = within("lock on the closed client", waiting.lock("y")).await;
    assert!(matches!(after, Err(Error::Closed)), "{after:?}");
    assert_eq!(metrics.acquires("cancelled"), WAITERS as f64 + 1.0);
    assert_eq!(metrics.acquires("error"), 0.0);
    within("the closed client's lease to end", kept.lost()).await;
    assert!(kept.is_lost());
    drop(kept);
    assert_eq!(
        (metrics.renewals("error"), metrics.renewals("lost")),
        (0.0, 0.0),
        "no renewal of the closed client counted as failed"
    );
    assert_eq!(metrics.leases_lost(), 0.0, "a closed client loses no lease");
    within("release", held.release()).await.expect("release");
    holder.close().await;
}

/// With `metrics_lock_label`, RedLock's series about a lock carry its
/// `lock` label as `LockClient`'s do, and the lock's lost-lease counter
/// exists at 0 from its first grant (so its first loss is an increase).
#[tokio::test]
async fn a_lock_label_names_the_lock_in_its_series() {
    let metrics = LocalMetrics::install();
    let servers = primaries(3);
    let redlock = fairlock_tests::redlock_connect(
        config(&servers).metrics_lock_label(fairlock::MetricsLockLabel::Name),
    )
    .await;
    let guard = within("lock", redlock.lock("report")).await.expect("lock");
    within("release", guard.release()).await.expect("release");
    assert!(
        metrics.has_line(&format!("{LEASE_LOST_TOTAL}{{lock=\"report\"}} 0")),
        "{}",
        metrics.handle().render()
    );
    let labelled = [("lock", "report"), ("outcome", "acquired")];
    assert_eq!(metrics.value(ACQUIRE_TOTAL, &labelled), 1.0);
    assert_eq!(
        metrics.value(&format!("{WAIT_SECONDS}_count"), &labelled),
        1.0
    );
    assert_eq!(
        metrics.value(&format!("{HOLD_SECONDS}_count"), &[("lock", "report")]),
        1.0
    );
    assert_eq!(
        metrics.value(ACQUIRE_TOTAL, &[]),
        1.0,
        "no unlabelled acquire series"
    );
    redlock.close().await;
}
