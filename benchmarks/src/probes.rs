//! Measurements outside the contention matrix: the PING round trip,
//! uncontended acquire+release latency, and the cost of waiting in one
//! process (10,000 waiters on one lock, 100,000 over 1,000 locks: client
//! memory, Redis memory, connections).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::LockClient;

use fred::prelude::ClientLike;
use serde::Serialize;
use tokio::sync::watch;

use crate::admin::Admin;
use crate::impls::fairlock::FairlockImpl;
use crate::impls::{fred_client, LockConn, LockImpl, Result};
use crate::progress::Progress;
use crate::stats::percentile;

/// Calls made before timing starts (connections, script cache, allocator).
const WARMUP_CALLS: usize = 50;
/// Waiters spawned at once by the waiter probe.
const ENQUEUE_BATCH: usize = 500;
/// Upper bound of any probe phase that waits for Redis state.
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);

/// Latency of a repeated operation, microseconds.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Mean.
    pub mean_us: f64,
}

impl Latency {
    fn from_samples(mut samples_us: Vec<f64>) -> Result<Latency> {
        samples_us.sort_by(f64::total_cmp);
        let p50_us = percentile(&samples_us, 0.5).ok_or("no latency samples")?;
        let p99_us = percentile(&samples_us, 0.99).ok_or("no latency samples")?;
        Ok(Latency {
            p50_us,
            p99_us,
            mean_us: samples_us.iter().sum::<f64>() / samples_us.len() as f64,
        })
    }
}

