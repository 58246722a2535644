//! The fault injector: what each [`FaultKind`] does to the lock server, a
//! worker process or a worker's network link, and the record it leaves.
//!
//! Only the lock server is faulted. The resource server (counters, fence
//! keys, resource logs) is never touched, so whatever the lock server
//! loses, the checker still has the full history of what was applied.

use std::fs;
use std::thread;
use std::time::Duration;

use fairlock::LockClient;
use fairlock_testkit::{RedisServer, Resp};
use tokio::runtime::Runtime;

use crate::config::{lock_name, LEASE};
use crate::events::{now_us, FaultKind, FaultRecord};
use crate::pool::WorkerPool;
use crate::proxy::{Link, Proxy};
use crate::rng::Rng;

/// Longest a fault may last (so none runs into the quiet phase).
pub const LONGEST_FAULT: Duration = Duration::from_secs(5);

/// What the faults act on.
pub struct Lab {
    /// The lock server (AOF with `appendfsync always`).
    pub lock_server: RedisServer,
    /// The workers.
    pub workers: WorkerPool,
    /// One proxy per worker slot, between it and the lock server.
    pub proxies: Vec<Proxy>,
    /// The runtime the proxies and the inspector run on.
    pub runtime: Runtime,
    /// A client of the lock server used only to see who holds what.
    pub inspector: LockClient,
    /// Number of locks.
    pub locks: usize,
}

impl Lab {
    /// The slots whose process holds a lock right now (by asking the lock
    /// server and finding the owner id in the worker logs).
    pub fn holders(&self) -> Vec<usize> {
        let mut slots = Vec::new();
        for lock in 0..self.locks {
            let name = lock_name(lock);
            let state = self.runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(2), self.inspector.inspect(&name)).await
            });
            if let Ok(Ok(state)) = state {
                if let Some(slot) = state.owner.and_then(|o| self.workers.slot_of_holder(&o)) {
                    slots.push(slot);
                }
            }
        }
        slots
    }

    fn pick_holder(&self, rng: &mut Rng) -> usize {
        let holders = self.holders();
        if holders.is_empty() {
            rng.below(self.workers.len() as u64) as usize
        } else {
            holders[rng.below(holders.len() as u64) as usize]
        }
    }

    fn pick_waiter(&self, rng: &mut Rng) -> usize {
        let holders = self.holders();
        let others: Vec<usize> = (0..self.workers.len())
            .filter(|s| !holders.contains(s))
            .collect();
        if others.is_empty() {
            rng.below(self.workers.len() as u64) as usize
        } else {
            others[rng.below(others.len() as u64) as usize]
        }
    }

    fn admin(&self, args: &[&str]) -> String {
        match self.lock_server.cmd(args) {
            Ok(reply) => format!("{} -> {}", args.join(" "), describe(&reply)),
            Err(e) => format!("{} -> {e}", args.join(" ")),
        }
    }

    fn info_field(&self, section: &str, field: &str) -> Option<u64> {
        let reply = self.lock_server.cmd(&["INFO", section]).ok()?;
        reply.as_str()?.lines().find_map(|l| {
            l.trim()
                .strip_prefix(field)
                .and_then(|v| v.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
        })
    }
}

fn describe(reply: &Resp) -> String {
    match reply {
        Resp::Error(e) => format!("error {e}"),
        other => other
            .as_str()
            .map_or_else(|| format!("{other:?}"), str::to_owned),
    }
}

/// Injects one fault of `kind` and returns its record once it is over.
pub fn inject(kind: FaultKind, lab: &mut Lab, rng: &mut Rng) -> FaultRecord {
    let start_us = now_us();
    let mut target = None;
    let detail = match kind {
        FaultKind::KillHolder | FaultKind::KillWaiter => {
            let slot = if kind == FaultKind::KillHolder {
                lab.pick_holder(rng)
            } else {
                lab.pick_waiter(rng)
            };
            target = Some(lab.workers.log(slot));
            let pid = lab.workers.pid(slot);
            match lab.workers.kill_and_restart(slot) {
                Ok(()) => format!("slot {slot} pid {pid:?} killed and restarted"),
                Err(e) => format!("slot {slot} pid {pid:?} killed, restart failed: {e}"),
            }
        }
        FaultKind::StopHolder => {
            let slot = lab.pick_holder(rng);
            target = Some(lab.workers.log(slot));
            let pause = LEASE + Duration::from_millis(1_500);
            lab.workers.signal(slot, libc::SIGSTOP);
            thread::sleep(pause);
            lab.workers.signal(slot, libc::SIGCONT);
            format!("slot {slot} stopped for {pause:?}")
        }
        FaultKind::ClientKillNormal => lab.admin(&["CLIENT", "KILL", "TYPE", "normal"]),
        FaultKind::ClientKillPubsub => lab.admin(&["CLIENT", "KILL", "TYPE", "pubsub"]),
        FaultKind::ScriptFlush => lab.admin(&["SCRIPT", "FLUSH"]),
        FaultKind::DebugSleepShort => lab.admin(&["DEBUG", "SLEEP", "0.5"]),
        FaultKind::DebugSleepLong => {
            let secs = (LEASE + Duration::from_secs(1)).as_secs().to_string();
            lab.admin(&["DEBUG", "SLEEP", &secs])
        }
        FaultKind::RestartAof => match lab.lock_server.restart() {
            Ok(()) => "SIGKILL, restart from the AOF".to_owned(),
            Err(e) => format!("restart failed: {e}"),
        },
        FaultKind::RestartNoPersistence => {
            lab.lock_server.kill();
            let dir = lab.lock_server.dir().to_path_buf();
            let _ = fs::remove_dir_all(dir.join("appendonlydir"));
            let _ = fs::remove_file(dir.join("dump.rdb"));
            match lab.lock_server.restart() {
                Ok(()) => "SIGKILL, AOF deleted, restart empty".to_owned(),
                Err(e) => format!("restart failed: {e}"),
            }
        }
        FaultKind::MaxmemoryEvict => {
            let used = lab.info_field("memory", "used_memory").unwrap_or(1 << 20);
            let evicted_before = lab.info_field("stats", "evicted_keys").unwrap_or(0);
            let policy = lab.admin(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
            let limit = lab.admin(&["CONFIG", "SET", "maxmemory", &used.to_string()]);
            // A worker connecting now should see the evicting policy.
            let slot = lab.pick_waiter(rng);
            target = Some(lab.workers.log(slot));
            let restarted = lab.workers.kill_and_restart(slot);
            thread::sleep(Duration::from_secs(3));
            let evicted = lab
                .info_field("stats", "evicted_keys")
                .unwrap_or(0)
                .saturating_sub(evicted_before);
            lab.admin(&["CONFIG", "SET", "maxmemory", "0"]);
            lab.admin(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
            format!(
                "{policy}; {limit}; slot {slot} restarted ({restarted:?}); {evicted} keys evicted"
            )
        }
        FaultKind::ProxyDelay | FaultKind::ProxyPartition => {
            let slot = lab.pick_holder(rng);
            target = Some(lab.workers.log(slot));
            let (link, length) = if kind == FaultKind::ProxyDelay {
                (
                    Link::Delayed(Duration::from_millis(300)),
                    Duration::from_secs(3),
                )
            } else {
                (Link::Partitioned, LEASE + Duration::from_millis(1_500))
            };
            lab.proxies[slot].set(link);
            thread::sleep(length);
            lab.proxies[slot].set(Link::Open);
            format!("slot {slot}: {link:?} for {length:?}")
        }
    };
    FaultRecord {
        kind,
        target,
        start_us,
        end_us: now_us(),
        detail,
    }
}
