//! The Prometheus exporter end to end: install it, run a workload whose
//! metric values it determines against a real redis-server, scrape
//! `/metrics` over HTTP and check every count.
//!
//! A metrics recorder is process-global, so this file holds exactly one
//! test: a second one would record into the same counters.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use fairlock::{Error, LockOptions};
use fairlock_metrics::{
    ACQUIRE_TOTAL, CONTENDED_TOTAL, HANDOFF_TOTAL, HOLD_SECONDS, LEASE_LOST_TOTAL,
    LEASE_RENEWALS_TOTAL, PUBSUB_RECONNECTS_TOTAL, QUEUE_DEPTH, SECONDS_BUCKETS,
    WAITERS_EVICTED_TOTAL, WAIT_SECONDS,
};
use fairlock_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Uncontended acquisitions in the first phase.
const SOLO: usize = 20;
/// Waiters queued behind one holder in the handoff phase.
const WAITERS: usize = 5;

/// Metric values match the workload: every acquire outcome, contention,
/// handoffs, lease losses (fixed lease and force-released watchdog lease),
/// hold and wait histogram counts, and the queue-depth gauge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_metrics_count_the_workload_exactly() {
    let (addr, metrics) = install_exporter();
    let server = server();
    let a = client(&server).await;
    let b = client(&server).await;
    // The counters alerts watch for a first event exist at 0 from the
    // start: Prometheus's increase() misses events already in a series'
    // first sample, so a process's first lost leases would never alert.
    assert_eq!(metric_value(&metrics, LEASE_LOST_TOTAL), Some(0.0));
    assert_eq!(metric_value(&metrics, LEASE_RENEWALS_TOTAL), Some(0.0));
    assert_eq!(metric_value(&metrics, WAITERS_EVICTED_TOTAL), Some(0.0));

    // 1. Uncontended: SOLO grants, no queueing.
    for i in 0..SOLO {
        let client = if i % 2 == 0 { &a } else { &b };
        let guard = client.lock("solo").await.expect("free lock");
        assert_eq!(guard.ticket(), None, "an uncontended grant has no ticket");
        guard.release().await.expect("release");
    }

    // 2. One of each failed outcome against a held lock.
    let holder = a.lock("held").await.expect("holder");
    assert!(b.try_lock("held").await.expect("try_lock").is_none()); // busy
    let timed_out = b
        .lock_with(
            "held",
            LockOptions::new().wait_timeout(Duration::from_millis(200)),
        )
        .await;
    assert!(
        matches!(timed_out, Err(Error::WaitTimeout { .. })),
        "{timed_out:?}"
    );
    let contended_before_cancel = metric_value(&metrics, CONTENDED_TOTAL).unwrap_or(0.0);
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("held").await.map(drop) })
    };
    wait_for_queue_len(&a, "held", 1).await;
    // Abort only once the waiter has read its queued reply and counted
    // itself contended: an abort before that drops the reply unread.
    wait_for_metric(&metrics, CONTENDED_TOTAL, contended_before_cancel + 1.0).await;
    waiter.abort(); // drops the acquire future: cancelled
    assert!(waiter.await.is_err_and(|e| e.is_cancelled()));
    // Whether or not its cancel script ran yet, the lock ends up free.
    holder.release().await.expect("release");

    // An acquire that Redis refuses (a foreign key under the lock's
    // name) is one error and nothing else: it was once counted a second
    // time, as cancelled, when its pending state was dropped.
    server
        .cmd_ok(&["SET", keys("broken").queue(), "not a zset"])
        .expect("plant a foreign key");
    let refused = b.lock("broken").await;
    assert!(matches!(refused, Err(Error::WrongType(_))), "{refused:?}");

    // 3. A fixed lease that runs out before the release: lease lost.
    let short = a
        .lock_with(
            "short",
            LockOptions::new().lease(Duration::from_millis(100)),
        )
        .await
        .expect("short lease");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = short.release().await;
    assert!(matches!(late, Err(Error::NotOwner { .. })), "{late:?}");

    // 3b. The same where no watchdog check came first (a client with 5 s
    //     rounds): the release itself finds the lease gone. It counts as
    //     a lost lease too; it once did not.
    let slow = fairlock::LockClient::with_config(
        fairlock::ClientConfig::builder(server.url())
            .heartbeat_interval(Duration::from_secs(5))
            .waiter_timeout(Duration::from_secs(15))
            .build()
            .expect("config"),
    )
    .await
    .expect("connect");
    let unchecked = slow
        .lock_with(
            "unchecked",
            LockOptions::new().lease(Duration::from_millis(100)),
        )
        .await
        .expect("short lease");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = unchecked.release().await;
    assert!(matches!(late, Err(Error::NotOwner { .. })), "{late:?}");

    // 4. A watchdog-kept lease taken away by an admin: the next renewal
    //    (every 1 s with the test timings) finds it lost.
    let watched = a.lock("watched").await.expect("watched");
    assert!(b.force_release("watched").await.expect("force_release"));
    tokio::time::timeout(Duration::from_secs(5), watched.lost())
        .await
        .expect("the watchdog reports the lost lease");
    assert!(watched.is_lost());
    // Force-released: its release frees nothing, and still samples the
    // hold.
    let late = watched.release().await;
    assert!(
        matches!(late, Err(fairlock::Error::NotOwner { .. })),
        "{late:?}"
    );

    // 5. Handoffs: WAITERS queue one by one behind a holder, then each
    //    release hands the lock to the next. The last one queued had
    //    WAITERS - 1 waiters ahead.
    let holder = a.lock("queue").await.expect("holder");
    let contended_before = metric_value(&metrics, CONTENDED_TOTAL).unwrap_or(0.0);
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let guard = client.lock("queue").await?;
            tokio::time::sleep(Duration::from_millis(1)).await;
            guard.release().await
        }));
        wait_for_queue_len(&a, "queue", i as u64 + 1).await;
        // Each waiter records its depth before it counts as contended.
        let counted = contended_before + i as f64 + 1.0;
        wait_for_metric(&metrics, CONTENDED_TOTAL, counted).await;
    }
    holder.release().await.expect("release");
    for task in tasks {
        task.await.expect("waiter task").expect("waiter grant");
    }

    let acquired = SOLO + 1 + 1 + 1 + 1 + 1 + WAITERS;
    let scrape = Scrape::parse(&http_get(addr, "/metrics").await);

    // Acquire outcomes, and the wait histogram counts the same calls.
    for (outcome, expected) in [
        ("acquired", acquired),
        ("busy", 1),
        ("timeout", 1),
        ("cancelled", 1),
        ("error", 1),
    ] {
        let labels = [("outcome", outcome)];
        assert_eq!(
            scrape.value(ACQUIRE_TOTAL, &labels),
            Some(expected as f64),
            "{ACQUIRE_TOTAL}{{outcome={outcome}}}"
        );
        assert_eq!(
            scrape.value(&format!("{WAIT_SECONDS}_count"), &labels),
            Some(expected as f64),
            "{WAIT_SECONDS}_count{{outcome={outcome}}}"
        );
        scrape.check_histogram(WAIT_SECONDS, &labels);
    }
    assert_eq!(
        scrape.sum(&format!("{WAIT_SECONDS}_count")),
        (acquired + 4) as f64,
        "one wait sample per acquire call"
    );

    // Queued calls: the timed-out one, the cancelled one, the WAITERS.
    assert_eq!(
        scrape.value(CONTENDED_TOTAL, &[]),
        Some((2 + WAITERS) as f64)
    );
    assert_eq!(scrape.value(HANDOFF_TOTAL, &[]), Some(WAITERS as f64));
    assert_eq!(scrape.value(QUEUE_DEPTH, &[]), Some((WAITERS - 1) as f64));

    // Every grant was released once.
    assert_eq!(
        scrape.value(&format!("{HOLD_SECONDS}_count"), &[]),
        Some(acquired as f64)
    );
    scrape.check_histogram(HOLD_SECONDS, &[]);

    // Lease losses: the fixed lease and the force-released one, each
    // counted once. Who noticed first varies: the watchdog's check (which
    // covers fixed leases too), the local clock, or the revoke notice.
    assert_eq!(scrape.value(LEASE_LOST_TOTAL, &[]), Some(3.0));
    assert!(
        scrape
            .value(LEASE_RENEWALS_TOTAL, &[("result", "lost")])
            .unwrap_or(0.0)
            <= 2.0
    );
    assert_eq!(
        scrape.value(LEASE_RENEWALS_TOTAL, &[("result", "error")]),
        None
    );

    // Nothing died and no connection dropped.
    assert_eq!(scrape.value(WAITERS_EVICTED_TOTAL, &[]), Some(0.0));
    assert_eq!(scrape.value(PUBSUB_RECONNECTS_TOTAL, &[]), None);

    // describe_metrics ran: help text and types are served.
    for (name, kind) in [
        (ACQUIRE_TOTAL, "counter"),
        (WAIT_SECONDS, "histogram"),
        (HOLD_SECONDS, "histogram"),
        (QUEUE_DEPTH, "gauge"),
    ] {
        assert_eq!(scrape.types.get(name).map(String::as_str), Some(kind));
        assert!(scrape.helps.contains_key(name), "no HELP for {name}");
    }

    for client in [&a, &b] {
        client.shutdown().await;
    }
}

