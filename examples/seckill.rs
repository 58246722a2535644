//! A flash sale under real load, sold three ways side by side, with zero
//! oversell checked against Redis.
//!
//! ```sh
//! cargo run --release -p fairlock-examples --example seckill
//! STOCK=500 ATTEMPTS=2000 WORKERS=32 cargo run --release -p fairlock-examples --example seckill
//! ```
//!
//! `STOCK` units (10,000) of one item; `ATTEMPTS` purchases (20,000) by
//! `WORKERS` concurrent buyers (64) spread over `CLIENTS` clients (4).
//! First every purchase goes through the item's fairlock (`WAIT_MS`
//! 30,000, `LEASE_MS` 5,000) with fenced reads and writes; then through
//! a per-item fair semaphore of `PERMITS` (8) permits, each buyer running
//! the atomic script under a permit (`PAYMENT_MS`, 0: a pause under the
//! permit standing in for a rate-limited payment API); then through the
//! atomic Lua script alone, no lock. Each run prints throughput, wait and
//! latency percentiles and Jain's fairness index, and is audited: sold =
//! min(stock, attempts), the stock never went below zero, final stock =
//! stock - sold, one order per sale, and (semaphore) never more buyers
//! in checkout at once than permits. The exit code is non-zero if any
//! check fails.
//!
//! Without `REDIS_URL` it starts a throwaway redis-server on 127.0.0.1
//! (installed with apt-get first when run as root on Debian).

use std::process::ExitCode;

use fairlock_examples::seckill::{print_comparison, swarm, BoxError, SwarmConfig, Variant};
use fairlock_testkit::RedisTarget;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("\nSOME CHECKS FAILED");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("seckill: {error}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<bool, BoxError> {
    let mut config = SwarmConfig::from_env()?;
    config.progress = true;
    let target = RedisTarget::from_env_or_start()?;
    println!("{}", target.describe());
    println!(
        "flash sale: {} units of item {:?}, {} attempts, {} workers on {} clients, {} checkout permits\n",
        config.stock, config.item, config.attempts, config.workers, config.clients, config.permits
    );
    let url = target.url();
    let mut reports = Vec::with_capacity(Variant::ALL.len());
    for variant in Variant::ALL {
        let report = swarm::run(&url, &config, variant).await?;
        report.print();
        println!();
        reports.push(report);
    }
    print_comparison(&reports);
    Ok(reports.iter().all(|r| r.passed()))
}
