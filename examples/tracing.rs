//! The spans and events of a contended acquire, printed by
//! `tracing-subscriber` with an environment filter.
//!
//! ```sh
//! cargo run -p fairlock-examples --example tracing
//! RUST_LOG=fairlock=trace cargo run -p fairlock-examples --example tracing
//! ```
//!
//! One task holds `order:42` for 50 ms while three "requests" queue for it.
//! Each request runs in an `http.request` span of its own, and the
//! client's `fairlock.acquire` span (level DEBUG) opens inside it, so the
//! time spent waiting for the lock shows up inside the request's trace,
//! with the events the client records there (queued with a ticket, lock
//! handed on, granted after a wait). Span close lines carry `time.busy`
//! and `time.idle`: an acquire that waited is mostly idle.
//!
//! Environment: `RUST_LOG` (default `info,fairlock=debug`),
//! `REDIS_URL` (unset: a throwaway redis-server on 127.0.0.1).

use std::time::Duration;

use fairlock::LockClient;
use fairlock_testkit::RedisTarget;
use tracing::Instrument;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tracing: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,fairlock=debug"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(FmtSpan::NEW | FmtSpan::CLOSE)
        .with_target(true)
        .init();

    let target = RedisTarget::from_env_or_start()?;
    let client = LockClient::connect(&target.url()).await?;

    let holder = client.lock("order:42").await?;
    tracing::info!(token = ?holder.token(), "holder took order:42");

    let mut requests = Vec::new();
    for id in 1..=3 {
        let client = client.clone();
        let span = tracing::info_span!(
            "http.request",
            http.route = "/orders/{id}/pay",
            request.id = id
        );
        requests.push(tokio::spawn(
            async move {
                let guard = client.lock("order:42").await?;
                tracing::info!(token = ?guard.token(), ticket = ?guard.ticket(), "paying");
                tokio::time::sleep(Duration::from_millis(5)).await;
                guard.release().await?;
                Ok::<_, fairlock::Error>(())
            }
            .instrument(span),
        ));
        // Queue them in a known order.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    tokio::time::sleep(Duration::from_millis(50)).await;
    holder.release().await?;
    for request in requests {
        request.await??;
    }
    client.shutdown().await;
    Ok(())
}