/// A minimal HTTP/1.0 GET (no chunked encoding, the server closes the
/// connection after the body); returns the body of a 200 response.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the exporter");
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send request");
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .expect("the exporter answers within 10 s")
        .expect("read response");
    let response = String::from_utf8(response).expect("UTF-8 response");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .expect("an HTTP response with a header");
    let status = head.lines().next().unwrap_or_default();
    assert!(status.contains(" 200 "), "unexpected status: {status}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    body.to_owned()
}

/// One sample of the Prometheus text format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed scrape: samples, and the `# TYPE` and `# HELP` lines.
#[derive(Debug, Default)]
struct Scrape {
    samples: Vec<Sample>,
    types: BTreeMap<String, String>,
    helps: BTreeMap<String, String>,
}

impl Scrape {
    /// Parses the text exposition format as the exporter writes it: label
    /// values without escaped quotes or commas, no timestamps.
    fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE line");
                scrape.types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP line");
                scrape.helps.insert(name.to_owned(), help.to_owned());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("sample line");
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => {
                    let labels = labels.strip_suffix('}').expect("closing brace");
                    let labels = labels
                        .split(',')
                        .filter(|pair| !pair.is_empty())
                        .map(|pair| {
                            let (key, value) = pair.split_once('=').expect("label pair");
                            (key.to_owned(), value.trim_matches('"').to_owned())
                        })
                        .collect();
                    (name, labels)
                }
                None => (series, BTreeMap::new()),
            };
            scrape.samples.push(Sample {
                name: name.to_owned(),
                labels,
                value,
            });
        }
        scrape
    }

    /// The value of the series with exactly these labels.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut found = self
            .samples
            .iter()
            .filter(|s| s.name == name && s.labels == wanted);
        let value = found.next().map(|s| s.value);
        assert!(found.next().is_none(), "duplicate series {name}{labels:?}");
        value
    }

    /// The sum over all series of `name`.
    fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    }

    /// A histogram series has fairlock's buckets, cumulative counts that
    /// never decrease, and a `+Inf` bucket equal to its `_count`.
    fn check_histogram(&self, name: &str, labels: &[(&str, &str)]) {
        let bucket = format!("{name}_bucket");
        let mut previous = 0.0;
        for bound in SECONDS_BUCKETS
            .iter()
            .map(f64::to_string)
            .chain(["+Inf".to_owned()])
        {
            let mut with_le = labels.to_vec();
            with_le.push(("le", &bound));
            let count = self
                .value(&bucket, &with_le)
                .unwrap_or_else(|| panic!("{bucket}{labels:?} has no le={bound} bucket"));
            assert!(
                count >= previous,
                "{bucket}{labels:?} decreases at le={bound}"
            );
            previous = count;
        }
        assert_eq!(
            Some(previous),
            self.value(&format!("{name}_count"), labels),
            "{name}{labels:?}: the +Inf bucket differs from _count"
        );
    }
}
