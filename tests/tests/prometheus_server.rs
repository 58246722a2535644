//! fairlock's metrics as an operator sees them: a real `prometheus` server
//! scrapes the exporter of this test process every second while a
//! contended swarm runs against a real redis-server, and PromQL answers
//! must match the swarm's own tallies. Then every panel query of
//! `dashboards/fairlock.json` must run and return data, and the alert
//! rules of `dashboards/alerts.yml`, loaded into the same server, must
//! evaluate without error and fire `FairlockLeaseLost` for the losses the
//! test caused.
//!
//! A metrics recorder is process-global, so this file holds exactly one
//! test. Without the `prometheus` package (not root, no apt-get) the test
//! prints why and skips.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::{Error, LockGuard, LockOptions};
use fairlock_metrics::{CONTENDED_TOTAL, SECONDS_BUCKETS};
use fairlock_testkit::{ensure_prometheus, PromSample, PrometheusError, PrometheusServer};
use fairlock_tests::*;

/// Swarm tasks contending for one lock, and their acquisitions each.
const TASKS: usize = 12;
const ROUNDS: usize = 20;
/// `try_lock` calls and short-timeout waits against a held lock.
const BUSY: usize = 3;
const TIMEOUTS: usize = 2;
/// Fixed leases left to run out before their release.
const EXPIRED_LEASES: usize = 3;
/// Waiters queued one by one in the last phase.
const WAITERS: usize = 5;
/// How long Prometheus gets to scrape the final counts (it scrapes every
/// second).
const SCRAPE_WAIT: Duration = Duration::from_secs(30);

/// What the workload did, counted by the test itself.
#[derive(Default)]
struct Tally {
    /// Wait of every acquired call, seconds, measured around the call.
    waits: Vec<f64>,
    /// Acquired calls that had to queue (their grant has a ticket).
    contended: usize,
}

