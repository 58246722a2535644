//! FIFO across OS processes: one hot lock whose contenders live in several
//! real OS processes (this binary started again as workers), not in
//! simulated clients of one process. Nothing is shared between them but
//! Redis and the machine's clock, so this is the order callers in
//! different services see.
//!
//! Every worker lines its clock up with the parent's: the parent picks a
//! start time on the wall clock (µs since the Unix epoch, one clock for
//! every process of the machine), and each worker maps it onto its own
//! monotonic clock once, so all attempts land on one time line. The
//! parent takes the window's Redis statistics, as `cell.rs` does for one
//! process, and merges the workers' attempts into one [`CellRun`], so the
//! statistics and the report are the same as for every other cell.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::prelude::ClientLike;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::admin::Admin;
use crate::cell::{
    contender, counter_key, ping_loop, Attempt, CellPlan, CellRun, Identity, Shared, TaskLog,
    DATA_POOL_SIZE, STOP_GRACE,
};
use crate::impls::{fred_client, fred_pool, Implementation, LockConn, LockImpl, Result};
use crate::progress::Progress;

/// The argument that starts this binary as a worker.
pub const WORKER_FLAG: &str = "--process-worker";

/// Time the workers get to start and connect before the cell begins.
const START_LEAD: Duration = Duration::from_secs(3);

/// What one worker process runs, passed as JSON on its command line.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerSpec {
    implementation: String,
    url: String,
    /// The worker's contenders are tasks `first_task`, `first_task +
    /// processes`, ... (`tasks` of them), as contender `i` of a cell runs
    /// in process `i % processes`.
    first_task: u32,
    tasks: u32,
    processes: u32,
    hold_us: u64,
    /// The cell's start, and its window, ns since the Unix epoch.
    start_unix_ns: u64,
    window_start_unix_ns: u64,
    window_end_unix_ns: u64,
}

/// What a worker prints when it is done: times in ns since the cell's
/// start.
#[derive(Debug, Default, Serialize, Deserialize)]
struct WorkerReport {
    attempts: Vec<Attempt>,
    cs_completed: u64,
    errors: u64,
    first_error: Option<String>,
    data_gets_in_window: u64,
    data_sets_in_window: u64,
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// This process's monotonic instant for wall-clock time `unix_ns`.
fn instant_at(at_unix_ns: u64) -> Instant {
    let (now, now_unix) = (Instant::now(), unix_ns());
    if at_unix_ns >= now_unix {
        now + Duration::from_nanos(at_unix_ns - now_unix)
    } else {
        now.checked_sub(Duration::from_nanos(now_unix - at_unix_ns))
            .unwrap_or(now)
    }
}

/// Runs one cell of `imp` with its contenders spread over `processes` OS
/// processes (contender `i` in process `i % processes`).
pub async fn run_cell_in_processes(
    imp: Implementation,
    admin: &Admin,
    plan: &CellPlan,
    processes: usize,
    progress: &Progress,
) -> Result<CellRun> {
    admin.flushall().await?;
    let url = admin.url();
    // Warm-up: long enough for every contender to cycle once at this
    // machine's pace, within the plan's bounds; the record says whether
    // they all did.
    let warmup = (plan.warmup_min + Duration::from_micros(plan.contenders as u64 * 4_000))
        .min(plan.warmup_max);
    let start = unix_ns() + START_LEAD.as_nanos() as u64;
    let window_start = start + warmup.as_nanos() as u64;
    let window_end = window_start + plan.measure.as_nanos() as u64;
    let exe = std::env::current_exe()?;
    let mut children = Vec::with_capacity(processes);
    for process in 0..processes {
        let tasks = (plan.contenders + processes - 1 - process) / processes;
        let spec = WorkerSpec {
            implementation: imp.label().to_owned(),
            url: url.clone(),
            first_task: process as u32,
            tasks: tasks as u32,
            processes: processes as u32,
            hold_us: plan.hold.as_micros() as u64,
            start_unix_ns: start,
            window_start_unix_ns: window_start,
            window_end_unix_ns: window_end,
        };
        let child = Command::new(&exe)
            .arg(WORKER_FLAG)
            .arg(serde_json::to_string(&spec)?)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        children.push(child);
    }
    let outputs = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|child| child.wait_with_output())
            .collect::<Vec<_>>()
    });

    let base = instant_at(start);
    let pinger = fred_client(&url).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let pings = tokio::spawn(ping_loop(pinger.clone(), stop_rx, base));
    sleep_until(instant_at(window_start), progress).await;
    let cpu_before = admin.cpu_seconds().await?;
    admin.reset_stats().await?;
    sleep_until(instant_at(window_end), progress).await;
    let commandstats = admin.commandstats().await?;
    let redis_cpu_s = admin.cpu_seconds().await? - cpu_before;
    let _ = stop_tx.send(true);
    let pings = pings.await.unwrap_or_default();
    let _ = tokio::time::timeout(crate::impls::COMMAND_TIMEOUT, pinger.quit()).await;

    let mut merged = WorkerReport::default();
    for output in outputs.await? {
        let output = output?;
        if !output.status.success() {
            return Err(format!("a worker process failed: {}", output.status).into());
        }
        let report: WorkerReport = serde_json::from_slice(&output.stdout)?;
        merged.attempts.extend(report.attempts);
        merged.cs_completed += report.cs_completed;
        merged.errors += report.errors;
        merged.first_error = merged.first_error.or(report.first_error);
        merged.data_gets_in_window += report.data_gets_in_window;
        merged.data_sets_in_window += report.data_sets_in_window;
    }
    let window = (
        window_start.saturating_sub(start),
        window_end.saturating_sub(start),
    );
    // Warmed up: every contender got the lock once before the window.
    let mut cycled = vec![false; plan.contenders];
    for attempt in &merged.attempts {
        if attempt.acquired && attempt.end < window.0 {
            if let Some(flag) = cycled.get_mut(attempt.task as usize) {
                *flag = true;
            }
        }
    }
    let counters = admin.counters(&[counter_key(0)]).await?;
    Ok(CellRun {
        plan: CellPlan {
            clients: processes,
            ..plan.clone()
        },
        attempts: merged.attempts,
        window,
        warmed_up: cycled.iter().all(|c| *c),
        commandstats,
        data_gets: merged.data_gets_in_window,
        data_sets: merged.data_sets_in_window,
        redis_cpu_s,
        bench_cpu_s: None,
        cs_completed: vec![merged.cs_completed],
        counters,
        errors: merged.errors,
        first_error: merged.first_error,
        pings,
    })
}