/// Acquire + release of a free lock by one task, back to back,
/// interleaved with PINGs on a fred connection set up like fairlock's
/// command connection, so both see the same machine load. Returns
/// (acquire + release, PING).
pub async fn uncontended<L: LockImpl>(
    imp: &L,
    admin: &Admin,
    iterations: usize,
) -> Result<(Latency, Latency)> {
    admin.flushall().await?;
    let conn = imp.connect(&admin.url()).await?;
    let pinger = match fred_client(&admin.url()).await {
        Ok(pinger) => pinger,
        Err(error) => {
            conn.close().await;
            return Err(error);
        }
    };
    let result = tokio::time::timeout(PHASE_TIMEOUT, async {
        let mut locks = Vec::with_capacity(iterations);
        let mut pings = Vec::with_capacity(iterations);
        for i in 0..WARMUP_CALLS + iterations {
            let started = Instant::now();
            let _: String = pinger.ping(None).await?;
            let pinged = Instant::now();
            let held = conn.acquire("bench-uncontended").await?;
            conn.release(held).await?;
            if i >= WARMUP_CALLS {
                pings.push((pinged - started).as_secs_f64() * 1e6);
                locks.push(pinged.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok::<_, crate::impls::BenchError>((
            Latency::from_samples(locks)?,
            Latency::from_samples(pings)?,
        ))
    })
    .await;
    conn.close().await;
    let _ = tokio::time::timeout(crate::impls::COMMAND_TIMEOUT, pinger.quit()).await;
    result.map_err(|_| "uncontended probe timed out")?
}

/// What `waiters` waiters spread over `locks` locks cost: the fields of
/// the report's `"waiters"` JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct WaiterCost {
    /// Waiters spawned.
    pub waiters: usize,
    /// Locks they wait for (waiter `i` waits for lock `i % locks`).
    pub locks: usize,
    /// Waiters Redis had queued when measured.
    pub queued: u64,
    /// Client RSS growth per waiter, bytes.
    pub client_bytes_per_waiter: f64,
    /// Client live heap growth per waiter (glibc `mallinfo2`: bytes in
    /// allocated chunks), bytes. RSS also keeps freed memory the allocator
    /// has not returned, such as the peak of the enqueue burst.
    pub client_heap_per_waiter: f64,
    /// Redis `used_memory` growth per waiter, bytes.
    pub redis_bytes_per_waiter: f64,
    /// Redis connections the process held.
    pub connections: usize,
    /// Of those, connections subscribed to pub/sub channels.
    pub subscriber_connections: usize,
    /// Time until every waiter was queued, seconds.
    pub enqueue_s: f64,
    /// Size of the future `LockClient::lock` returns, bytes (before the
    /// tokio task around it).
    pub lock_future_bytes: usize,
}

/// `waiters` tasks of one fairlock client wait for `locks` locks (waiter
/// `i` for lock `i % locks`) that another task of the same client holds.
/// The memory figures are the growth from the held locks to the held locks
/// plus every waiter queued.
pub async fn fairlock_waiters(
    admin: &Admin,
    waiters: usize,
    locks: usize,
    progress: &Progress,
) -> Result<WaiterCost> {
    admin.flushall().await?;
    let before: BTreeSet<String> = admin
        .clients()
        .await?
        .into_iter()
        .filter_map(|c| c.get("id").cloned())
        .collect();
    let conn = FairlockImpl.connect(&admin.url()).await?;
    let client = conn.client().clone();
    let names: Arc<[String]> = (0..locks.max(1))
        .map(|lock| format!("bench-waiters-{lock}"))
        .collect();
    let result = async {
        let mut holders = Vec::with_capacity(names.len());
        for name in names.iter() {
            holders.push(client.lock(name).await?);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        return_free_memory();
        let rss_before = rss_bytes()?;
        let heap_before = heap_bytes();
        let redis_before = admin.used_memory().await?;

        let (stop_tx, stop_rx) = watch::channel(false);
        let started = Instant::now();
        let deadline = started + PHASE_TIMEOUT + Duration::from_millis(waiters as u64);
        let mut tasks = Vec::with_capacity(waiters);
        let mut queues = QueueLengths::new(&client, &names);
        // Enqueue in batches so the figure is the steady cost of waiting,
        // not the transient peak of every script call in flight at once.
        while tasks.len() < waiters && Instant::now() < deadline {
            let batch = ENQUEUE_BATCH.min(waiters - tasks.len());
            for _ in 0..batch {
                let lock = tasks.len() % names.len();
                queues.expect_one_more(lock);
                let client = client.clone();
                let names = Arc::clone(&names);
                let mut stop = stop_rx.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::select! {
                        guard = client.lock(&names[lock]) => {
                            if let Ok(guard) = guard {
                                let _ = guard.release().await;
                            }
                        }
                        _ = stopped(&mut stop) => {}
                    }
                }));
            }
            queues.wait_until_queued(deadline, progress).await?;
        }
        let enqueue_s = started.elapsed().as_secs_f64();
        let queued = queues.total();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rss_after = rss_bytes()?;
        let heap_after = heap_bytes();
        let redis_after = admin.used_memory().await?;
        let ours: Vec<_> = admin
            .clients()
            .await?
            .into_iter()
            .filter(|c| c.get("id").is_some_and(|id| !before.contains(id)))
            .collect();
        let subscribed = |c: &std::collections::BTreeMap<String, String>| {
            ["sub", "psub", "ssub"].iter().any(|field| {
                c.get(*field)
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|n| n > 0)
            })
        };

        // Leave: every waiter cancels (removing its queue entry), then the
        // holders release to empty queues.
        let _ = stop_tx.send(true);
        let leave_deadline = tokio::time::Instant::now() + PHASE_TIMEOUT;
        for task in tasks {
            let _ = tokio::time::timeout_at(leave_deadline, task).await;
        }
        queues
            .wait_until_empty(Instant::now() + PHASE_TIMEOUT, progress)
            .await?;
        for holder in holders {
            holder.release().await?;
        }

        let n = waiters as f64;
        Ok::<_, crate::impls::BenchError>(WaiterCost {
            waiters,
            locks: names.len(),
            queued,
            client_bytes_per_waiter: (rss_after as f64 - rss_before as f64) / n,
            client_heap_per_waiter: (heap_after - heap_before) / n,
            redis_bytes_per_waiter: (redis_after - redis_before) / n,
            connections: ours.len(),
            subscriber_connections: ours.iter().filter(|c| subscribed(c)).count(),
            enqueue_s,
            lock_future_bytes: std::mem::size_of_val(&client.lock(&names[0])),
        })
    }
    .await;
    conn.close().await;
    result
}

/// The queue length of each lock of the waiter probe, as Redis reports
/// it (`LockClient::inspect`), against the waiters spawned for it.
struct QueueLengths<'a> {
    client: &'a LockClient,
    names: &'a [String],
    expected: Vec<u64>,
    seen: Vec<u64>,
}

impl<'a> QueueLengths<'a> {
    fn new(client: &'a LockClient, names: &'a [String]) -> Self {
        QueueLengths {
            client,
            names,
            expected: vec![0; names.len()],
            seen: vec![0; names.len()],
        }
    }

    fn expect_one_more(&mut self, lock: usize) {
        self.expected[lock] += 1;
    }

    /// Waiters Redis has queued, as last seen.
    fn total(&self) -> u64 {
        self.seen.iter().sum()
    }

    /// Waits until every lock's queue holds the waiters spawned for it,
    /// or until `deadline` (the figure then says how many were queued).
    async fn wait_until_queued(&mut self, deadline: Instant, progress: &Progress) -> Result<()> {
        self.wait_for(deadline, progress, |seen, expected| seen >= expected)
            .await
    }

