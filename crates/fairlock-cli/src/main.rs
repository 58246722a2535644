//! `fairlock`: the command line of the fairlock distributed lock.
//!
//! One module per subcommand (`inspect`, `list`, `release`, `run` for
//! `lock`, `watch`); `snapshot` renders a lock's state for the two that
//! show it; `name` shows a lock name that is not UTF-8; `exit` holds the
//! exit codes scripts rely on. The lock protocol
//! itself is only reached through the `fairlock` client's public API,
//! except `list`, which needs SCAN.

mod args;
mod connect;
mod duration;
mod exit;
mod inspect;
mod list;
mod name;
mod output;
mod release;
mod run;
mod snapshot;
mod watch;

use std::os::unix::ffi::OsStrExt as _;
use std::process::ExitCode;

use clap::Parser as _;

use crate::args::{Cli, Command};
use crate::connect::lock_client;
use crate::exit::{Failure, INTERRUPTED, OK, TERMINATED};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match execute(cli).await {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("fairlock: {}", failure.message);
            failure.code
        }
    };
    ExitCode::from(code)
}

async fn execute(cli: Cli) -> Result<u8, Failure> {
    let global = &cli.global;
    let client = lock_client(global).await?;
    // Set when Ctrl-C ended a watch (a success, but a call may be in flight).
    let mut watch_interrupted = false;
    let outcome = match &cli.command {
        Command::Inspect { name, limit } => {
            inspect::inspect(&client, name.as_bytes(), *limit, global.json)
                .await
                .map(|()| OK)
        }
        Command::List { limit, max_scans } => list::list(global, &client, *limit, *max_scans)
            .await
            .map(|()| OK),
        Command::Release {
            force: _,
            holder,
            name,
        } => release::release(&client, name.as_bytes(), holder.as_deref(), global.json)
            .await
            .map(|()| OK),
        Command::Lock {
            lease,
            wait,
            grace,
            name,
            command,
        } => {
            run::run_locked(
                &client,
                run::LockRun {
                    name: name.as_bytes(),
                    lease: *lease,
                    wait: *wait,
                    grace: *grace,
                    command,
                },
            )
            .await
        }
        Command::Watch {
            name,
            interval,
            limit,
            count,
        } => match watch::watch(
            &client,
            name.as_bytes(),
            *interval,
            *limit,
            *count,
            global.json,
        )
        .await
        {
            Ok(stopped) => {
                watch_interrupted = stopped;
                Ok(OK)
            }
            Err(failure) => Err(failure),
        },
    };
    let interrupted = watch_interrupted
        || matches!(&outcome, Err(failure) if failure.code == INTERRUPTED || failure.code == TERMINATED);
    if interrupted {
        // A call may still be held by a stalled server, and the shutdown
        // would wait out its timeout: the user asked to stop now. What is
        // left (a cancel, the connections) ends with the process.
        let _ = tokio::time::timeout(INTERRUPTED_SHUTDOWN, client.shutdown()).await;
    } else {
        client.shutdown().await;
    }
    outcome
}

/// How long the client's shutdown may take after Ctrl-C or SIGTERM.
const INTERRUPTED_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(1);
