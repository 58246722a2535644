//! Soak mode (`fairlock-chaos soak`): many held locks and many queued
//! waiters in one process against one redis-server, kept for minutes of
//! heartbeats and watchdog renewals, with no fault injected.
//!
//! It answers three questions a user sizing a deployment asks:
//! - is any live waiter ever dropped from its queue (its ticket would
//!   change or vanish) or any held lease lost while the process is alive?
//! - do client RSS and Redis `used_memory` stay flat once everyone is
//!   queued, and what do they cost per held lock and per waiter?
//! - is the background cost (Redis commands and CPU per sampling interval)
//!   flat over time, not growing with the run's age?
//!
//! At the end the holders release, every waiter must be granted in ticket
//! order of its lock, and the client's clean shutdown must leave no owner
//! or queue key behind.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::{ClientConfig, LockClient, LockGuard};
use fairlock_testkit::{RedisServer, Resp};
use serde::Serialize;
use tokio::task::JoinSet;

/// The size and length of a soak run.
#[derive(Debug, Clone, Serialize)]
pub struct SoakConfig {
    /// Locks held for the whole run.
    pub locks: usize,
    /// Waiters queued behind them, spread evenly.
    pub waiters: usize,
    /// How long everyone stays queued.
    pub duration: Duration,
    /// How often memory, cost and queues are sampled.
    pub sample_every: Duration,
}

impl SoakConfig {
    /// The long run: 10,000 waiters on 5,000 locks for 10 minutes.
    pub fn long() -> Self {
        Self {
            locks: 5_000,
            waiters: 10_000,
            duration: Duration::from_secs(600),
            sample_every: Duration::from_secs(30),
        }
    }

    /// A small run for CI: the same checks on 100 waiters and 50 locks.
    pub fn short() -> Self {
        Self {
            locks: 50,
            waiters: 100,
            duration: Duration::from_secs(6),
            sample_every: Duration::from_secs(2),
        }
    }
}

/// One sample of the steady phase.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the steady phase began.
    pub at_secs: u64,
    /// Client resident memory, bytes.
    pub client_rss: u64,
    /// Redis `used_memory`, bytes.
    pub redis_used_memory: u64,
    /// Script calls (EVALSHA + EVAL) Redis ran since the previous sample,
    /// not counting the sampler's own inspect call per lock.
    pub script_calls: u64,
    /// Microseconds Redis spent in script calls, the sampler's included.
    pub script_usec: u64,
    /// Redis CPU (user + sys) since the previous sample, milliseconds.
    pub redis_cpu_ms: u64,
    /// Waiters whose queue entry changed or vanished since the start.
    pub evicted: usize,
    /// Held locks whose lease-lost signal fired.
    pub leases_lost: usize,
}

/// What a soak run measured.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// The run's size.
    pub config: SoakConfig,
    /// Client RSS growth per held lock, bytes.
    pub client_bytes_per_lock: f64,
    /// Client RSS growth per queued waiter, bytes.
    pub client_bytes_per_waiter: f64,
    /// Redis `used_memory` growth per held lock, bytes.
    pub redis_bytes_per_lock: f64,
    /// Redis `used_memory` growth per queued waiter, bytes.
    pub redis_bytes_per_waiter: f64,
    /// The steady phase, sampled.
    pub samples: Vec<Sample>,
    /// Waiters granted after the holders released.
    pub granted: usize,
    /// Waiters that ended with an error instead of a grant.
    pub failed: usize,
    /// Grants out of ticket order within a lock (must be 0).
    pub out_of_order: usize,
    /// Owner or queue keys left after the clean shutdown (must be 0).
    pub keys_left: usize,
}

impl SoakReport {
    /// Waiters dropped while alive, over the whole run.
    pub fn evicted(&self) -> usize {
        self.samples.iter().map(|s| s.evicted).max().unwrap_or(0)
    }

    /// Held leases lost while the process was alive.
    pub fn leases_lost(&self) -> usize {
        self.samples
            .iter()
            .map(|s| s.leases_lost)
            .max()
            .unwrap_or(0)
    }

    /// Every must-hold check passed.
    pub fn passed(&self) -> bool {
        self.evicted() == 0
            && self.leases_lost() == 0
            && self.failed == 0
            && self.out_of_order == 0
            && self.keys_left == 0
            && self.granted == self.config.waiters
    }