    /// Waits until every queue is empty, or until `deadline`.
    async fn wait_until_empty(&mut self, deadline: Instant, progress: &Progress) -> Result<()> {
        self.wait_for(deadline, progress, |seen, _| seen == 0).await
    }

    /// Re-reads the queue lengths of the locks not yet `done`, all at once,
    /// every 20 ms, until each is.
    async fn wait_for(
        &mut self,
        deadline: Instant,
        progress: &Progress,
        done: impl Fn(u64, u64) -> bool,
    ) -> Result<()> {
        let mut pending: Vec<usize> = (0..self.names.len())
            .filter(|&lock| !done(self.seen[lock], self.expected[lock]))
            .collect();
        while !pending.is_empty() && Instant::now() < deadline {
            let mut reads = tokio::task::JoinSet::new();
            for &lock in &pending {
                let client = self.client.clone();
                let name = self.names[lock].clone();
                reads.spawn(async move { (lock, client.inspect(&name).await) });
            }
            while let Some(read) = reads.join_next().await {
                let (lock, state) = read?;
                self.seen[lock] = state?.queue_len;
            }
            pending.retain(|&lock| !done(self.seen[lock], self.expected[lock]));
            if !pending.is_empty() {
                progress.tick();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }
}

/// Resolves once the stop signal is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Bytes in this process's allocated heap chunks, all arenas (glibc
/// `mallinfo2`: `uordblks` plus mmapped blocks).
fn heap_bytes() -> f64 {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    info.uordblks as f64 + info.hblkhd as f64
}

/// Gives the pages the allocator holds free back to the system (glibc
/// `malloc_trim`), so the RSS growth that follows counts the pages the
/// waiters touch, not a reuse of what earlier measurements freed.
fn return_free_memory() {
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// This process's resident set size, from /proc/self/status.
fn rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or("no VmRSS in /proc/self/status")?;
    Ok(kib * 1024)
}

/// Redis commands one operation runs, counting the commands inside scripts
/// and not the script call itself (`INFO commandstats` counts both in
/// Redis 7), median over repetitions.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct OperationCosts {
    /// Acquiring a free lock nobody waits for.
    pub acquire: u64,
    /// Releasing it with nobody waiting.
    pub release: u64,
    /// One contended cycle: a second caller joins the queue (or polls)
    /// while the lock is held, then the holder releases and the caller is
    /// granted. `None` where the caller polls instead of queueing.
    pub contended_cycle: Option<u64>,
}

/// Commands that are the harness's or the script call itself.
fn is_wrapper(command: &str) -> bool {
    command.starts_with("eval")
        || command.starts_with("script|")
        || command.starts_with("config|")
        || command == "info"
        || command == "fcall"
}

async fn commands_since_reset(admin: &Admin) -> Result<u64> {
    Ok(admin
        .commandstats()
        .await?
        .iter()
        .filter(|(name, _)| !is_wrapper(name))
        .map(|(_, calls)| calls)
        .sum())
}

fn median(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

/// Measures [`OperationCosts`] of one implementation; the contended cycle
/// only for locks with a queue (`queued`).
pub async fn operation_costs<L: LockImpl>(
    imp: &L,
    admin: &Admin,
    queued: bool,
) -> Result<OperationCosts> {
    const REPEAT: usize = 21;
    admin.flushall().await?;
    let first = imp.connect(&admin.url()).await?;
    let second = imp.connect(&admin.url()).await?;
    // Warm the script cache and the sequence counter.
    let held = first.acquire("cost").await?;
    first.release(held).await?;
    let (mut acquires, mut releases, mut cycles) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..REPEAT {
        admin.reset_stats().await?;
        let held = first.acquire("cost").await?;
        acquires.push(commands_since_reset(admin).await?);
        admin.reset_stats().await?;
        first.release(held).await?;
        releases.push(commands_since_reset(admin).await?);
        if queued {
            let held = first.acquire("cost").await?;
            admin.reset_stats().await?;
            let waiter = {
                let second = second.clone();
                tokio::spawn(async move { second.acquire("cost").await })
            };
            // Long enough for the enqueue, short against the 1 s
            // heartbeat and watchdog intervals.
            tokio::time::sleep(Duration::from_millis(30)).await;
            first.release(held).await?;
            let granted = tokio::time::timeout(PHASE_TIMEOUT, waiter)
                .await
                .map_err(|_| "contended cycle: the waiter was never granted")???;
            cycles.push(commands_since_reset(admin).await?);
            second.release(granted).await?;
        }
    }
    first.close().await;
    second.close().await;
    Ok(OperationCosts {
        acquire: median(acquires),
        release: median(releases),
        contended_cycle: queued.then(|| median(cycles)),
    })
}