async fn sleep_until(at: Instant, progress: &Progress) {
    while Instant::now() < at {
        progress.tick();
        let left = at.saturating_duration_since(Instant::now());
        tokio::time::sleep(left.min(Duration::from_millis(100))).await;
    }
}

/// The worker's `main`: runs its share of the contenders and prints its
/// report as JSON on stdout.
pub fn worker_main(spec: &str) -> std::result::Result<(), String> {
    let spec: WorkerSpec = serde_json::from_str(spec).map_err(|e| format!("bad spec: {e}"))?;
    let imp = Implementation::from_label(&spec.implementation)
        .ok_or_else(|| format!("unknown implementation {:?}", spec.implementation))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))?;
    let report = crate::with_impl!(imp, lock => runtime.block_on(worker(&lock, &spec)))
        .map_err(|e| e.to_string())?;
    let json = serde_json::to_string(&report).map_err(|e| e.to_string())?;
    println!("{json}");
    Ok(())
}

async fn worker<L: LockImpl>(lock: &L, spec: &WorkerSpec) -> Result<WorkerReport> {
    let conn = lock.connect(&spec.url).await?;
    let data = fred_pool(&spec.url, DATA_POOL_SIZE).await?;
    let base = instant_at(spec.start_unix_ns);
    tokio::time::sleep_until(base.into()).await;
    let shared = Arc::new(Shared::new(1));
    let (stop_tx, stop_rx) = watch::channel(false);
    let handles: Vec<_> = (0..spec.tasks)
        .map(|i| {
            tokio::spawn(contender(
                conn.clone(),
                data.clone(),
                Identity {
                    task: spec.first_task + i * spec.processes,
                    lock: 0,
                },
                Duration::from_micros(spec.hold_us),
                stop_rx.clone(),
                Arc::clone(&shared),
                base,
            ))
        })
        .collect();
    drop(stop_rx);
    let counts = |shared: &Shared| {
        (
            shared.data_gets.load(std::sync::atomic::Ordering::SeqCst),
            shared.data_sets.load(std::sync::atomic::Ordering::SeqCst),
        )
    };
    tokio::time::sleep_until(instant_at(spec.window_start_unix_ns).into()).await;
    let (gets0, sets0) = counts(&shared);
    tokio::time::sleep_until(instant_at(spec.window_end_unix_ns).into()).await;
    let (gets1, sets1) = counts(&shared);
    let _ = stop_tx.send(true);

    let mut report = WorkerReport {
        data_gets_in_window: gets1 - gets0,
        data_sets_in_window: sets1 - sets0,
        ..WorkerReport::default()
    };
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    for handle in handles {
        let abort = handle.abort_handle();
        match tokio::time::timeout_at(deadline, handle).await {
            Ok(Ok(log)) => merge(&mut report, log),
            Ok(Err(join)) => {
                report.errors += 1;
                report.first_error = report
                    .first_error
                    .or(Some(format!("contender task failed: {join}")));
            }
            Err(_) => {
                abort.abort();
                report.errors += 1;
                report.first_error = report.first_error.or(Some(format!(
                    "a contender did not stop within {STOP_GRACE:?}"
                )));
            }
        }
    }
    report.cs_completed = shared.cs_completed().iter().sum();
    conn.close().await;
    let _ = tokio::time::timeout(crate::impls::COMMAND_TIMEOUT, data.quit()).await;
    Ok(report)
}

fn merge(report: &mut WorkerReport, log: TaskLog) {
    report.attempts.extend(log.attempts);
    report.errors += log.errors;
    report.first_error = report.first_error.take().or(log.first_error);
}
