//! The demo (`examples/demo.rs`): a swarm of workers on several clients
//! contends for one lock, and the run checks two invariants: a non-atomic
//! counter updated under the lock lost no update, and grants followed
//! queue-ticket order (nobody overtook an older waiter).
//!
//! Whatever ends the run (its time is up, the caller's stop signal such as
//! Ctrl-C, or a worker's error) every client is shut down before [`run`]
//! returns: nothing the demo queued or held is left in Redis, which
//! matters when it runs against a shared server (`REDIS_URL`).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::{LockClient, LockOptions};
use tokio::task::JoinSet;

/// The lock every worker contends for.
pub const LOCK: &str = "demo";

/// The swarm's shape.
#[derive(Clone, Copy, Debug)]
pub struct DemoConfig {
    /// Lock clients (each with its own connections).
    pub clients: usize,
    /// Worker tasks per client.
    pub workers_per_client: usize,
    /// How long workers keep taking the lock.
    pub run_for: Duration,
    /// How long a worker holds the lock each time.
    pub hold: Duration,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            clients: 4,
            workers_per_client: 12,
            run_for: Duration::from_secs(3),
            hold: Duration::from_millis(1),
        }
    }
}

/// Why a run failed.
pub type DemoError = Box<dyn std::error::Error + Send + Sync>;

/// One grant, as a worker saw it.
#[derive(Clone, Debug)]
pub struct Grant {
    /// The worker (0-based).
    pub worker: usize,
    /// The queue ticket it waited with (`None`: granted at once).
    pub ticket: Option<u64>,
    /// From the `lock_with` call to its return.
    pub waited: Duration,
}

/// What a run saw.
#[derive(Debug)]
pub struct DemoReport {
    /// The swarm's shape.
    pub config: DemoConfig,
    /// Every grant, in the order the workers logged them (under the lock).
    pub grants: Vec<Grant>,
    /// The non-atomic counter's final value.
    pub counter: u64,
    /// Whether the caller's stop signal ended the run early.
    pub interrupted: bool,
}

impl DemoReport {
    /// Increments the counter lost: 0 unless two workers overlapped.
    pub fn lost_updates(&self) -> u64 {
        (self.grants.len() as u64).saturating_sub(self.counter)
    }

    /// Grants whose ticket is below the previous queued grant's.
    pub fn overtakes(&self) -> usize {
        let tickets: Vec<u64> = self.grants.iter().filter_map(|g| g.ticket).collect();
        tickets.windows(2).filter(|w| w[1] < w[0]).count()
    }

    /// Both invariants held.
    pub fn passed(&self) -> bool {
        self.counter == self.grants.len() as u64 && self.overtakes() == 0
    }

    /// Prints the grant order, counts, wait percentiles and fairness.
    pub fn print(&self) {
        let workers = self.config.clients * self.config.workers_per_client;
        let first: Vec<String> = self
            .grants
            .iter()
            .take(24)
            .map(|g| format!("w{:02}", g.worker))
            .collect();
        println!("grant order (first {}): {}", first.len(), first.join(" "));
        let queued = self.grants.iter().filter(|g| g.ticket.is_some()).count();
        let run_for = self.config.run_for;
        println!(
            "grants: {} in {:?} ({:.0}/s), {} after waiting in the queue; out of ticket order: {}",
            self.grants.len(),
            run_for,
            self.grants.len() as f64 / run_for.as_secs_f64(),
            queued,
            self.overtakes()
        );
        println!(
            "counter: {} increments for {} grants: {}",
            self.counter,
            self.grants.len(),
            if self.lost_updates() == 0 {
                "no lost update"
            } else {
                "LOST UPDATES"
            }
        );
        let mut waits: Vec<Duration> = self.grants.iter().map(|g| g.waited).collect();
        waits.sort();
        if !waits.is_empty() {
            let pct = |p: f64| waits[((waits.len() - 1) as f64 * p).round() as usize];
            println!(
                "wait: p50 {:.1?}  p90 {:.1?}  p99 {:.1?}  max {:.1?}",
                pct(0.50),
                pct(0.90),
                pct(0.99),
                pct(1.0)
            );
        }
        let mut counts = vec![0u64; workers];
        for grant in &self.grants {
            if let Some(count) = counts.get_mut(grant.worker) {
                *count += 1;
            }
        }
        let sum: f64 = counts.iter().map(|&c| c as f64).sum();
        let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
        let jain = if squares > 0.0 {
            sum * sum / (workers as f64 * squares)
        } else {
            0.0
        };
        println!("grants per worker (Jain's fairness index {jain:.3}):");
        for (row, cells) in counts.chunks(12).enumerate() {
            let cells: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| format!("w{:02}:{c:<3}", row * 12 + i))
                .collect();
            println!("  {}", cells.join(" "));
        }
    }
}

/// Runs the swarm against the Redis at `url` until `config.run_for` has
/// passed or `stop` completes (then the report says `interrupted`).
///
/// # Errors
///
/// The first error of a connect or of a worker's lock call; the other
/// workers are stopped and every client shut down first.
pub async fn run(
    url: &str,
    config: DemoConfig,
    stop: impl Future<Output = ()>,
) -> Result<DemoReport, DemoError> {
    let mut clients = Vec::new();
    for _ in 0..config.clients {
        match LockClient::connect(url).await {
            Ok(client) => clients.push(client),
            Err(error) => {
                shut_down(&clients).await;
                return Err(error.into());
            }
        }
    }
    let counter = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(Mutex::new(Vec::new()));
    let stop_at = Instant::now() + config.run_for;
    let mut workers = JoinSet::new();
    for worker in 0..config.clients * config.workers_per_client {
        let client = clients[worker % config.clients].clone();
        let counter = Arc::clone(&counter);
        let grants = Arc::clone(&grants);
        workers.spawn(async move {
            while Instant::now() < stop_at {
                let started = Instant::now();
                let guard = client
                    .lock_with(
                        LOCK,
                        LockOptions::new().wait_timeout(Duration::from_secs(30)),
                    )
                    .await?;
                let waited = started.elapsed();
                // A deliberately non-atomic read-modify-write: only the
                // lock keeps it correct.
                let value = counter.load(Ordering::Relaxed);
                tokio::time::sleep(config.hold).await;
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
            Ok::<(), DemoError>(())
        });
    }
    let outcome = tokio::select! {
        outcome = all_finished(&mut workers) => outcome.map(|()| false),
        () = stop => Ok(true),
    };
    // Stopped early or failed: the workers left are dropped here, their
    // guards and queued acquires released and cancelled in the background,
    // and the shutdown below waits for those to finish.
    workers.shutdown().await;
    shut_down(&clients).await;
    let interrupted = outcome?;
    let grants = std::mem::take(&mut *grants.lock().map_err(|_| "grant log poisoned")?);
    Ok(DemoReport {
        config,
        grants,
        counter: counter.load(Ordering::Relaxed),
        interrupted,
    })
}

/// Waits for every worker; the first error (or panic) ends the wait.
async fn all_finished(workers: &mut JoinSet<Result<(), DemoError>>) -> Result<(), DemoError> {
    while let Some(joined) = workers.join_next().await {
        joined.map_err(|error| format!("a worker failed: {error}"))??;
    }
    Ok(())
}

async fn shut_down(clients: &[LockClient]) {
    for client in clients {
        client.shutdown().await;
    }
}