impl Tally {
    fn acquired(&mut self, guard: &LockGuard, started: Instant) {
        self.waits.push(started.elapsed().as_secs_f64());
        if guard.ticket().is_some() {
            self.contended += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_answers_match_the_swarm_and_every_dashboard_query_has_data() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    if let Err(PrometheusError::NotInstalled(why)) = ensure_prometheus() {
        skip("prometheus_server", &why);
        return;
    }
    let (exporter, metrics) = install_exporter();
    let prometheus = PrometheusServer::builder()
        .target(exporter)
        .rule_file(root.join("dashboards/alerts.yml"))
        .start()
        .expect("start prometheus");
    let started = Instant::now();
    let server = server();
    let clients = clients(&server, 2).await;
    let tally = Arc::new(Mutex::new(Tally::default()));

    // 1. The swarm: TASKS tasks on two clients take one lock ROUNDS times.
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = clients[task % 2].clone();
        let tally = tally.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let t = Instant::now();
                let options = LockOptions::new().wait_timeout(Duration::from_secs(60));
                let guard = client.lock_with("hot", options).await?;
                tally.lock().unwrap().acquired(&guard, t);
                tokio::time::sleep(Duration::from_millis(2)).await;
                guard.release().await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await.expect("swarm task").expect("swarm acquisitions");
    }

    // 2. Failed outcomes against a held lock: busy, timeout, cancelled.
    let (a, b) = (&clients[0], &clients[1]);
    let t = Instant::now();
    let holder = a.lock("held").await.expect("holder");
    tally.lock().unwrap().acquired(&holder, t);
    for _ in 0..BUSY {
        assert!(b.try_lock("held").await.expect("try_lock").is_none());
    }
    for _ in 0..TIMEOUTS {
        let options = LockOptions::new().wait_timeout(Duration::from_millis(200));
        let result = b.lock_with("held", options).await;
        assert!(
            matches!(result, Err(Error::WaitTimeout { .. })),
            "{result:?}"
        );
    }
    let contended_before_cancel = metric_value(&metrics, CONTENDED_TOTAL).unwrap_or(0.0);
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("held").await.map(drop) })
    };
    wait_for_queue_len(a, "held", 1).await;
    // Abort only once the waiter has read its queued reply and counted
    // itself contended: an abort before that drops the reply unread.
    wait_for_metric(&metrics, CONTENDED_TOTAL, contended_before_cancel + 1.0).await;
    waiter.abort();
    assert!(waiter.await.is_err_and(|e| e.is_cancelled()));
    holder.release().await.expect("release");

    // 3. Lease losses: fixed leases that run out, and a watchdog-held lock
    //    taken by force_release.
    for _ in 0..EXPIRED_LEASES {
        let t = Instant::now();
        let options = LockOptions::new().lease(Duration::from_millis(100));
        let guard = a.lock_with("short", options).await.expect("short lease");
        tally.lock().unwrap().acquired(&guard, t);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let late = guard.release().await;
        assert!(matches!(late, Err(Error::NotOwner { .. })), "{late:?}");
    }
    let t = Instant::now();
    let watched = a.lock("watched").await.expect("watched");
    tally.lock().unwrap().acquired(&watched, t);
    assert!(b.force_release("watched").await.expect("force_release"));
    tokio::time::timeout(Duration::from_secs(5), watched.lost())
        .await
        .expect("the watchdog reports the lost lease");
    // Force-released: its release frees nothing, and still samples the
    // hold.
    let late = watched.release().await;
    assert!(
        matches!(late, Err(fairlock::Error::NotOwner { .. })),
        "{late:?}"
    );

    // 4. WAITERS queue one by one behind a holder: the last one to queue
    //    had WAITERS - 1 ahead, and that stays the gauge's value.
    let t = Instant::now();
    let holder = a.lock("queue").await.expect("holder");
    tally.lock().unwrap().acquired(&holder, t);
    let contended_before = metric_value(&metrics, CONTENDED_TOTAL).unwrap_or(0.0);
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = clients[i % 2].clone();
        let tally = tally.clone();
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let guard = client.lock("queue").await?;
            tally.lock().unwrap().acquired(&guard, t);
            guard.release().await
        }));
        wait_for_queue_len(a, "queue", i as u64 + 1).await;
        // Each waiter records its depth before it counts as contended.
        let counted = contended_before + i as f64 + 1.0;
        wait_for_metric(&metrics, CONTENDED_TOTAL, counted).await;
    }
    holder.release().await.expect("release");
    for task in tasks {
        task.await.expect("waiter task").expect("waiter grant");
    }

    let tally = std::mem::take(&mut *tally.lock().unwrap());
    let acquired = tally.waits.len();
    assert_eq!(
        acquired,
        TASKS * ROUNDS + 1 + EXPIRED_LEASES + 1 + 1 + WAITERS
    );
    // Queued calls: the contended grants, the timeouts, the cancelled one.
    let contended = tally.contended + TIMEOUTS + 1;
    let own_p99 = quantile(&tally.waits, 0.99);

    tokio::task::block_in_place(|| {
        // Wait for a scrape that saw the final counts.
        let total = (acquired + BUSY + TIMEOUTS + 1) as f64;
        let last = prometheus
            .query_until("sum(fairlock_acquire_total)", SCRAPE_WAIT, |s| {
                single(s) == Some(total)
            })
            .expect("query");
        assert_eq!(
            single(&last),
            Some(total),
            "Prometheus never saw every acquire call"
        );

        let ask =
            |promql: &str| -> Option<f64> { single(&prometheus.query(promql).expect(promql)) };

        // Acquisitions by outcome, exactly.
        for (outcome, expected) in [
            ("acquired", acquired),
            ("busy", BUSY),
            ("timeout", TIMEOUTS),
            ("cancelled", 1),
        ] {
            let q = format!("sum(fairlock_acquire_total{{outcome=\"{outcome}\"}})");
            assert_eq!(ask(&q), Some(expected as f64), "{q}");
            let q = format!("sum(fairlock_wait_seconds_count{{outcome=\"{outcome}\"}})");
            assert_eq!(ask(&q), Some(expected as f64), "{q}");
        }
        assert_eq!(ask(r#"sum(fairlock_acquire_total{outcome="error"})"#), None);

        // Contention, and the lease losses the test caused.
        assert_eq!(ask("sum(fairlock_contended_total)"), Some(contended as f64));
        assert_eq!(
            ask("sum(fairlock_lease_lost_total)"),
            Some((EXPIRED_LEASES + 1) as f64)
        );
        // Renewals count the watchdog's own locks only, so at most the
        // force-released one is there (when a watchdog check found it
        // before the revocation notice did); the series exists from the
        // start, at 0. The expired fixed leases, though the watchdog
        // checks them too, are in fairlock_lease_lost_total only.
        let found = ask(r#"sum(fairlock_lease_renewals_total{result="lost"})"#);
        assert!(found.is_some_and(|n| (0.0..=1.0).contains(&n)), "{found:?}");

        // Queue depth: seen above zero during the run, and the last task to
        // queue had WAITERS - 1 ahead.
        let window = format!("{}s", started.elapsed().as_secs() + 30);
        let seen = ask(&format!(
            "max(max_over_time(fairlock_queue_depth[{window}]))"
        ));
        assert!(seen.is_some_and(|d| d >= (WAITERS - 1) as f64), "{seen:?}");
        assert_eq!(ask("max(fairlock_queue_depth)"), Some((WAITERS - 1) as f64));

        // Wait p99 from the buckets lands in the bucket of the swarm's own
        // p99, or the one below (the test's clock runs slightly longer
        // than the library's).
        let q = r#"histogram_quantile(0.99, sum by (le) (fairlock_wait_seconds_bucket{outcome="acquired"}))"#;
        let p99 = ask(q).expect("a wait p99");
        let (low, high) = bucket_bounds(own_p99);
        assert!(
            low <= p99 && p99 <= high,
            "{q} = {p99}, outside [{low}, {high}] around the swarm's own p99 {own_p99}"
        );

        // rate() and increase() need two samples of a series: wait until
        // the series born last (failed outcomes, lease losses) have been
        // scraped at least twice.
        let q = format!(
            "min(count_over_time(fairlock_acquire_total[{window}]) \
             or count_over_time(fairlock_lease_lost_total[{window}]) \
             or count_over_time(fairlock_lease_renewals_total[{window}]))"
        );
        let samples = prometheus
            .query_until(&q, SCRAPE_WAIT, |s| single(s).is_some_and(|n| n >= 2.0))
            .expect(&q);
        assert!(
            single(&samples).is_some_and(|n| n >= 2.0),
            "{q} -> {samples:?}"
        );
        check_dashboard(&prometheus, &root, &window);

        // The alert rules loaded and evaluate cleanly on real data, and the
        // lease losses made FairlockLeaseLost active.
        let rules = prometheus.api_get("/api/v1/rules").expect("rules");
        let mut names = Vec::new();
        for group in rules["data"]["groups"].as_array().expect("groups") {
            for rule in group["rules"].as_array().expect("rules") {
                let name = rule["name"].as_str().unwrap_or_default().to_owned();
                assert_ne!(rule["health"], "err", "{name}: {}", rule["lastError"]);
                names.push(name);
            }
        }
        let alerts = std::fs::read_to_string(root.join("dashboards/alerts.yml")).expect("alerts");
        assert_eq!(
            names.len(),
            alerts.matches("- alert: ").count(),
            "{names:?}"
        );
        let firing = prometheus
            .query_until(
                r#"ALERTS{alertname="FairlockLeaseLost"}"#,
                SCRAPE_WAIT,
                |s| !s.is_empty(),
            )
            .expect("ALERTS");
        assert!(!firing.is_empty(), "FairlockLeaseLost never became active");
    });

    for client in &clients {
        client.shutdown().await;
    }
}

/// Sends every panel query of the Grafana dashboard to Prometheus, with
/// its variables set to this test's values: none may fail or come back
/// without a single finite value.
fn check_dashboard(prometheus: &PrometheusServer, root: &std::path::Path, window: &str) {
    let text = std::fs::read_to_string(root.join("dashboards/fairlock.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let Some(expr) = target["expr"].as_str() else {
                continue;
            };
            let query = expr
                .replace("$__rate_interval", window)
                .replace("$__interval", window)
                .replace("$__range", window)
                .replace("$job", fairlock_testkit::SCRAPE_JOB)
                .replace("$instance", ".*")
                .replace("$lock", ".*");
            assert!(!query.contains('$'), "{title}: unknown variable in {expr}");
            let samples = prometheus
                .query(&query)
                .unwrap_or_else(|e| panic!("panel {title:?}: {e}"));
            assert!(
                samples.iter().any(|s| s.value.is_finite()),
                "panel {title:?} has no data: {query} -> {samples:?}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} panel queries found");
}

/// The value of a one-sample answer.
fn single(samples: &[PromSample]) -> Option<f64> {
    match samples {
        [] => None,
        [one] => Some(one.value),
        many => panic!("expected one sample, got {many:?}"),
    }
}

/// The `q` quantile of `values` (nearest rank).
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The lower bound of the bucket below the one holding `value`, and the
/// upper bound of the one holding it.
fn bucket_bounds(value: f64) -> (f64, f64) {
    let index = SECONDS_BUCKETS
        .iter()
        .position(|&bound| value <= bound)
        .unwrap_or(SECONDS_BUCKETS.len() - 1);
    let low = if index >= 2 {
        SECONDS_BUCKETS[index - 2]
    } else {
        0.0
    };
    (low, SECONDS_BUCKETS[index])
}
