//! The library-level flash sale: many workers on several clients buy one
//! item until the attempts run out, then the run is audited against Redis.
//!
//! Workers take attempt numbers from one shared counter, so a worker that
//! is served faster makes more attempts: how evenly the attempts spread
//! over the workers (Jain's index) shows how fair the path is.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{LockClient, LockOptions, MAX_DURATION, MAX_PERMITS};
use tokio::task::JoinHandle;

use super::checkout::{Checkout, CheckoutGauge};
use super::shop::{
    buy_with_lock, buy_with_semaphore, BuyError, Item, Purchase, Sale, Shop, Variant,
};
use super::stats::{jain_index, millis, percentile, summary};
use super::{env_or, BoxError};

/// The shape of one run.
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    /// Units on sale (`STOCK`, default 10,000).
    pub stock: i64,
    /// Purchase attempts in total (`ATTEMPTS`, default 20,000).
    pub attempts: u64,
    /// Lock clients (lock path), lock clients each with a data connection
    /// (semaphore path) or data connections (atomic path) the workers are
    /// spread over (`CLIENTS`, default 4).
    pub clients: usize,
    /// Concurrent buyers (`WORKERS`, default 64).
    pub workers: usize,
    /// How long a buyer queues for the lock or a checkout permit before
    /// giving up (`WAIT_MS`, default 30,000).
    pub wait_timeout: Duration,
    /// Permits of the item's checkout semaphore: buyers in checkout at
    /// once on the semaphore path (`PERMITS`, default 8).
    pub permits: u32,
    /// A pause under the checkout permit before the sale, standing in for
    /// a rate-limited payment API (`PAYMENT_MS`, default 0).
    pub payment: Duration,
    /// Fixed lease of each grant (`LEASE_MS`, default 5,000): the critical
    /// section takes milliseconds, and fencing covers an overrun.
    pub lease: Duration,
    /// The item id (`ITEM`, default `1`).
    pub item: String,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl Default for SwarmConfig {
    fn default() -> Self {
        Self {
            stock: 10_000,
            attempts: 20_000,
            clients: 4,
            workers: 64,
            wait_timeout: Duration::from_secs(30),
            permits: 8,
            payment: Duration::ZERO,
            lease: Duration::from_secs(5),
            item: "1".to_owned(),
            progress: false,
        }
    }
}

impl SwarmConfig {
    /// The defaults, overridden by the environment variables named on
    /// each field.
    pub fn from_env() -> Result<Self, String> {
        let d = Self::default();
        let config = Self {
            stock: env_or("STOCK", d.stock)?,
            attempts: env_or("ATTEMPTS", d.attempts)?,
            clients: env_or("CLIENTS", d.clients)?,
            workers: env_or("WORKERS", d.workers)?,
            wait_timeout: Duration::from_millis(env_or("WAIT_MS", 30_000)?),
            permits: env_or("PERMITS", d.permits)?,
            payment: Duration::from_millis(env_or("PAYMENT_MS", 0)?),
            lease: Duration::from_millis(env_or("LEASE_MS", 5_000)?),
            item: env_or("ITEM", d.item)?,
            progress: d.progress,
        };
        config.validate()?;
        Ok(config)
    }

