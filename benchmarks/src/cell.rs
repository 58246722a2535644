//! One cell of the matrix: C contender tasks spread over a few simulated
//! client processes fight over one lock (or over `locks` locks), each
//! running a non-atomic GET-then-SET of a counter while holding it.
//!
//! A cell runs in three phases:
//! 1. **warm-up** until every contender has completed one cycle (so the
//!    start-up stampede, where everybody begins waiting in the same
//!    microsecond, is not measured), bounded by `warmup_max`;
//! 2. **window**: `CONFIG RESETSTAT`, then `measure` of steady state, then
//!    `INFO commandstats`; only acquisitions inside the window are counted;
//! 3. **stop**: waiting tasks are cancelled, a task inside its critical
//!    section finishes it and releases; every task is joined within a hard
//!    deadline.
//!
//! Each task records every attempt (when it started waiting, when it got
//! the lock or stopped waiting, when it started releasing) on one
//! monotonic clock shared by all simulated clients of the process; the
//! statistics in `stats.rs` are computed offline from those intervals.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::{Client, ClientLike, KeysInterface, Pool};
use tokio::sync::watch;

use crate::admin::Admin;
use crate::hold::HoldTimers;
use crate::impls::{fred_client, fred_pool, LockConn, LockImpl, Result};
use crate::progress::Progress;

/// How long stopping may take before remaining tasks are aborted.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(10);
/// Connections of each simulated client's pool for the critical section.
pub(crate) const DATA_POOL_SIZE: usize = 2;
/// Pause after a failed acquire or critical section (no error loop spins).
const ERROR_PAUSE: Duration = Duration::from_millis(10);
/// Interval of the PINGs that measure the round trip under the cell's load.
const PING_EVERY: Duration = Duration::from_millis(20);

/// What one cell runs.
#[derive(Debug, Clone)]
pub struct CellPlan {
    /// Contender tasks.
    pub contenders: usize,
    /// Hold time inside the critical section, between GET and SET.
    pub hold: Duration,
    /// Distinct locks; contender `i` uses lock `i % locks`.
    pub locks: usize,
    /// Simulated client processes. Contender `i` is number `j = i / locks`
    /// of lock `l = i % locks` and runs on client `(l + j) % clients`: the
    /// contenders of every lock are spread round-robin over the clients
    /// (with one lock, contender `i` runs on client `i % clients`).
    pub clients: usize,
    /// Warm-up lasts at least this long...
    pub warmup_min: Duration,
    /// ...and at most this long, even if some contender never got the lock.
    pub warmup_max: Duration,
    /// The measured window.
    pub measure: Duration,
}

/// One attempt to take a lock, as nanoseconds since the cell's start.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Attempt {
    /// The contender task.
    pub task: u32,
    /// The lock index.
    pub lock: u32,
    /// When the task started waiting.
    pub wait_start: u64,
    /// When it got the lock, or stopped waiting without it
    /// ([`u64::MAX`] if it was still waiting when the cell stopped).
    pub end: u64,
    /// Whether `end` is an acquisition.
    pub acquired: bool,
    /// When the holder started releasing (acquired attempts only).
    pub release_start: u64,
    /// When the critical section's first command (its GET) was answered
    /// (0 if it was not): `first_reply - end` is how long the new holder's
    /// first command took, which is where work still running in Redis for
    /// the previous holder (its release, its next acquire) shows.
    #[serde(default)]
    pub first_reply: u64,
    /// The grant's queue ticket, for locks that have one (fairlock).
    pub ticket: Option<u64>,
    /// Wall-clock time of `wait_start`, µs since the Unix epoch: fairlock's
    /// tickets are the server's clock in µs (Redis runs on this machine,
    /// same clock), so `ticket - call_unix_us` is the time from the call to
    /// its enqueue script running in Redis.
    pub call_unix_us: u64,
}