    /// The report as the terminal shows it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let c = &self.config;
        out.push_str(&format!(
            "soak: {} waiters on {} held locks, one process, {} s steady\n",
            c.waiters,
            c.locks,
            c.duration.as_secs()
        ));
        out.push_str(&format!(
            "memory: client {:.0} B/lock, {:.0} B/waiter; Redis {:.0} B/lock, {:.0} B/waiter\n",
            self.client_bytes_per_lock,
            self.client_bytes_per_waiter,
            self.redis_bytes_per_lock,
            self.redis_bytes_per_waiter
        ));
        out.push_str("| t (s) | client RSS (MiB) | Redis used (MiB) | script calls | script ms | Redis CPU ms | evicted | leases lost |\n");
        out.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for s in &self.samples {
            out.push_str(&format!(
                "| {} | {:.1} | {:.1} | {} | {:.0} | {} | {} | {} |\n",
                s.at_secs,
                mib(s.client_rss),
                mib(s.redis_used_memory),
                s.script_calls,
                s.script_usec as f64 / 1000.0,
                s.redis_cpu_ms,
                s.evicted,
                s.leases_lost
            ));
        }
        out.push_str(&format!(
            "end: {} granted, {} failed, {} out of ticket order, {} owner/queue keys left\n",
            self.granted, self.failed, self.out_of_order, self.keys_left
        ));
        out.push_str(if self.passed() {
            "soak: PASS\n"
        } else {
            "soak: FAIL\n"
        });
        out
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn lock_name(i: usize) -> String {
    format!("soak:{i}")
}

/// Client resident memory, from `/proc/self/status`.
fn rss_bytes() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| "no VmRSS in /proc/self/status".to_owned())
}

/// The server-side counters a sample differences.
#[derive(Default, Clone, Copy)]
struct ServerCounters {
    used_memory: u64,
    script_calls: u64,
    script_usec: u64,
    cpu_ms: u64,
}

fn server_counters(server: &RedisServer) -> Result<ServerCounters, String> {
    let memory = server.info("memory").map_err(|e| e.to_string())?;
    let cpu = server.info("cpu").map_err(|e| e.to_string())?;
    let stats = server.info("commandstats").map_err(|e| e.to_string())?;
    let number = |map: &BTreeMap<String, String>, key: &str| -> f64 {
        map.get(key).and_then(|v| v.parse().ok()).unwrap_or(0.0)
    };
    let mut counters = ServerCounters {
        used_memory: number(&memory, "used_memory") as u64,
        cpu_ms: ((number(&cpu, "used_cpu_user") + number(&cpu, "used_cpu_sys")) * 1000.0) as u64,
        ..ServerCounters::default()
    };
    for command in ["cmdstat_evalsha", "cmdstat_eval"] {
        let Some(line) = stats.get(command) else {
            continue;
        };
        for field in line.split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => counters.script_calls += v.parse::<u64>().unwrap_or(0),
                Some(("usec", v)) => counters.script_usec += v.parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
    }
    Ok(counters)
}

/// `(owner id, ticket)` of every waiter queued on the soak's locks.
async fn queues(
    client: &LockClient,
    config: &SoakConfig,
) -> Result<Vec<Vec<(String, u64)>>, String> {
    let per_lock = (config.waiters / config.locks.max(1)) as u64 + 1;
    let mut all = Vec::with_capacity(config.locks);
    for i in 0..config.locks {
        let state = client
            .inspect_queue(&lock_name(i), per_lock)
            .await
            .map_err(|e| format!("inspect {}: {e}", lock_name(i)))?;
        all.push(
            state
                .waiters
                .into_iter()
                .map(|w| (w.owner_id, w.ticket))
                .collect(),
        );
    }
    Ok(all)
}

/// Owner and queue keys on the server (the seq counters expire on their
/// own and do not count).
fn lock_keys_left(server: &RedisServer) -> Result<usize, String> {
    match server.cmd(&["KEYS", "*"]).map_err(|e| e.to_string())? {
        Resp::Array(Some(keys)) => Ok(keys
            .iter()
            .filter_map(|k| k.as_str())
            .filter(|k| k.ends_with(":owner") || k.ends_with(":queue"))
            .count()),
        Resp::Array(None) => Ok(0),
        other => Err(format!("unexpected KEYS reply: {other:?}")),
    }
}

