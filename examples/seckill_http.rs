//! The flash sale as an HTTP service: `POST /seckill/{item}` through the
//! item's fairlock, `POST /seckill-semaphore/{item}` through a permit of
//! the item's checkout semaphore and then the Lua script,
//! `POST /seckill-atomic/{item}` through the Lua script alone,
//! `GET /stock/{item}`, `GET /stats` (answers per status code, most
//! buyers in checkout at once).
//!
//! ```sh
//! cargo run --release -p fairlock-examples --example seckill_http
//! curl -s -X POST http://127.0.0.1:8080/seckill/1
//! curl -s http://127.0.0.1:8080/stock/1
//! ```
//!
//! Environment: `PORT` (8080, on 127.0.0.1), `STOCK` (10,000 units of
//! each item, each way, seeded at start), `ITEMS` (`1`), `WAIT_MS` (1,000:
//! a request that waits longer for the lock or a permit is answered 429),
//! `PERMITS` (8 per item's checkout semaphore), `PAYMENT_MS` (0: a pause
//! under the permit standing in for a payment API), `LEASE_MS` (5,000),
//! `ADMISSION` (1: deadline-aware admission on the lock path), `LINE` (1:
//! the service's own bounded line per item), `MAX_IN_LINE` (0: adaptive
//! size), `SALE_THREADS` (2: threads of the sales' own runtime),
//! `REDIS_URL` (unset: a throwaway redis-server on 127.0.0.1).
//! `examples/seckill_load.sh` loads it with `ab` and checks for oversell.
//! Stops on SIGINT or SIGTERM.

use std::process::ExitCode;

use fairlock_examples::seckill::http::{listen, Service, ServiceConfig};
use fairlock_examples::seckill::{env_or, BoxError, Variant};
use fairlock_testkit::RedisTarget;
use tokio::signal::unix::{signal, SignalKind};

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("seckill_http: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let config = ServiceConfig::from_env()?;
    let port: u16 = env_or("PORT", 8080)?;
    let target = RedisTarget::from_env_or_start()?;
    let url = target.url();
    // The port first: a second instance started by mistake must fail
    // before Service::start reseeds the stock and clears the orders of the
    // sale that instance is serving.
    let listener =
        listen(port).map_err(|e| format!("cannot listen on 127.0.0.1:{port}: {e} (set PORT)"))?;
    let service = Service::start(&url, config.clone()).await?;
    let addr = listener.local_addr()?;
    let mut terminate = signal(SignalKind::terminate())?;
    println!("redis: {}", target.shown_url());
    println!(
        "seckill: listening on http://{addr}: {} units of item(s) {} each way, wait timeout {} ms, {} checkout permits per item",
        config.stock,
        config.items.join(","),
        config.wait_timeout.as_millis(),
        config.permits
    );
    println!(
        "  POST /seckill/{{item}}  POST /seckill-semaphore/{{item}}  POST /seckill-atomic/{{item}}  GET /stock/{{item}}  GET /stats"
    );
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    };
    service.serve(listener, shutdown).await?;
    for variant in Variant::ALL {
        println!(
            "answers ({}): {:?}",
            variant.name(),
            service.status_counts(variant)
        );
    }
    service.close().await;
    Ok(())
}
