//! A worker swarm that keeps every fairlock metric moving, served to
//! Prometheus on `/metrics`.
//!
//! ```sh
//! cargo run --release -p fairlock-examples --example metrics_swarm
//! curl -s http://127.0.0.1:9464/metrics | grep fairlock_
//! ```
//!
//! Environment:
//!
//! * `METRICS_ADDR`: where `/metrics` is served (default `127.0.0.1:9464`);
//! * `RUN_SECS`: how long the swarm runs before it exits (default 30);
//! * `REDIS_URL`: the Redis to use; unset, a throwaway redis-server is
//!   started on 127.0.0.1 (installed with apt-get first when run as root on
//!   Debian).
//!
//! 4 clients, 49 tasks, a few locks, and a timeline:
//!
//! * 40 buyers take `sku:1` (half the time), `sku:2` or `sku:3` with a
//!   80 ms wait timeout, hold it 0.5-3 ms and think 50-100 ms. One
//!   attempt in ten gives up from outside after 50 ms instead (a dropped
//!   future: `outcome="cancelled"`).
//! * From 40 % to 60 % of the run, a flash sale on `sku:1`: every buyer
//!   wants it and nobody thinks. The queue grows, waits approach the
//!   timeout, and timeouts and cancellations appear.
//! * 6 browsers `try_lock` a random SKU (`outcome="busy"` when taken).
//! * 1 sloppy worker holds `sku:3` under a fixed 20 ms lease and overruns it
//!   one time in fifty (`fairlock_lease_lost_total`).
//! * 1 reporter holds `report` for 5 s under the watchdog (3 s lease,
//!   renewed every second), and an admin task force-releases it every 11 s
//!   (`fairlock_lease_renewals_total{result="lost"}`).
//! * At 75 % of a run of 20 s or more, only when the swarm started its own
//!   redis-server, Redis stalls for 2.5 s (`CLIENT PAUSE`, as in a failover): with a 1 s
//!   command timeout, calls fail (`outcome="error"`,
//!   `fairlock_lease_renewals_total{result="error"}`) and the workers back
//!   off and carry on.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{ClientConfig, Error, LockClient, LockGuard, LockOptions};
use fairlock_testkit::RedisTarget;

const CLIENTS: usize = 4;
const BUYERS: usize = 40;
const BROWSERS: usize = 6;
const SKUS: [&str; 3] = ["sku:1", "sku:2", "sku:3"];

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the swarm did, for the progress lines (Prometheus has the rest).
#[derive(Default)]
struct Tally {
    acquired: AtomicU64,
    timeouts: AtomicU64,
    cancelled: AtomicU64,
    busy: AtomicU64,
    leases_lost: AtomicU64,
    errors: AtomicU64,
}

impl Tally {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn line(&self) -> String {
        format!(
            "acquired {}  timeout {}  cancelled {}  busy {}  leases lost {}  errors {}",
            self.acquired.load(Ordering::Relaxed),
            self.timeouts.load(Ordering::Relaxed),
            self.cancelled.load(Ordering::Relaxed),
            self.busy.load(Ordering::Relaxed),
            self.leases_lost.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }
}

/// The run's clock: when it ends, and whether the flash sale is on.
#[derive(Clone, Copy)]
struct Schedule {
    start: Instant,
    run_for: Duration,
}

impl Schedule {
    fn running(&self) -> bool {
        self.start.elapsed() < self.run_for
    }

    fn progress(&self) -> f64 {
        self.start.elapsed().as_secs_f64() / self.run_for.as_secs_f64()
    }

    fn flash_sale(&self) -> bool {
        (0.4..0.6).contains(&self.progress())
    }

    fn end(&self) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.start + self.run_for)
    }
}

/// The Redis stall needs a run long enough to show a before and an after.
const STALL_MIN_RUN: Duration = Duration::from_secs(20);
/// The key and channel prefix of every swarm client: its locks (and the
/// admin's force releases) never touch an application's `fairlock:` keys.
const SWARM_PREFIX: &str = "fairlock-swarm:";

/// A tiny xorshift generator: the swarm needs variety, not quality.
struct Rng(u64);