/// Everything a cell recorded.
#[derive(Debug)]
pub struct CellRun {
    /// The plan it ran.
    pub plan: CellPlan,
    /// Every attempt of every task.
    pub attempts: Vec<Attempt>,
    /// The measured window, nanoseconds since the cell's start.
    pub window: (u64, u64),
    /// Whether every contender completed a cycle before the window.
    pub warmed_up: bool,
    /// `INFO commandstats` over the window.
    pub commandstats: BTreeMap<String, u64>,
    /// Counter GETs and SETs the harness completed in the window.
    pub data_gets: u64,
    /// See `data_gets`.
    pub data_sets: u64,
    /// Redis CPU seconds used in the window.
    pub redis_cpu_s: f64,
    /// CPU seconds this benchmark process (the lock clients and the
    /// harness) used in the window; `None` when the contenders ran in other
    /// processes.
    pub bench_cpu_s: Option<f64>,
    /// Completed critical sections per lock, over the whole cell.
    pub cs_completed: Vec<u64>,
    /// Final counter value per lock.
    pub counters: Vec<i64>,
    /// Failed acquires, releases and critical sections, and aborted tasks.
    pub errors: u64,
    /// The first error message seen, if any.
    pub first_error: Option<String>,
    /// PING round trips during the cell: (sent at, ns since start; µs).
    pub pings: Vec<(u64, f64)>,
}

/// What every contender of one process shares: counters, and the timers
/// of the holds.
pub(crate) struct Shared {
    first_cycles: AtomicUsize,
    pub(crate) data_gets: AtomicU64,
    pub(crate) data_sets: AtomicU64,
    /// Completed critical sections per lock. Counted here rather than in
    /// the task's log, so a task aborted at the stop deadline still counts
    /// the sections it completed and the violation count stays right.
    cs_completed: Vec<AtomicU64>,
    holds: HoldTimers,
}

impl Shared {
    /// Counters for the contenders of `locks` locks.
    pub(crate) fn new(locks: usize) -> Shared {
        Shared {
            first_cycles: AtomicUsize::new(0),
            data_gets: AtomicU64::new(0),
            data_sets: AtomicU64::new(0),
            cs_completed: (0..locks).map(|_| AtomicU64::new(0)).collect(),
            holds: HoldTimers::default(),
        }
    }

    /// Completed critical sections per lock so far.
    pub(crate) fn cs_completed(&self) -> Vec<u64> {
        self.cs_completed
            .iter()
            .map(|done| done.load(Ordering::SeqCst))
            .collect()
    }
}

/// What one contender task recorded.
#[derive(Default)]
pub(crate) struct TaskLog {
    pub(crate) attempts: Vec<Attempt>,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
}

impl TaskLog {
    fn error(&mut self, error: impl ToString) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(error.to_string());
        }
    }
}

/// The name of lock `index` (every implementation namespaces its own keys).
pub fn lock_name(index: usize) -> String {
    format!("bench-{index}")
}

pub(crate) fn counter_key(index: usize) -> String {
    format!("bench:{{bench-{index}}}:counter")
}

/// Runs one cell of implementation `imp` against the server behind `admin`.
pub async fn run_cell<L: LockImpl>(
    imp: &L,
    admin: &Admin,
    plan: &CellPlan,
    progress: &Progress,
) -> Result<CellRun> {
    admin.flushall().await?;
    let url = admin.url();
    let mut conns = Vec::with_capacity(plan.clients);
    let mut pools = Vec::with_capacity(plan.clients);
    let mut pinger = None;
    let connected = async {
        for _ in 0..plan.clients {
            conns.push(imp.connect(&url).await?);
            pools.push(fred_pool(&url, DATA_POOL_SIZE).await?);
        }
        pinger = Some(fred_client(&url).await?);
        Ok::<_, crate::impls::BenchError>(())
    }
    .await;
    let result = match (&connected, &pinger) {
        (Ok(()), Some(pinger)) => measure(&conns, &pools, pinger, admin, plan, progress).await,
        _ => Err(connected
            .err()
            .unwrap_or_else(|| "no PING connection".into())),
    };
    for conn in &conns {
        conn.close().await;
    }
    for pool in &pools {
        let _ = tokio::time::timeout(crate::impls::COMMAND_TIMEOUT, pool.quit()).await;
    }
    if let Some(pinger) = pinger {
        let _ = tokio::time::timeout(crate::impls::COMMAND_TIMEOUT, pinger.quit()).await;
    }
    result
}

