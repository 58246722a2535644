//! A swarm of workers on several clients contends for one lock.
//!
//! Run it with `cargo run --release -p fairlock-examples --example demo`.
//! Without `REDIS_URL` it starts a throwaway redis-server on 127.0.0.1 (and
//! installs redis-server with apt-get first when run as root on Debian).
//!
//! It prints the order of the first grants, how often each worker got the
//! lock, wait-time percentiles, and checks two invariants: a non-atomic
//! counter updated under the lock lost no update, and grants followed
//! queue-ticket order (nobody overtook an older waiter).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::{LockClient, LockOptions};
use fairlock_testkit::RedisTarget;

const CLIENTS: usize = 4;
const WORKERS_PER_CLIENT: usize = 12;
const RUN_FOR: Duration = Duration::from_secs(3);
const HOLD: Duration = Duration::from_millis(1);

struct Grant {
    worker: usize,
    ticket: Option<u64>,
    waited: Duration,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let target = RedisTarget::from_env_or_start()?;
    println!("{}", target.describe());
    let workers = CLIENTS * WORKERS_PER_CLIENT;
    println!(
        "{workers} workers on {CLIENTS} clients contend for lock \"demo\" for {RUN_FOR:?}, holding it {HOLD:?} each time\n"
    );

    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(LockClient::connect(&target.url()).await?);
    }
    let counter = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(Mutex::new(Vec::new()));
    let stop_at = Instant::now() + RUN_FOR;

    let mut tasks = Vec::new();
    for worker in 0..workers {
        let client = clients[worker % CLIENTS].clone();
        let counter = Arc::clone(&counter);
        let grants = Arc::clone(&grants);
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                let started = Instant::now();
                let guard = client
                    .lock_with(
                        "demo",
                        LockOptions::new().wait_timeout(Duration::from_secs(30)),
                    )
                    .await?;
                let waited = started.elapsed();
                // A deliberately non-atomic read-modify-write: only the lock
                // keeps it correct.
                let value = counter.load(Ordering::Relaxed);
                tokio::time::sleep(HOLD).await;
                counter.store(value + 1, Ordering::Relaxed);
                grants
                    .lock()
                    .map_err(|_| "grant log poisoned")?
                    .push(Grant {
                        worker,
                        ticket: guard.ticket(),
                        waited,
                    });
                guard.release().await?;
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for task in tasks {
        task.await?.map_err(|e| e.to_string())?;
    }

    let grants = std::mem::take(&mut *grants.lock().map_err(|_| "grant log poisoned")?);
    report(&grants, counter.load(Ordering::Relaxed), workers);
    Ok(())
}

fn report(grants: &[Grant], counter: u64, workers: usize) {
    let first: Vec<String> = grants
        .iter()
        .take(24)
        .map(|g| format!("w{:02}", g.worker))
        .collect();
    println!("grant order (first {}): {}", first.len(), first.join(" "));

    let tickets: Vec<u64> = grants.iter().filter_map(|g| g.ticket).collect();
    let overtakes = tickets.windows(2).filter(|w| w[1] < w[0]).count();
    println!(
        "grants: {} in {:?} ({:.0}/s), {} after waiting in the queue; out of ticket order: {}",
        grants.len(),
        RUN_FOR,
        grants.len() as f64 / RUN_FOR.as_secs_f64(),
        tickets.len(),
        overtakes
    );
    println!(
        "counter: {counter} increments for {} grants: {}",
        grants.len(),
        if counter == grants.len() as u64 {
            "no lost update"
        } else {
            "LOST UPDATES"
        }
    );

    let mut waits: Vec<Duration> = grants.iter().map(|g| g.waited).collect();
    waits.sort();
    let pct = |p: f64| waits[((waits.len() - 1) as f64 * p).round() as usize];
    if !waits.is_empty() {
        println!(
            "wait: p50 {:.1?}  p90 {:.1?}  p99 {:.1?}  max {:.1?}",
            pct(0.50),
            pct(0.90),
            pct(0.99),
            pct(1.0)
        );
    }

    let mut counts = vec![0u64; workers];
    for grant in grants {
        counts[grant.worker] += 1;
    }
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    let jain = if squares > 0.0 {
        sum * sum / (workers as f64 * squares)
    } else {
        0.0
    };
    println!("grants per worker (Jain's fairness index {jain:.3}):");
    for row in counts.chunks(12).enumerate() {
        let cells: Vec<String> = row
            .1
            .iter()
            .enumerate()
            .map(|(i, c)| format!("w{:02}:{c:<3}", row.0 * 12 + i))
            .collect();
        println!("  {}", cells.join(" "));
    }
}