    /// Refuses shapes that cannot run (or would not stop in reasonable time).
    pub fn validate(&self) -> Result<(), String> {
        if self.stock < 0 {
            return Err(format!("STOCK={} must not be negative", self.stock));
        }
        if !(1..=10_000_000).contains(&self.attempts) {
            return Err(format!("ATTEMPTS={} must be 1..=10000000", self.attempts));
        }
        if !(1..=64).contains(&self.clients) {
            return Err(format!("CLIENTS={} must be 1..=64", self.clients));
        }
        if !(1..=10_000).contains(&self.workers) {
            return Err(format!("WORKERS={} must be 1..=10000", self.workers));
        }
        if self.lease < Duration::from_millis(1) || self.lease > MAX_DURATION {
            return Err(format!(
                "LEASE_MS={} must be 1..=86400000",
                self.lease.as_millis()
            ));
        }
        if !(1..=MAX_PERMITS).contains(&self.permits) {
            return Err(format!(
                "PERMITS={} must be 1..={MAX_PERMITS}",
                self.permits
            ));
        }
        if self.payment > MAX_DURATION {
            return Err(format!(
                "PAYMENT_MS={} must be at most 86400000",
                self.payment.as_millis()
            ));
        }
        if self.wait_timeout > MAX_DURATION {
            return Err(format!(
                "WAIT_MS={} must be at most 86400000",
                self.wait_timeout.as_millis()
            ));
        }
        Item::new(Variant::Lock, &self.item).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// One invariant of a run and whether it held.
#[derive(Debug, Clone)]
pub struct Check {
    /// What must hold.
    pub name: &'static str,
    /// Whether it held.
    pub ok: bool,
    /// The numbers behind it.
    pub detail: String,
}

/// What a run did, as the workers saw it and as Redis holds it afterwards.
#[derive(Debug, Clone)]
pub struct Report {
    /// How the item was sold.
    pub variant: Variant,
    /// The run's shape.
    pub config: SwarmConfig,
    /// Wall time of the purchases (not the audit).
    pub elapsed: Duration,
    /// Attempts answered "sold".
    pub sold: u64,
    /// Attempts answered "sold out".
    pub sold_out: u64,
    /// Attempts whose wait for the lock or a checkout permit ran out.
    pub busy: u64,
    /// Attempts refused by the fence (the lease ran out mid-sale).
    pub lease_lost: u64,
    /// Sales whose release found the lease already gone.
    pub late_releases: u64,
    /// Attempts that found their order id taken, or no stock key.
    pub duplicates: u64,
    /// Attempts that failed otherwise (Redis or lock errors).
    pub errors: u64,
    /// The first such error.
    pub first_error: Option<String>,
    /// The lowest stock any sale left behind.
    pub min_stock_left: Option<i64>,
    /// The stock in Redis after the run.
    pub final_stock: Option<i64>,
    /// Orders in Redis after the run.
    pub orders_in_redis: u64,
    /// Orders in Redis that no worker was told it made (or made by
    /// another buyer than the one told).
    pub phantom_orders: u64,
    /// Sales reported to a worker whose order is not in Redis.
    pub missing_orders: u64,
    /// The most buyers in checkout at once (semaphore path only): never
    /// more than the permits.
    pub max_in_checkout: Option<u64>,
    /// Time queued for the lock or permit per attempt that got it, sorted.
    pub waits: Vec<Duration>,
    /// Time per attempt, end to end, sorted.
    pub latencies: Vec<Duration>,
    /// Attempts made by each worker.
    pub attempts_per_worker: Vec<u64>,
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    attempts: u64,
    sold: u64,
    sold_out: u64,
    busy: u64,
    lease_lost: u64,
    late_releases: u64,
    duplicates: u64,
    errors: u64,
    first_error: Option<String>,
    min_stock_left: Option<i64>,
    waits: Vec<Duration>,
    latencies: Vec<Duration>,
    /// Attempt numbers of this worker's sales (order id `o<n>`).
    orders: Vec<u64>,
}

impl Tally {
    fn record(&mut self, n: u64, result: Result<Purchase, BuyError>, latency: Duration) {
        self.attempts += 1;
        self.latencies.push(latency);
        let purchase = match result {
            Ok(purchase) => purchase,
            Err(BuyError::Busy { .. }) => {
                self.busy += 1;
                return;
            }
            Err(BuyError::LeaseLost { .. }) => {
                self.lease_lost += 1;
                return;
            }
            Err(error) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| error.to_string());
                return;
            }
        };
        self.waits.push(purchase.waited);
        if purchase.release_error.is_some() {
            self.late_releases += 1;
        }
        match purchase.sale {
            Sale::Sold { stock_left } => {
                self.sold += 1;
                self.orders.push(n);
                self.min_stock_left = Some(
                    self.min_stock_left
                        .map_or(stock_left, |m| m.min(stock_left)),
                );
            }
            Sale::SoldOut => self.sold_out += 1,
            Sale::NoSuchItem | Sale::DuplicateOrder => self.duplicates += 1,
        }
    }
}

