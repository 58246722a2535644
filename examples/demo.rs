//! A swarm of workers on several clients contends for one lock.
//!
//! Run it with `cargo run --release -p fairlock-examples --example demo`.
//! Without `REDIS_URL` it starts a throwaway redis-server on 127.0.0.1 (and
//! installs redis-server with apt-get first when run as root on Debian).
//!
//! It prints the order of the first grants, how often each worker got the
//! lock, wait-time percentiles, and checks two invariants: a non-atomic
//! counter updated under the lock lost no update, and grants followed
//! queue-ticket order (nobody overtook an older waiter). The exit code
//! says whether they held (0), one broke (1, also for an error) or Ctrl-C
//! stopped the run (130); in every case the demo's clients leave nothing
//! queued or held. The swarm itself is `fairlock_examples::demo`.

use std::process::ExitCode;

use fairlock_examples::demo::{self, DemoConfig};
use fairlock_testkit::RedisTarget;

#[tokio::main]
async fn main() -> ExitCode {
    let target = match RedisTarget::from_env_or_start() {
        Ok(target) => target,
        Err(error) => {
            eprintln!("demo: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", target.describe());
    let config = DemoConfig::default();
    println!(
        "{} workers on {} clients contend for lock \"{}\" for {:?}, holding it {:?} each time\n",
        config.clients * config.workers_per_client,
        config.clients,
        demo::LOCK,
        config.run_for,
        config.hold
    );
    let ctrl_c = async {
        // Without a signal handler, wait for the run's own end.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    match demo::run(&target.url(), config, ctrl_c).await {
        Ok(report) if report.interrupted => {
            eprintln!("demo: interrupted; nothing left queued or held");
            ExitCode::from(130)
        }
        Ok(report) => {
            report.print();
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                eprintln!("demo: an invariant broke (see above)");
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("demo: {error}");
            ExitCode::FAILURE
        }
    }
}