async fn measure<C: LockConn>(
    conns: &[C],
    pools: &[Pool],
    pinger: &Client,
    admin: &Admin,
    plan: &CellPlan,
    progress: &Progress,
) -> Result<CellRun> {
    let base = Instant::now();
    let ns = move |t: Instant| t.saturating_duration_since(base).as_nanos() as u64;
    let shared = Arc::new(Shared::new(plan.locks));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut handles = Vec::with_capacity(plan.contenders);
    for task in 0..plan.contenders {
        let lock = task % plan.locks;
        let client = (lock + task / plan.locks) % plan.clients;
        handles.push(tokio::spawn(contender(
            conns[client].clone(),
            pools[client].clone(),
            Identity {
                task: task as u32,
                lock: lock as u32,
            },
            plan.hold,
            stop_rx.clone(),
            Arc::clone(&shared),
            base,
        )));
    }
    let pings = tokio::spawn(ping_loop(pinger.clone(), stop_rx.clone(), base));
    drop(stop_rx);

    // Warm-up.
    loop {
        let elapsed = base.elapsed();
        let all_cycled = shared.first_cycles.load(Ordering::SeqCst) == plan.contenders;
        if elapsed >= plan.warmup_max || (elapsed >= plan.warmup_min && all_cycled) {
            break;
        }
        progress.tick();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let warmed_up = shared.first_cycles.load(Ordering::SeqCst) == plan.contenders;

    // The window.
    let window = async {
        let cpu_before = admin.cpu_seconds().await?;
        admin.reset_stats().await?;
        let bench_cpu_before = process_cpu_seconds();
        let gets_before = shared.data_gets.load(Ordering::SeqCst);
        let sets_before = shared.data_sets.load(Ordering::SeqCst);
        let w0 = Instant::now();
        let w1 = w0 + plan.measure;
        while Instant::now() < w1 {
            progress.tick();
            let left = w1.saturating_duration_since(Instant::now());
            tokio::time::sleep(left.min(Duration::from_millis(100))).await;
        }
        let w1 = Instant::now();
        let bench_cpu = process_cpu_seconds()
            .zip(bench_cpu_before)
            .map(|(a, b)| a - b);
        let commandstats = admin.commandstats().await?;
        let gets = shared.data_gets.load(Ordering::SeqCst) - gets_before;
        let sets = shared.data_sets.load(Ordering::SeqCst) - sets_before;
        let cpu = admin.cpu_seconds().await? - cpu_before;
        Ok::<_, crate::impls::BenchError>((
            (ns(w0), ns(w1)),
            commandstats,
            gets,
            sets,
            cpu,
            bench_cpu,
        ))
    }
    .await;

    // Stop, whatever happened in the window.
    let _ = stop_tx.send(true);
    let hard_deadline = tokio::time::Instant::now() + STOP_GRACE;
    let mut attempts = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    for (task, handle) in handles.into_iter().enumerate() {
        let abort = handle.abort_handle();
        match tokio::time::timeout_at(hard_deadline, handle).await {
            Ok(Ok(log)) => {
                attempts.extend(log.attempts);
                errors += log.errors;
                first_error = first_error.or(log.first_error);
            }
            Ok(Err(join_error)) => {
                errors += 1;
                first_error = first_error.or(Some(format!("contender task failed: {join_error}")));
            }
            Err(_) => {
                abort.abort();
                errors += 1;
                first_error = first_error.or(Some(format!(
                    "contender {task} did not stop within {STOP_GRACE:?}"
                )));
            }
        }
    }
    let pings = match tokio::time::timeout_at(hard_deadline, pings).await {
        Ok(Ok(pings)) => pings,
        _ => Vec::new(),
    };
    let (window, commandstats, data_gets, data_sets, redis_cpu_s, bench_cpu_s) = window?;
    let keys: Vec<String> = (0..plan.locks).map(counter_key).collect();
    let counters = admin.counters(&keys).await?;

    Ok(CellRun {
        plan: plan.clone(),
        attempts,
        window,
        warmed_up,
        commandstats,
        data_gets,
        data_sets,
        redis_cpu_s,
        bench_cpu_s,
        cs_completed: shared.cs_completed(),
        counters,
        errors,
        first_error,
        pings,
    })
}

/// PINGs the server every [`PING_EVERY`] until stopped: the round trip
/// under the cell's own load.
pub(crate) async fn ping_loop(
    pinger: Client,
    mut stop: watch::Receiver<bool>,
    base: Instant,
) -> Vec<(u64, f64)> {
    let mut pings = Vec::new();
    loop {
        let sent = Instant::now();
        tokio::select! {
            reply = pinger.ping::<String>(None) => {
                if reply.is_ok() {
                    let at = sent.saturating_duration_since(base).as_nanos() as u64;
                    pings.push((at, sent.elapsed().as_secs_f64() * 1e6));
                }
            }
            _ = stopped(&mut stop) => break,
        }
        tokio::select! {
            _ = tokio::time::sleep(PING_EVERY) => {}
            _ = stopped(&mut stop) => break,
        }
    }
    pings
}

/// Which contender a task is, and which lock it takes.
pub(crate) struct Identity {
    pub(crate) task: u32,
    pub(crate) lock: u32,
}

pub(crate) async fn contender<C: LockConn>(
    conn: C,
    data: Pool,
    id: Identity,
    hold: Duration,
    mut stop: watch::Receiver<bool>,
    shared: Arc<Shared>,
    base: Instant,
) -> TaskLog {
    let ns = |t: Instant| t.saturating_duration_since(base).as_nanos() as u64;
    let name = lock_name(id.lock as usize);
    let counter = counter_key(id.lock as usize);
    let mut log = TaskLog::default();
    let mut cycled = false;
    loop {
        if *stop.borrow() {
            break;
        }
        let wait_start = Instant::now();
        let call_unix_us = unix_us();
        let acquired = tokio::select! {
            // A grant that is ready wins over the stop signal: the lock is
            // then used and released, never leaked.
            biased;
            held = conn.acquire(&name) => held,
            _ = stopped(&mut stop) => {
                log.attempts.push(Attempt {
                    task: id.task,
                    lock: id.lock,
                    wait_start: ns(wait_start),
                    end: u64::MAX,
                    acquired: false,
                    release_start: 0,
                    first_reply: 0,
                    ticket: None,
                    call_unix_us,
                });
                break;
            }
        };
        let held = match acquired {
            Ok(held) => held,
            Err(error) => {
                log.attempts.push(Attempt {
                    task: id.task,
                    lock: id.lock,
                    wait_start: ns(wait_start),
                    end: ns(Instant::now()),
                    acquired: false,
                    release_start: 0,
                    first_reply: 0,
                    ticket: None,
                    call_unix_us,
                });
                log.error(format!("acquire: {error}"));
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        let acquired_at = Instant::now();
        let ticket = C::ticket(&held);
        let mut first_reply = None;
        match critical_section(&data, &counter, hold, &shared, &mut first_reply).await {
            Ok(()) => {
                shared.cs_completed[id.lock as usize].fetch_add(1, Ordering::SeqCst);
            }
            Err(error) => log.error(format!("critical section: {error}")),
        }
        let release_start = Instant::now();
        if let Err(error) = conn.release(held).await {
            log.error(format!("release: {error}"));
        }
        if !cycled {
            cycled = true;
            shared.first_cycles.fetch_add(1, Ordering::SeqCst);
        }
        log.attempts.push(Attempt {
            task: id.task,
            lock: id.lock,
            wait_start: ns(wait_start),
            end: ns(acquired_at),
            acquired: true,
            release_start: ns(release_start),
            first_reply: first_reply.map_or(0, ns),
            ticket,
            call_unix_us,
        });
    }
    log
}

/// CPU time (user + system) this process has used so far, seconds.
fn process_cpu_seconds() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given; it is read only when
    // the call succeeded.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

/// Now, in µs since the Unix epoch.
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Resolves once the stop signal is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The protected work: a non-atomic read-modify-write of a counter, so a
/// second holder at the same time loses an update. The hold between GET
/// and SET is `hold.rs`'s precise timer, the same for every implementation.
/// `first_reply` is set when the GET is answered.
async fn critical_section(
    data: &Pool,
    counter: &str,
    hold: Duration,
    shared: &Shared,
    first_reply: &mut Option<Instant>,
) -> Result<()> {
    let value: Option<i64> = data.get(counter).await?;
    *first_reply = Some(Instant::now());
    shared.data_gets.fetch_add(1, Ordering::SeqCst);
    shared.holds.hold(hold).await?;
    let _: () = data
        .set(counter, value.unwrap_or(0) + 1, None, None, false)
        .await?;
    shared.data_sets.fetch_add(1, Ordering::SeqCst);
    Ok(())
}