/// Runs a soak against a redis-server it starts itself.
pub fn run(config: &SoakConfig) -> Result<SoakReport, String> {
    let server = RedisServer::start().map_err(|e| format!("redis-server: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(soak(&server, config))
}

async fn soak(server: &RedisServer, config: &SoakConfig) -> Result<SoakReport, String> {
    let client = LockClient::with_config(ClientConfig::new(server.url()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let rss0 = rss_bytes()?;
    let before = server_counters(server)?;

    // Holders: one per lock, kept by the watchdog for the whole run.
    let mut holders: Vec<LockGuard> = Vec::with_capacity(config.locks);
    for chunk in (0..config.locks).collect::<Vec<_>>().chunks(200) {
        let mut set = JoinSet::new();
        for &i in chunk {
            let client = client.clone();
            set.spawn(async move { (i, client.lock(&lock_name(i)).await) });
        }
        let mut got: Vec<(usize, LockGuard)> = Vec::new();
        while let Some(joined) = set.join_next().await {
            let (i, guard) = joined.map_err(|e| format!("holder task: {e}"))?;
            got.push((i, guard.map_err(|e| format!("holder {i}: {e}"))?));
        }
        got.sort_by_key(|(i, _)| *i);
        holders.extend(got.into_iter().map(|(_, g)| g));
    }
    let rss1 = rss_bytes()?;
    let held = server_counters(server)?;

    // Waiters: spread evenly, each records its ticket at its grant.
    let grants = Arc::new(Mutex::new(vec![Vec::new(); config.locks]));
    let order = Arc::new(AtomicU64::new(0));
    let mut waiters = JoinSet::new();
    for w in 0..config.waiters {
        let lock = w % config.locks;
        let (client, grants, order) = (client.clone(), grants.clone(), order.clone());
        waiters.spawn(async move {
            let guard = client.lock(&lock_name(lock)).await?;
            let at = order.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut grants) = grants.lock() {
                grants[lock].push((at, guard.ticket().unwrap_or(0)));
            }
            guard.release().await
        });
    }
    // Queued means the acquire's answer came back with a place: a waiter
    // counts in `stats().waiters` as soon as its task starts waiting,
    // while its acquire may still be on its way to Redis.
    let queued_by = Instant::now() + Duration::from_secs(120);
    while client.stats().queued < config.waiters {
        if Instant::now() > queued_by {
            return Err(format!(
                "only {} of {} waiters queued after 120 s",
                client.stats().queued,
                config.waiters
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let start_queues = queues(&client, config).await?;
    let queued: usize = start_queues.iter().map(Vec::len).sum();
    if queued != config.waiters {
        return Err(format!(
            "{queued} queue entries for {} waiters",
            config.waiters
        ));
    }
    let rss2 = rss_bytes()?;
    let all_queued = server_counters(server)?;

    // The steady phase.
    let steady = Instant::now();
    let mut last = server_counters(server)?;
    let mut samples = Vec::new();
    while steady.elapsed() < config.duration {
        tokio::time::sleep(config.sample_every).await;
        // Counters after the queues are read, so every sample counts
        // exactly one inspect call per lock of the sampler's own.
        let current = queues(&client, config).await?;
        let now = server_counters(server)?;
        let evicted = start_queues
            .iter()
            .zip(&current)
            .map(|(was, is)| was.iter().filter(|entry| !is.contains(entry)).count())
            .sum();
        let leases_lost = holders.iter().filter(|g| g.is_lost()).count();
        samples.push(Sample {
            at_secs: steady.elapsed().as_secs(),
            client_rss: rss_bytes()?,
            redis_used_memory: now.used_memory,
            script_calls: now
                .script_calls
                .saturating_sub(last.script_calls)
                .saturating_sub(config.locks as u64),
            script_usec: now.script_usec.saturating_sub(last.script_usec),
            redis_cpu_ms: now.cpu_ms.saturating_sub(last.cpu_ms),
            evicted,
            leases_lost,
        });
        if let Some(s) = samples.last() {
            eprintln!(
                "soak t={}s rss={:.1}MiB used={:.1}MiB scripts={} evicted={} lost={}",
                s.at_secs,
                mib(s.client_rss),
                mib(s.redis_used_memory),
                s.script_calls,
                s.evicted,
                s.leases_lost
            );
        }
        last = now;
    }

    // The end: holders release, every waiter is granted in ticket order.
    for guard in holders {
        guard
            .release()
            .await
            .map_err(|e| format!("holder release: {e}"))?;
    }
    let (mut granted, mut failed) = (0, 0);
    let deadline = Duration::from_secs(300);
    while let Ok(Some(joined)) = tokio::time::timeout(deadline, waiters.join_next()).await {
        match joined {
            Ok(Ok(())) => granted += 1,
            _ => failed += 1,
        }
    }
    failed += waiters.len();
    let grants = grants.lock().map(|g| g.clone()).unwrap_or_default();
    let out_of_order = grants
        .into_iter()
        .map(|mut per_lock| {
            per_lock.sort();
            per_lock.windows(2).filter(|w| w[0].1 >= w[1].1).count()
        })
        .sum();
    client.shutdown().await;
    let keys_left = lock_keys_left(server)?;

    let per = |after: u64, before: u64, n: usize| (after as f64 - before as f64) / n.max(1) as f64;
    Ok(SoakReport {
        config: config.clone(),
        client_bytes_per_lock: per(rss1, rss0, config.locks),
        client_bytes_per_waiter: per(rss2, rss1, config.waiters),
        redis_bytes_per_lock: per(held.used_memory, before.used_memory, config.locks),
        redis_bytes_per_waiter: per(all_queued.used_memory, held.used_memory, config.waiters),
        samples,
        granted,
        failed,
        out_of_order,
        keys_left,
    })
}