impl Rng {
    fn new(seed: usize) -> Self {
        Rng(0x9E37_79B9_7F4A_7C15 ^ (seed as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `[low, high)` milliseconds, with microsecond steps.
    fn millis(&mut self, low: f64, high: f64) -> Duration {
        let unit = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        Duration::from_secs_f64((low + (high - low) * unit) / 1000.0)
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.next().is_multiple_of(n)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr: SocketAddr = env_or("METRICS_ADDR", "127.0.0.1:9464")
        .parse()
        .map_err(|e| format!("METRICS_ADDR is not an address like 127.0.0.1:9464: {e}"))?;
    let run_secs: u64 = env_or("RUN_SECS", "30")
        .parse()
        .map_err(|e| format!("RUN_SECS is not a whole number of seconds: {e}"))?;

    // Install the recorder before the first client records anything.
    fairlock_metrics::install_prometheus(addr)?;
    println!(
        "metrics: http://{addr}/metrics (Prometheus text format; set METRICS_ADDR to move it)"
    );

    let target = RedisTarget::from_env_or_start()?;
    println!("{}", target.describe());
    println!(
        "swarm: {BUYERS} buyers, {BROWSERS} browsers, a sloppy worker, a reporter and an admin on {CLIENTS} clients, for {run_secs} s (RUN_SECS)"
    );
    println!(
        "timeline: flash sale on sku:1 from {:.0} s to {:.0} s; {}\n",
        run_secs as f64 * 0.4,
        run_secs as f64 * 0.6,
        match target.local() {
            Some(_) if Duration::from_secs(run_secs) >= STALL_MIN_RUN =>
                format!("Redis stalls for 2.5 s at {:.0} s", run_secs as f64 * 0.75),
            Some(_) => format!("no Redis stall (runs shorter than {STALL_MIN_RUN:?})"),
            None => "no Redis stall (REDIS_URL is not ours to pause)".to_owned(),
        }
    );

    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        // A prefix of its own: the admin force-releases "report", which
        // must never be an application's lock on a shared REDIS_URL. A
        // short watchdog lease so renewals show within a short run, and a
        // command timeout shorter than the Redis stall.
        let config = ClientConfig::builder(target.url())
            .prefix(SWARM_PREFIX)
            .watchdog_lease(Duration::from_secs(3))
            .command_timeout(Duration::from_secs(1))
            .build()?;
        clients.push(LockClient::with_config(config).await?);
    }
    let schedule = Schedule {
        start: Instant::now(),
        run_for: Duration::from_secs(run_secs),
    };
    let tally = Arc::new(Tally::default());

    let mut tasks = tokio::task::JoinSet::new();
    for id in 0..BUYERS {
        let (client, tally) = (clients[id % CLIENTS].clone(), Arc::clone(&tally));
        tasks.spawn(buyer(client, tally, schedule, Rng::new(id)));
    }
    for id in 0..BROWSERS {
        let (client, tally) = (clients[id % CLIENTS].clone(), Arc::clone(&tally));
        tasks.spawn(browser(client, tally, schedule, Rng::new(100 + id)));
    }
    tasks.spawn(sloppy(clients[0].clone(), Arc::clone(&tally), schedule));
    tasks.spawn(reporter(clients[1].clone(), Arc::clone(&tally), schedule));
    tasks.spawn(admin(clients[2].clone(), Arc::clone(&tally), schedule));
    if let Some(server) = target.local().filter(|_| schedule.run_for >= STALL_MIN_RUN) {
        tasks.spawn(stall(server.addr(), schedule));
    }

    let mut progress = tokio::time::interval(Duration::from_secs(5));
    progress.tick().await;
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(result) => result??,
                None => break,
            },
            _ = progress.tick() => println!(
                "{:>4.0} s  {}",
                schedule.start.elapsed().as_secs_f64(),
                tally.line()
            ),
        }
    }
    println!(
        "\ndone after {:.1} s: {}",
        schedule.start.elapsed().as_secs_f64(),
        tally.line()
    );
    for client in &clients {
        client.shutdown().await;
    }
    Ok(())
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_owned())
}

async fn buyer(
    client: LockClient,
    tally: Arc<Tally>,
    schedule: Schedule,
    mut rng: Rng,
) -> Result<(), BoxError> {
    while schedule.running() {
        let sku = match rng.next() % 10 {
            _ if schedule.flash_sale() => SKUS[0],
            0..=4 => SKUS[0],
            5..=7 => SKUS[1],
            _ => SKUS[2],
        };
        let acquired = if rng.one_in(10) {
            // Give up from outside: the acquire future is dropped.
            match tokio::time::timeout(Duration::from_millis(50), client.lock(sku)).await {
                Ok(result) => result,
                Err(_) => {
                    Tally::add(&tally.cancelled);
                    continue;
                }
            }
        } else {
            let options = LockOptions::new().wait_timeout(Duration::from_millis(80));
            client.lock_with(sku, options).await
        };
        let Some(guard) = tally_acquire(&tally, acquired).await else {
            continue;
        };
        tokio::time::sleep(rng.millis(0.5, 3.0)).await;
        if let Err(error) = guard.release().await {
            back_off(&tally, error).await;
        }
        if !schedule.flash_sale() {
            tokio::time::sleep(rng.millis(50.0, 100.0)).await;
        }
    }
    Ok(())
}