/// The connection a worker buys through.
#[derive(Clone)]
enum Way {
    Lock(LockClient),
    Semaphore {
        lock: LockClient,
        shop: Shop,
        checkout: Checkout,
    },
    Atomic(Shop),
}

/// Live counters for the progress bar.
#[derive(Default)]
struct Live {
    done: AtomicU64,
    sold: AtomicU64,
}

/// Runs one flash sale the `variant` way against the Redis at `url`:
/// seeds the stock, lets the workers buy until the attempts run out,
/// and audits Redis.
pub async fn run(url: &str, config: &SwarmConfig, variant: Variant) -> Result<Report, BoxError> {
    config.validate()?;
    let item = Arc::new(Item::new(variant, &config.item)?);
    let admin = Shop::connect(url).await?;
    admin.seed(&item, config.stock).await?;

    // The lock path talks to Redis through the lock clients only (its data
    // calls are fenced calls); the atomic path through plain connections;
    // the semaphore path takes permits through a lock client and sells
    // through a plain connection. All the semaphore handles share one
    // gauge: the cap holds across the clients.
    let gauge = Arc::new(CheckoutGauge::default());
    let mut ways = Vec::with_capacity(config.clients);
    for _ in 0..config.clients {
        ways.push(match variant {
            Variant::Lock => Way::Lock(LockClient::connect(url).await?),
            Variant::Semaphore => {
                let lock = LockClient::connect(url).await?;
                let checkout = Checkout {
                    semaphore: lock.semaphore(&item.checkout, config.permits)?,
                    gauge: Arc::clone(&gauge),
                    payment: config.payment,
                };
                Way::Semaphore {
                    lock,
                    shop: Shop::connect(url).await?,
                    checkout,
                }
            }
            Variant::Atomic => Way::Atomic(Shop::connect(url).await?),
        });
    }

    let next = Arc::new(AtomicU64::new(0));
    let live = Arc::new(Live::default());
    let options = LockOptions::new()
        .lease(config.lease)
        .wait_timeout(config.wait_timeout);
    let started = Instant::now();
    let progress = config
        .progress
        .then(|| spawn_progress(variant.name(), config.attempts, Arc::clone(&live), started));

    let mut workers = Vec::with_capacity(config.workers);
    for worker in 0..config.workers {
        let way = ways[worker % ways.len()].clone();
        let (item, next, live) = (Arc::clone(&item), Arc::clone(&next), Arc::clone(&live));
        let attempts = config.attempts;
        workers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let buyer = format!("w{worker}");
            // Bounded: every pass takes one of the `attempts` numbers.
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= attempts {
                    break;
                }
                let order_id = format!("o{n}");
                let asked = Instant::now();
                let result = match &way {
                    Way::Lock(lock) => buy_with_lock(lock, &item, &order_id, &buyer, options).await,
                    Way::Semaphore { shop, checkout, .. } => {
                        buy_with_semaphore(checkout, shop, &item, &order_id, &buyer, options).await
                    }
                    Way::Atomic(shop) => {
                        shop.buy_atomic(&item, &order_id, &buyer)
                            .await
                            .map(|sale| Purchase {
                                sale,
                                waited: Duration::ZERO,
                                held: Duration::ZERO,
                                release_error: None,
                            })
                    }
                };
                let sold = matches!(&result, Ok(p) if matches!(p.sale, Sale::Sold { .. }));
                tally.record(n, result, asked.elapsed());
                live.done.fetch_add(1, Ordering::Relaxed);
                if sold {
                    live.sold.fetch_add(1, Ordering::Relaxed);
                }
            }
            tally
        }));
    }
    let mut tallies = Vec::with_capacity(workers.len());
    for worker in workers {
        tallies.push(worker.await?);
    }
    let elapsed = started.elapsed();
    if let Some(progress) = progress {
        progress.abort();
        draw_progress(variant.name(), config.attempts, &live, started, true);
    }

    let audit = admin.audit(&item).await?;
    for way in &ways {
        match way {
            Way::Lock(lock) => lock.shutdown().await,
            Way::Semaphore { lock, shop, .. } => {
                lock.shutdown().await;
                shop.quit().await;
            }
            Way::Atomic(shop) => shop.quit().await,
        }
    }
    admin.quit().await;
    let mut report = merge(variant, config, elapsed, tallies, audit);
    if variant == Variant::Semaphore {
        report.max_in_checkout = Some(gauge.max());
    }
    Ok(report)
}

