//! Runner mode: starts the two Redis servers, the proxies and the workers,
//! injects faults on a seeded random schedule, stops everything cleanly,
//! inspects what is left, gathers the logs and hands them to the checker.
//!
//! Two servers, on purpose: the lock server is the one faulted (restarted
//! with and without its data, slept, evicted); the resource server holds
//! the counters, their fence keys and the logs of applied writes, and is
//! never faulted, so the history the checker replays survives every fault.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use fairlock::LockClient;
use fairlock_testkit::{RedisServer, Resp};

use crate::checker::{check, Leftovers, Report, RunLogs, WorkerLog};
use crate::config::{client_config, lock_name, RunConfig, RECOVERY_BOUND, WAIT_TIMEOUT};
use crate::events::{now_us, AppliedWrite, FaultKind, FaultRecord, WorkerEvent, WorkerExit};
use crate::faults::{inject, Lab, LONGEST_FAULT};
use crate::pool::WorkerPool;
use crate::proxy::Proxy;
use crate::resource::ResourceKeys;
use crate::rng::Rng;

/// The result of a run: the checker's report and what the summary adds.
pub struct RunResult {
    /// The checker's counts.
    pub report: Report,
    /// Every fault, in order.
    pub faults: Vec<FaultRecord>,
    /// Keys on the lock server without a TTL at the end (first 10).
    pub keys_without_ttl: Vec<String>,
}

fn err(context: &str) -> impl Fn(String) -> String + '_ {
    move |e| format!("{context}: {e}")
}

/// Runs the whole chaos experiment, writing its files into `out`.
pub fn run(config: &RunConfig, out: &Path) -> Result<RunResult, String> {
    fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let lock_server = RedisServer::builder()
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .args(["--enable-debug-command", "yes"])
        .start()
        .map_err(|e| err("lock server")(e.to_string()))?;
    let resource_server =
        RedisServer::start().map_err(|e| err("resource server")(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| err("runtime")(e.to_string()))?;
    let lock_addr: SocketAddr = lock_server
        .addr()
        .parse()
        .map_err(|e: std::net::AddrParseError| err("lock server address")(e.to_string()))?;

    let start_us = now_us();
    let fault_end_us = start_us + config.fault_phase.as_micros() as u64;
    let until_us = fault_end_us + config.quiet_phase.as_micros() as u64;
    let mut workers = WorkerPool::new(
        out,
        resource_server.url(),
        config.locks,
        until_us,
        config.seed,
    )
    .map_err(|e| err("workers")(e.to_string()))?;
    let mut proxies = Vec::new();
    for _ in 0..config.workers {
        let proxy = runtime
            .block_on(Proxy::start(lock_addr))
            .map_err(|e| err("proxy")(e.to_string()))?;
        workers
            .add(proxy.url())
            .map_err(|e| err("spawning a worker")(e.to_string()))?;
        proxies.push(proxy);
    }
    let inspector = runtime
        .block_on(LockClient::with_config(client_config(&lock_server.url())))
        .map_err(|e| err("inspector")(e.to_string()))?;
    let mut lab = Lab {
        lock_server,
        workers,
        proxies,
        runtime,
        inspector,
        locks: config.locks,
    };

    let faults = inject_faults(config, &mut lab, start_us, fault_end_us, out);
    sleep_until(until_us);
    let Lab {
        lock_server,
        workers,
        proxies,
        runtime,
        inspector,
        ..
    } = lab;
    let exits = workers.finish(Instant::now() + WAIT_TIMEOUT + Duration::from_secs(10));
    drop(proxies);

    let mut leftovers = Leftovers::default();
    for lock in 0..config.locks {
        let name = lock_name(lock);
        let state = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), inspector.inspect(&name)).await
        });
        match state {
            Ok(Ok(state)) => {
                leftovers.owners += u64::from(state.owner.is_some());
                leftovers.queue_entries += state.queue_len;
            }
            other => eprintln!("fairlock-chaos: cannot inspect lock {lock}: {other:?}"),
        }
    }
    runtime.block_on(inspector.shutdown());
    let keys_without_ttl = keys_without_ttl(&lock_server);
    leftovers.keys_without_ttl = keys_without_ttl.len() as u64;

    let (resources, counters) = resource_history(&resource_server, config.locks)?;
    let logs = RunLogs {
        workers: read_worker_logs(&exits),
        resources,
        counters,
        faults: faults.clone(),
        leftovers,
        run_end_us: until_us,
        recovery_bound_us: RECOVERY_BOUND.as_micros() as u64,
    };
    drop(runtime);
    Ok(RunResult {
        report: check(&logs),
        faults,
        keys_without_ttl: keys_without_ttl.into_iter().take(10).collect(),
    })
}

