//! RedLock over independent primaries: what one lock cycle costs, how
//! contention is shared out, and that a dead minority changes neither.
//!
//! Without `REDLOCK_URLS` (comma-separated) it starts `REDLOCK_N` (3 by
//! default) throwaway redis-servers on 127.0.0.1 and, half way through the
//! contended run, kills a minority of them.
//!
//! ```sh
//! cargo run --release -p fairlock-examples --example redlock
//! ```
//!
//! It prints the uncontended acquire + release latency, then for 16 workers
//! on 2 clients over 4 s: cycles per second, wait percentiles, grants per
//! worker with Jain's fairness index (RedLock has no queue: see how even it
//! is), and checks that a non-atomic counter lost no update and that the
//! fencing tokens strictly increased. Exit code 0 when both held, 1 when
//! one broke or on an error (printed as a message).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::redlock::{RedLock, RedLockConfig};
use fairlock_testkit::IndependentPrimaries;

const WORKERS_PER_CLIENT: usize = 8;
const CLIENTS: usize = 2;
const RUN: Duration = Duration::from_secs(4);

/// A failed lock call waits this long before the worker tries again (a
/// lost majority answers at once; a worker must not spin on it).
const RETRY_AFTER: Duration = Duration::from_millis(50);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("redlock: an invariant broke (see above)");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("redlock: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The whole run; `Ok(false)` when an invariant broke.
async fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let mut local = None;
    let urls: Vec<String> = match std::env::var("REDLOCK_URLS") {
        Ok(urls) => urls.split(',').map(str::to_owned).collect(),
        Err(_) => {
            let n = std::env::var("REDLOCK_N")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(3);
            let primaries = IndependentPrimaries::start(n)?;
            let urls = primaries.urls();
            local = Some(primaries);
            urls
        }
    };
    let n = urls.len();
    let mut config = RedLockConfig::new(urls);
    // Fresh local servers: the delayed-restart rule would keep them from
    // voting for a minute (nothing is restarted here).
    if local.is_some() {
        config.restart_delay = Duration::ZERO;
    }

    // Uncontended acquire + release.
    let redlock = RedLock::with_config(config.clone()).await?;
    let mut cycle = Vec::new();
    for _ in 0..500 {
        let started = Instant::now();
        let guard = redlock.lock("redlock-demo:solo").await?;
        guard.release().await?;
        cycle.push(started.elapsed());
    }
    cycle.sort();
    println!(
        "{n} primaries, uncontended acquire+release: p50 {:.2?}  p99 {:.2?}",
        cycle[cycle.len() / 2],
        cycle[cycle.len() * 99 / 100]
    );

    // Contended.
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(RedLock::with_config(config.clone()).await?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let waits = Arc::new(Mutex::new(Vec::new()));
    let failures = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for client in &clients {
        for _ in 0..WORKERS_PER_CLIENT {
            let (client, stop, counter, tokens, waits, failures) = (
                client.clone(),
                Arc::clone(&stop),
                Arc::clone(&counter),
                Arc::clone(&tokens),
                Arc::clone(&waits),
                Arc::clone(&failures),
            );
            workers.push(tokio::spawn(async move {
                let mut grants = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let guard = match client.lock("redlock-demo:hot").await {
                        Ok(guard) => guard,
                        Err(error) => {
                            // Printed once; counted always.
                            if failures.fetch_add(1, Ordering::Relaxed) == 0 {
                                eprintln!("a lock call failed (retrying): {error}");
                            }
                            tokio::time::sleep(RETRY_AFTER).await;
                            continue;
                        }
                    };
                    let waited = asked.elapsed();
                    let read = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(read + 1, Ordering::SeqCst);
                    push(&tokens, guard.token().value());
                    push(&waits, waited);
                    grants += 1;
                    let _ = guard.release().await;
                }
                grants
            }));
        }
    }
    tokio::time::sleep(RUN / 2).await;
    if let Some(primaries) = local.as_mut() {
        let minority: Vec<usize> = (0..(n - 1) / 2).collect();
        primaries.kill(&minority);
        println!("killed primaries {minority:?} half way");
    }
    tokio::time::sleep(RUN / 2).await;
    stop.store(true, Ordering::Relaxed);
    let mut per_worker = Vec::new();
    for worker in workers {
        per_worker.push(worker.await?);
    }
    let total: u64 = per_worker.iter().sum();
    let mut waits = std::mem::take(&mut *waits.lock().map_err(|_| "poisoned")?);
    waits.sort();
    let tokens = std::mem::take(&mut *tokens.lock().map_err(|_| "poisoned")?);
    let increasing = tokens.windows(2).all(|w| w[0] < w[1]);
    let sum: f64 = per_worker.iter().map(|&g| g as f64).sum();
    let squares: f64 = per_worker.iter().map(|&g| (g as f64).powi(2)).sum();
    let jain = if squares > 0.0 {
        sum * sum / (per_worker.len() as f64 * squares)
    } else {
        0.0
    };
    println!(
        "contended ({} workers on {CLIENTS} clients, {RUN:?}): {total} grants ({:.0}/s)",
        per_worker.len(),
        total as f64 / RUN.as_secs_f64()
    );
    if !waits.is_empty() {
        println!(
            "wait: p50 {:.1?}  p90 {:.1?}  p99 {:.1?}  max {:.1?}",
            waits[waits.len() / 2],
            waits[waits.len() * 9 / 10],
            waits[waits.len() * 99 / 100],
            waits[waits.len() - 1]
        );
    }
    println!("grants per worker: {per_worker:?} (Jain's fairness index {jain:.3})");
    let no_lost_update = counter.load(Ordering::SeqCst) == total;
    println!(
        "counter: {} for {total} grants: {}; tokens strictly increasing: {increasing}; failed lock calls: {}",
        counter.load(Ordering::SeqCst),
        if no_lost_update {
            "no lost update"
        } else {
            "LOST UPDATES"
        },
        failures.load(Ordering::Relaxed)
    );
    Ok(no_lost_update && increasing)
}

fn push<T>(list: &Mutex<Vec<T>>, value: T) {
    if let Ok(mut list) = list.lock() {
        list.push(value);
    }
}