fn merge(
    variant: Variant,
    config: &SwarmConfig,
    elapsed: Duration,
    tallies: Vec<Tally>,
    audit: super::Audit,
) -> Report {
    let mut report = Report {
        variant,
        config: config.clone(),
        elapsed,
        sold: 0,
        sold_out: 0,
        busy: 0,
        lease_lost: 0,
        late_releases: 0,
        duplicates: 0,
        errors: 0,
        first_error: None,
        min_stock_left: None,
        final_stock: audit.stock,
        orders_in_redis: audit.orders.len() as u64,
        phantom_orders: 0,
        missing_orders: 0,
        max_in_checkout: None,
        waits: Vec::new(),
        latencies: Vec::new(),
        attempts_per_worker: Vec::with_capacity(tallies.len()),
    };
    // order id -> the buyer each worker was told it sold to.
    let mut told: HashMap<String, String> = HashMap::new();
    for (worker, tally) in tallies.into_iter().enumerate() {
        report.sold += tally.sold;
        report.sold_out += tally.sold_out;
        report.busy += tally.busy;
        report.lease_lost += tally.lease_lost;
        report.late_releases += tally.late_releases;
        report.duplicates += tally.duplicates;
        report.errors += tally.errors;
        if report.first_error.is_none() {
            report.first_error = tally.first_error;
        }
        report.min_stock_left = match (report.min_stock_left, tally.min_stock_left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        report.waits.extend(tally.waits);
        report.latencies.extend(tally.latencies);
        report.attempts_per_worker.push(tally.attempts);
        for n in tally.orders {
            if told.insert(format!("o{n}"), format!("w{worker}")).is_some() {
                report.duplicates += 1;
            }
        }
    }
    report.waits.sort();
    report.latencies.sort();
    for (order, buyer) in &audit.orders {
        if told.get(order) != Some(buyer) {
            report.phantom_orders += 1;
        }
    }
    report.missing_orders = told
        .keys()
        .filter(|order| !audit.orders.contains_key(*order))
        .count() as u64;
    report
}

impl Report {
    /// Attempts answered per second.
    pub fn throughput(&self) -> f64 {
        self.attempts_per_worker.iter().sum::<u64>() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Jain's fairness index of the attempts per worker.
    pub fn fairness(&self) -> f64 {
        jain_index(&self.attempts_per_worker)
    }

    /// Every invariant of the run: zero oversell and complete accounting.
    pub fn checks(&self) -> Vec<Check> {
        let stock = self.config.stock;
        let attempts = self.config.attempts;
        let expected_sold = (stock as u64).min(attempts);
        let final_stock = self.final_stock.unwrap_or(i64::MIN);
        let mut checks = vec![
            Check {
                name: "sold = min(stock, attempts)",
                ok: self.sold == expected_sold,
                detail: format!(
                    "{} = min({stock}, {attempts}) = {expected_sold}{}",
                    self.sold,
                    if self.busy > 0 {
                        format!(
                            " ({} attempts gave up waiting for the lock: raise WAIT_MS)",
                            self.busy
                        )
                    } else {
                        String::new()
                    }
                ),
            },
            Check {
                name: "stock never below zero",
                ok: self.min_stock_left.unwrap_or(0) >= 0 && final_stock >= 0,
                detail: format!(
                    "lowest stock after a sale {}, final stock {}",
                    self.min_stock_left
                        .map_or_else(|| "-".to_owned(), |m| m.to_string()),
                    self.final_stock
                        .map_or_else(|| "missing".to_owned(), |s| s.to_string())
                ),
            },
            Check {
                name: "final stock = stock - sold",
                ok: i128::from(final_stock) == i128::from(stock) - i128::from(self.sold),
                detail: format!("{final_stock} = {stock} - {}", self.sold),
            },
            Check {
                name: "orders in Redis = sold",
                ok: self.orders_in_redis == self.sold,
                detail: format!("{} = {}", self.orders_in_redis, self.sold),
            },
            Check {
                name: "no order duplicated, lost or unknown",
                ok: self.duplicates == 0 && self.phantom_orders == 0 && self.missing_orders == 0,
                detail: format!(
                    "duplicates {}, in Redis but not reported {}, reported but not in Redis {}",
                    self.duplicates, self.phantom_orders, self.missing_orders
                ),
            },
        ];
        if self.variant == Variant::Semaphore {
            let permits = u64::from(self.config.permits);
            checks.push(Check {
                name: "never more buyers in checkout than permits",
                ok: self.max_in_checkout.is_some_and(|max| max <= permits),
                detail: format!(
                    "at most {} at once, permits {permits}",
                    self.max_in_checkout
                        .map_or_else(|| "not measured".to_owned(), |m| m.to_string())
                ),
            });
        }
        checks.push(Check {
            name: "no errors, no stale writes",
            ok: self.errors == 0 && self.lease_lost == 0,
            detail: format!(
                "errors {}, refused by the fence {}{}",
                self.errors,
                self.lease_lost,
                self.first_error
                    .as_ref()
                    .map_or_else(String::new, |e| format!(" (first error: {e})"))
            ),
        });
        checks
    }

    /// Whether every check held.
    pub fn passed(&self) -> bool {
        self.checks().iter().all(|c| c.ok)
    }

    /// Prints the run's numbers and checks.
    pub fn print(&self) {
        let c = &self.config;
        println!(
            "{}: {} attempts by {} workers on {} {} in {:.2}s = {:.0} attempts/s",
            self.title(),
            c.attempts,
            c.workers,
            c.clients,
            match self.variant {
                Variant::Lock => "lock clients",
                Variant::Semaphore => "lock clients + connections",
                Variant::Atomic => "connections",
            },
            self.elapsed.as_secs_f64(),
            self.throughput()
        );
        println!(
            "  sold {}, sold out {}, gave up waiting {}, late releases {}",
            self.sold, self.sold_out, self.busy, self.late_releases
        );
        match self.variant {
            Variant::Lock => println!("  wait for the lock: {}", summary(&self.waits)),
            Variant::Semaphore => {
                println!("  wait for a permit: {}", summary(&self.waits));
                println!(
                    "  in checkout at once: at most {} of {} permits{}",
                    self.max_in_checkout.unwrap_or(0),
                    c.permits,
                    if c.payment.is_zero() {
                        String::new()
                    } else {
                        format!(" (payment pause {} ms)", c.payment.as_millis())
                    }
                );
            }
            Variant::Atomic => {}
        }
        println!("  purchase latency:  {}", summary(&self.latencies));
        let min = self.attempts_per_worker.iter().min().copied().unwrap_or(0);
        let max = self.attempts_per_worker.iter().max().copied().unwrap_or(0);
        println!(
            "  attempts per worker: min {min}, max {max}; Jain's fairness index {:.3}",
            self.fairness()
        );
        for check in self.checks() {
            println!(
                "  [{}] {}: {}",
                if check.ok { " ok " } else { "FAIL" },
                check.name,
                check.detail
            );
        }
    }

    fn title(&self) -> &'static str {
        match self.variant {
            Variant::Lock => "lock      (per-item fairlock, fenced read + 2 fenced writes)",
            Variant::Semaphore => {
                "semaphore (per-item fair semaphore, atomic script under a permit)"
            }
            Variant::Atomic => "atomic    (one Lua script, no lock)",
        }
    }
}

/// Prints the runs side by side, one column each.
pub fn print_comparison(reports: &[Report]) {
    let row = |name: &str, cells: Vec<String>| {
        let cells: String = cells.iter().map(|c| format!(" {c:>16}")).collect();
        println!("  {name:<22}{cells}");
    };
    let each = |f: &dyn Fn(&Report) -> String| reports.iter().map(f).collect::<Vec<_>>();
    println!("side by side:");
    row(
        "",
        each(&|r| {
            match r.variant {
                Variant::Lock => "lock",
                Variant::Semaphore => "semaphore",
                Variant::Atomic => "atomic script",
            }
            .to_owned()
        }),
    );
    row("attempts/s", each(&|r| format!("{:.0}", r.throughput())));
    for (name, p) in [
        ("latency p50", 0.5),
        ("latency p99", 0.99),
        ("latency max", 1.0),
    ] {
        row(name, each(&|r| millis(percentile(&r.latencies, p))));
    }
    row(
        "queue wait p99",
        each(&|r| {
            if r.variant.queues() {
                millis(percentile(&r.waits, 0.99))
            } else {
                "-".into()
            }
        }),
    );
    row(
        "in checkout at once",
        each(&|r| {
            r.max_in_checkout
                .map_or_else(|| "-".into(), |m| format!("{m} / {}", r.config.permits))
        }),
    );
    row(
        "sold / stock",
        each(&|r| format!("{} / {}", r.sold, r.config.stock)),
    );
    row(
        "final stock",
        each(&|r| {
            r.final_stock
                .map_or_else(|| "missing".into(), |s| s.to_string())
        }),
    );
    row("orders in Redis", each(&|r| r.orders_in_redis.to_string()));
    row("Jain's index", each(&|r| format!("{:.3}", r.fairness())));
    row(
        "checks",
        each(&|r| if r.passed() { "all passed" } else { "FAILED" }.to_owned()),
    );
}

fn spawn_progress(
    label: &'static str,
    total: u64,
    live: Arc<Live>,
    started: Instant,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let every = if std::io::stderr().is_terminal() {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(2)
        };
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tick.tick().await; // the first tick is immediate: nothing to show yet
                           // Ends when all attempts are done; the runner aborts it otherwise.
        while live.done.load(Ordering::Relaxed) < total {
            tick.tick().await;
            draw_progress(label, total, &live, started, false);
        }
    })
}

/// One frame of the progress bar on stderr: redrawn in place on a
/// terminal, a line every two seconds otherwise.
fn draw_progress(label: &str, total: u64, live: &Live, started: Instant, last: bool) {
    const WIDTH: u64 = 30;
    let done = live.done.load(Ordering::Relaxed).min(total);
    let filled = (done * WIDTH / total.max(1)) as usize;
    let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
    let tty = std::io::stderr().is_terminal();
    let line = format!(
        "{label:<6} [{}{}] {done:>7}/{total} sold {:>7} {rate:>7.0}/s",
        "#".repeat(filled),
        "-".repeat(WIDTH as usize - filled),
        live.sold.load(Ordering::Relaxed),
    );
    let mut err = std::io::stderr().lock();
    let _ = match (tty, last) {
        (true, false) => write!(err, "\r{line}"),
        (true, true) => writeln!(err, "\r{line}"),
        (false, _) => writeln!(err, "{line}"),
    };
    let _ = err.flush();
}