fn sleep_until(at_us: u64) {
    let now = now_us();
    if at_us > now {
        thread::sleep(Duration::from_micros(at_us - now));
    }
}

/// Injects faults until the fault phase ends: every kind once per round,
/// in a shuffled order, with a pause longer than the recovery bound
/// between two faults.
fn inject_faults(
    config: &RunConfig,
    lab: &mut Lab,
    start_us: u64,
    fault_end_us: u64,
    out: &Path,
) -> Vec<FaultRecord> {
    let mut rng = Rng::new(config.seed);
    let mut bag: Vec<FaultKind> = Vec::new();
    let mut faults = Vec::new();
    let (min_gap, max_gap) = config.fault_gap;
    let path = out.join("faults.jsonl");
    loop {
        let spread = (max_gap.saturating_sub(min_gap)).as_millis() as u64;
        let gap = min_gap + Duration::from_millis(rng.below(spread + 1));
        let next = now_us() + gap.as_micros() as u64;
        if next + LONGEST_FAULT.as_micros() as u64 > fault_end_us {
            break;
        }
        sleep_until(next);
        if bag.is_empty() {
            bag = config
                .only
                .map_or_else(|| FaultKind::ALL.to_vec(), |kind| vec![kind]);
            rng.shuffle(&mut bag);
        }
        let Some(kind) = bag.pop() else { break };
        let record = inject(kind, lab, &mut rng);
        println!(
            "[{:6.1}s] {}: {}",
            (record.start_us - start_us) as f64 / 1e6,
            kind.name(),
            record.detail
        );
        if let Ok(line) = serde_json::to_string(&record) {
            let _ = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        }
        faults.push(record);
    }
    faults
}

/// The keys on the lock server that would never expire.
fn keys_without_ttl(server: &RedisServer) -> Vec<String> {
    let keys = match server.cmd(&["KEYS", "*"]) {
        Ok(Resp::Array(Some(keys))) => keys,
        _ => return Vec::new(),
    };
    keys.iter()
        .filter_map(|k| k.as_str())
        .filter(|k| matches!(server.cmd(&["PTTL", k]), Ok(Resp::Int(-1))))
        .map(str::to_owned)
        .collect()
}

/// The applied writes and final counter of every resource.
type History = (Vec<Vec<AppliedWrite>>, Vec<i64>);

fn resource_history(server: &RedisServer, locks: usize) -> Result<History, String> {
    let mut logs = Vec::new();
    let mut counters = Vec::new();
    for index in 0..locks {
        let keys = ResourceKeys::of(index);
        let entries = match server.cmd(&["LRANGE", &keys.log, "0", "-1"]) {
            Ok(Resp::Array(Some(items))) => items
                .iter()
                .filter_map(|i| i.as_str().and_then(|s| serde_json::from_str(s).ok()))
                .collect(),
            Ok(Resp::Array(None)) => Vec::new(),
            other => return Err(format!("cannot read {}: {other:?}", keys.log)),
        };
        let counter = match server.cmd(&["GET", &keys.counter]) {
            Ok(reply) => reply.as_str().and_then(|s| s.parse().ok()).unwrap_or(0),
            Err(e) => return Err(format!("cannot read {}: {e}", keys.counter)),
        };
        logs.push(entries);
        counters.push(counter);
    }
    Ok((logs, counters))
}

/// Parses every worker's file; a torn last line (SIGKILL) is skipped.
fn read_worker_logs(exits: &[WorkerExit]) -> Vec<WorkerLog> {
    exits
        .iter()
        .map(|exit| WorkerLog {
            events: fs::read_to_string(PathBuf::from(&exit.log))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<WorkerEvent>(l).ok())
                .collect(),
            exit: exit.clone(),
        })
        .collect()
}
