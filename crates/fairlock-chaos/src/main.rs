//! `fairlock-chaos`: a Jepsen-style check of fairlock on one machine.
//!
//! ```text
//! fairlock-chaos [--long] [--seed N] [--fault-secs N] [--workers N] [--only KIND] [--out DIR]
//! fairlock-chaos soak [--long] [--minutes N] [--locks N] [--waiters N] [--out DIR]
//! ```
//!
//! Worker processes contend on a few locks and, under each grant, do a
//! fenced, non-atomic increment of a counter; a fault injector kills,
//! stops, partitions and slows them and restarts, flushes, sleeps and
//! evicts the lock server; afterwards a checker replays the applied
//! writes and the workers' logs. The summary lists the faults, the counts
//! and which fault each bad finding followed; the exit status is 1 if a
//! must-be-zero count is not zero, 2 if the run itself failed.
//!
//! The same binary is the worker (`fairlock-chaos worker ...`), started by
//! the runner with `current_exe()`, so workers are real OS processes.

mod checker;
mod config;
mod events;
mod faults;
mod pool;
mod proxy;
mod resource;
mod rng;
mod runner;
mod soak;
mod summary;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::RunConfig;

const USAGE: &str = "usage:
  fairlock-chaos [--long] [--seed N] [--fault-secs N] [--workers N] [--only KIND] [--out DIR]
  fairlock-chaos soak [--long] [--minutes N] [--locks N] [--waiters N] [--out DIR]";

/// What the arguments ask for, before any is read: the usage (for `-h` or
/// `--help`), or an error naming an argument that is not one of `flags`
/// (taking a value) or `switches`. A misspelled flag must not start a
/// two-minute run that ignores it.
enum Asked {
    Run,
    Help,
}

fn check_args(args: &[String], flags: &[&str], switches: &[&str]) -> Result<Asked, String> {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Asked::Help),
            a if switches.contains(&a) => {}
            a if flags.contains(&a) => {
                rest.next().ok_or_else(|| format!("{a} needs a value"))?;
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(Asked::Run)
}

fn flag_value(args: &[String], name: &str) -> Result<Option<String>, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => args
            .get(i + 1)
            .cloned()
            .map(Some)
            .ok_or_else(|| format!("{name} needs a value")),
    }
}

fn number(args: &[String], name: &str) -> Result<Option<u64>, String> {
    flag_value(args, name)?
        .map(|v| v.parse().map_err(|e| format!("{name} {v:?}: {e}")))
        .transpose()
}

fn run_config(args: &[String]) -> Result<(RunConfig, PathBuf), String> {
    let seed = number(args, "--seed")?.unwrap_or_else(|| events::now_us() % 1_000_000);
    let mut config = if args.iter().any(|a| a == "--long") {
        RunConfig::long(seed)
    } else {
        RunConfig::short(seed)
    };
    if let Some(secs) = number(args, "--fault-secs")? {
        config.fault_phase = Duration::from_secs(secs);
    }
    if let Some(name) = flag_value(args, "--only")? {
        let kind = events::FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| format!("--only {name:?}: not a fault kind"))?;
        config.only = Some(kind);
    }
    if let Some(workers) = number(args, "--workers")? {
        config.workers = workers.max(2) as usize;
    }
    let out = flag_value(args, "--out")?.map_or_else(
        || std::env::temp_dir().join(format!("fairlock-chaos-{}", std::process::id())),
        PathBuf::from,
    );
    Ok((config, out))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        let result = worker::WorkerArgs::parse(&args[1..]).and_then(worker::run);
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fairlock-chaos worker: {e}");
                ExitCode::from(2)
            }
        };
    }
    if args.first().map(String::as_str) == Some("soak") {
        return soak_main(&args[1..]);
    }
    let flags = ["--seed", "--fault-secs", "--workers", "--only", "--out"];
    match check_args(&args, &flags, &["--long"]) {
        Ok(Asked::Run) => {}
        Ok(Asked::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("fairlock-chaos: {e}");
            return ExitCode::from(2);
        }
    }
    let (config, out) = match run_config(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("fairlock-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    println!("{}", summary::header(&config, &out));
    match runner::run(&config, &out) {
        Ok(result) => {
            println!("{}", summary::render(&result));
            if let Err(e) = summary::write_json(&config, &result, &out.join("summary.json")) {
                eprintln!("fairlock-chaos: {e}");
            }
            if result.report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("fairlock-chaos: the run failed: {e}");
            ExitCode::from(2)
        }
    }
}

/// `fairlock-chaos soak`: see [`soak`]. Exit status as for the chaos run.
fn soak_main(args: &[String]) -> ExitCode {
    let flags = ["--minutes", "--out", "--locks", "--waiters"];
    match check_args(args, &flags, &["--long"]) {
        Ok(Asked::Run) => {}
        Ok(Asked::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("fairlock-chaos soak: {e}");
            return ExitCode::from(2);
        }
    }
    let mut config = if args.iter().any(|a| a == "--long") {
        soak::SoakConfig::long()
    } else {
        soak::SoakConfig::short()
    };
    let parsed = number(args, "--minutes").and_then(|minutes| {
        let out = flag_value(args, "--out")?;
        let locks = number(args, "--locks")?;
        let waiters = number(args, "--waiters")?;
        Ok((minutes, out, locks, waiters))
    });
    let (minutes, out, locks, waiters) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("fairlock-chaos soak: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(minutes) = minutes {
        config.duration = Duration::from_secs(minutes * 60);
    }
    // Bounded so a typo cannot ask for more tasks than memory holds.
    match (locks, waiters) {
        (Some(0), _) | (_, Some(0)) => {
            eprintln!("fairlock-chaos soak: --locks and --waiters must be at least 1");
            return ExitCode::from(2);
        }
        (Some(n), _) | (_, Some(n)) if n > 1_000_000 => {
            eprintln!("fairlock-chaos soak: at most 1,000,000 locks or waiters, not {n}");
            return ExitCode::from(2);
        }
        _ => {}
    }
    if let Some(locks) = locks {
        config.locks = locks as usize;
    }
    if let Some(waiters) = waiters {
        config.waiters = waiters as usize;
    }
    match soak::run(&config) {
        Ok(report) => {
            println!("{}", report.render());
            if let Some(dir) = out {
                let path = PathBuf::from(dir).join("soak.json");
                let written =
                    std::fs::create_dir_all(path.parent().unwrap_or(&path)).and_then(|()| {
                        let json =
                            serde_json::to_string_pretty(&report).map_err(std::io::Error::other)?;
                        std::fs::write(&path, json)
                    });
                if let Err(e) = written {
                    eprintln!("fairlock-chaos soak: cannot write {}: {e}", path.display());
                }
            }
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("fairlock-chaos soak: the run failed: {e}");
            ExitCode::from(2)
        }
    }
}