async fn browser(
    client: LockClient,
    tally: Arc<Tally>,
    schedule: Schedule,
    mut rng: Rng,
) -> Result<(), BoxError> {
    while schedule.running() {
        let sku = SKUS[(rng.next() % SKUS.len() as u64) as usize];
        match client.try_lock(sku).await {
            Ok(Some(guard)) => {
                Tally::add(&tally.acquired);
                tokio::time::sleep(rng.millis(0.2, 1.0)).await;
                if let Err(error) = guard.release().await {
                    back_off(&tally, error).await;
                }
            }
            Ok(None) => Tally::add(&tally.busy),
            Err(error) => back_off(&tally, error).await,
        }
        tokio::time::sleep(rng.millis(20.0, 60.0)).await;
    }
    Ok(())
}

/// Holds `sku:3` under a fixed 20 ms lease and overruns it now and then:
/// the lease runs out, the next waiter gets the lock, and the late release
/// is refused.
async fn sloppy(client: LockClient, tally: Arc<Tally>, schedule: Schedule) -> Result<(), BoxError> {
    let mut rng = Rng::new(999);
    while schedule.running() {
        let options = LockOptions::new()
            .lease(Duration::from_millis(20))
            .wait_timeout(Duration::from_secs(1));
        let Some(guard) = tally_acquire(&tally, client.lock_with(SKUS[2], options).await).await
        else {
            continue;
        };
        let overrun = rng.one_in(50);
        tokio::time::sleep(if overrun {
            Duration::from_millis(40)
        } else {
            rng.millis(1.0, 5.0)
        })
        .await;
        match guard.release().await {
            Ok(()) => {}
            Err(Error::NotOwner { .. }) => Tally::add(&tally.leases_lost),
            Err(error) => back_off(&tally, error).await,
        }
        tokio::time::sleep(rng.millis(100.0, 300.0)).await;
    }
    Ok(())
}

/// Holds `report` for 5 s at a time under the watchdog.
async fn reporter(
    client: LockClient,
    tally: Arc<Tally>,
    schedule: Schedule,
) -> Result<(), BoxError> {
    while schedule.running() {
        let guard = match client.lock("report").await {
            Ok(guard) => guard,
            Err(error) => {
                back_off(&tally, error).await;
                continue;
            }
        };
        Tally::add(&tally.acquired);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = tokio::time::sleep_until(schedule.end()) => {}
            _ = guard.lost() => {}
        }
        if guard.is_lost() {
            Tally::add(&tally.leases_lost);
        }
        // A lost lease may also be refused here; the tally has it already.
        match guard.release().await {
            Ok(()) | Err(Error::NotOwner { .. }) => {}
            Err(error) => back_off(&tally, error).await,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Force-releases `report` every 11 s, as an operator clearing a stuck lock
/// would: the reporter's next renewal finds its lease gone.
async fn admin(client: LockClient, tally: Arc<Tally>, schedule: Schedule) -> Result<(), BoxError> {
    let mut every = tokio::time::interval(Duration::from_secs(11));
    every.tick().await;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = tokio::time::sleep_until(schedule.end()) => return Ok(()),
        }
        if let Err(error) = client.force_release("report").await {
            back_off(&tally, error).await;
        }
    }
}

/// Stalls the swarm's own redis-server for 2.5 s at 75 % of the run, the way
/// a failover or a slow `KEYS *` would.
async fn stall(addr: String, schedule: Schedule) -> Result<(), BoxError> {
    let at = schedule.run_for.mul_f64(0.75);
    tokio::time::sleep(at.saturating_sub(schedule.start.elapsed())).await;
    tokio::task::spawn_blocking(move || {
        fairlock_testkit::cmd_at(&addr, &["CLIENT", "PAUSE", "2500", "ALL"])
    })
    .await??;
    println!(
        "{:>4.0} s  Redis paused for 2.5 s",
        schedule.start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A Redis call failed (the stall): count it, print the first few, and
/// wait a little before trying again, as a real worker would.
/// Counts the outcome of a waiting acquire; the guard if it was granted.
async fn tally_acquire(tally: &Tally, acquired: Result<LockGuard, Error>) -> Option<LockGuard> {
    match acquired {
        Ok(guard) => {
            Tally::add(&tally.acquired);
            Some(guard)
        }
        Err(Error::WaitTimeout { .. }) => {
            Tally::add(&tally.timeouts);
            None
        }
        Err(error) => {
            back_off(tally, error).await;
            None
        }
    }
}

async fn back_off(tally: &Tally, error: Error) {
    if tally.errors.fetch_add(1, Ordering::Relaxed) < 3 {
        println!("       error (the worker backs off and retries): {error}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}
