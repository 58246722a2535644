//! Worker mode: one OS process with one lock client, contending on a few
//! locks until a deadline, doing the fenced read-modify-write under each
//! grant and logging every call to its own JSON-lines file.
//!
//! Each line is written with one `write` on a file opened for appending,
//! so a worker killed with SIGKILL leaves a log that ends on a whole line.
//! A worker behaves as a careful user would: it checks the lease-lost
//! signal before each step and stops acting once it is set.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use fairlock::{Error, LockClient, LockGuard, LockOptions};

use crate::config::{client_config, lock_name, COMMAND_TIMEOUT, WAIT_TIMEOUT};
use crate::events::{now_us, CallKind, Outcome, WorkerEvent};
use crate::resource::FencedCounter;
use crate::rng::Rng;

/// What the runner tells a worker (on its command line).
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// Worker slot.
    pub slot: usize,
    /// The lock server (possibly through this slot's proxy).
    pub lock_url: String,
    /// The resource server.
    pub resource_url: String,
    /// How many locks to contend on.
    pub locks: usize,
    /// Stop starting new acquisitions at this time (µs since the epoch).
    pub until_us: u64,
    /// The JSON-lines log to write.
    pub log: PathBuf,
    /// Seed of the lock choices and pauses.
    pub seed: u64,
}

impl WorkerArgs {
    /// Parses `--slot N --lock-url U --resource-url U --locks N --until-us T --log P --seed S`.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let value = |name: &str| -> Result<String, String> {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1))
                .cloned()
                .ok_or_else(|| format!("worker mode needs {name}"))
        };
        let number = |name: &str| -> Result<u64, String> {
            value(name)?.parse().map_err(|e| format!("{name}: {e}"))
        };
        Ok(Self {
            slot: number("--slot")? as usize,
            lock_url: value("--lock-url")?,
            resource_url: value("--resource-url")?,
            locks: number("--locks")?.max(1) as usize,
            until_us: number("--until-us")?,
            log: PathBuf::from(value("--log")?),
            seed: number("--seed")?,
        })
    }

    /// The command line [`WorkerArgs::parse`] reads.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "worker".into(),
            "--slot".into(),
            self.slot.to_string(),
            "--lock-url".into(),
            self.lock_url.clone(),
            "--resource-url".into(),
            self.resource_url.clone(),
            "--locks".into(),
            self.locks.to_string(),
            "--until-us".into(),
            self.until_us.to_string(),
            "--log".into(),
            self.log.display().to_string(),
            "--seed".into(),
            self.seed.to_string(),
        ]
    }
}

/// Appends events to the worker's log, one line per `write`.
struct EventLog {
    file: File,
    seq: u64,
}

impl EventLog {
    fn create(path: &PathBuf) -> Result<Self, String> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        Ok(Self { file, seq: 0 })
    }

    fn write(&mut self, event: &WorkerEvent) {
        if let Ok(mut line) = serde_json::to_string(event) {
            line.push('\n');
            // A worker that cannot log is useless to the checker; the
            // missing lines show up there as unfinished calls.
            let _ = self.file.write_all(line.as_bytes());
        }
    }

    /// Logs the start of a call and returns its sequence number.
    fn begin(
        &mut self,
        call: CallKind,
        lock: usize,
        guard: Option<&LockGuard>,
        limit: Duration,
    ) -> u64 {
        self.seq += 1;
        let seq = self.seq;
        self.write(&WorkerEvent::Begin {
            seq,
            call,
            lock,
            holder: guard.map(|g| g.owner_id().to_owned()),
            token: guard.map(|g| g.token().value()),
            at_us: now_us(),
            limit_ms: limit.as_millis() as u64,
        });
        seq
    }

    /// Logs the end of call `seq`.
    fn end<T>(&mut self, seq: u64, result: &Result<T, Error>) {
        let outcome = match result {
            Ok(_) => Outcome::Ok,
            Err(Error::StaleToken { newest, .. }) => Outcome::Stale { newest: *newest },
            Err(e) => Outcome::Error {
                message: e.to_string(),
            },
        };
        self.write(&WorkerEvent::End {
            seq,
            at_us: now_us(),
            outcome,
        });
    }
}

/// Runs a worker; returns an error message if it could not start.
pub fn run(args: WorkerArgs) -> Result<(), String> {
    // The client's warnings (e.g. an evicting maxmemory-policy at connect)
    // go to stderr, which the runner keeps in a file and searches.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .try_init();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(work(args))
}

/// Connects, retrying while the server restarts, until the deadline.
async fn connect_until(url: &str, until_us: u64) -> Result<LockClient, String> {
    loop {
        match LockClient::with_config(client_config(url)).await {
            Ok(client) => {
                // The runner searches stderr for this (maxmemory fault).
                if let Some(warning) = client.eviction_warning() {
                    eprintln!(
                        "fairlock-chaos worker: eviction warning at connect (maxmemory): {warning}"
                    );
                }
                return Ok(client);
            }
            Err(e) if now_us() >= until_us => return Err(format!("cannot connect to {url}: {e}")),
            Err(e) => {
                eprintln!("fairlock-chaos worker: connect failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await
            }
        }
    }
}

async fn work(args: WorkerArgs) -> Result<(), String> {
    let mut log = EventLog::create(&args.log)?;
    let client = connect_until(&args.lock_url, args.until_us).await?;
    let resource = FencedCounter::connect(client_config(&args.resource_url))
        .await
        .map_err(|e| format!("cannot connect to the resource server: {e}"))?;
    log.write(&WorkerEvent::Started {
        slot: args.slot,
        pid: std::process::id(),
        at_us: now_us(),
    });
    let mut rng = Rng::new(args.seed ^ u64::from(std::process::id()) << 20);
    let options = LockOptions::new().wait_timeout(WAIT_TIMEOUT);
    while now_us() < args.until_us {
        let lock = rng.below(args.locks as u64) as usize;
        let begin_us = now_us();
        let seq = log.begin(
            CallKind::Acquire,
            lock,
            None,
            WAIT_TIMEOUT + COMMAND_TIMEOUT,
        );
        let acquired = client.lock_with(&lock_name(lock), options).await;
        log.end(seq, &acquired);
        match acquired {
            Ok(guard) => {
                log.write(&WorkerEvent::Acquired {
                    lock,
                    holder: guard.owner_id().to_owned(),
                    token: guard.token().value(),
                    begin_us,
                    at_us: now_us(),
                });
                critical_section(&mut log, &resource, &mut rng, lock, guard).await;
            }
            // Redis is restarting, partitioned or asleep: back off a little.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    client.shutdown().await;
    resource.shutdown().await;
    log.write(&WorkerEvent::Finished { at_us: now_us() });
    Ok(())
}

/// Whether the guard's lease-lost signal is set; logs the first sighting.
fn lost(log: &mut EventLog, lock: usize, guard: &LockGuard, seen: &mut bool) -> bool {
    if guard.is_lost() && !*seen {
        *seen = true;
        log.write(&WorkerEvent::Lost {
            lock,
            holder: guard.owner_id().to_owned(),
            at_us: now_us(),
        });
    }
    *seen
}

/// Fenced read, pause, fenced write of read + 1, release.
async fn critical_section(
    log: &mut EventLog,
    resource: &FencedCounter,
    rng: &mut Rng,
    lock: usize,
    guard: LockGuard,
) {
    let mut seen_lost = false;
    read_modify_write(log, resource, rng, lock, &guard, &mut seen_lost).await;
    lost(log, lock, &guard, &mut seen_lost);
    let seq = log.begin(CallKind::Release, lock, Some(&guard), COMMAND_TIMEOUT);
    let released = guard.release().await;
    log.end(seq, &released);
}

/// The non-atomic increment; stops at the first refusal, error or
/// lease-lost signal.
async fn read_modify_write(
    log: &mut EventLog,
    resource: &FencedCounter,
    rng: &mut Rng,
    lock: usize,
    guard: &LockGuard,
    seen_lost: &mut bool,
) {
    if lost(log, lock, guard, seen_lost) {
        return;
    }
    let seq = log.begin(CallKind::Read, lock, Some(guard), COMMAND_TIMEOUT);
    let read = resource.read(lock, guard).await;
    log.end(seq, &read);
    let Ok(value) = read else { return };
    tokio::time::sleep(Duration::from_millis(5 + rng.below(40))).await;
    if lost(log, lock, guard, seen_lost) {
        return;
    }
    let seq = log.begin(CallKind::Write, lock, Some(guard), COMMAND_TIMEOUT);
    let written = resource.write(lock, guard, value).await;
    log.end(seq, &written);
}
