//! The worker processes: spawning them (this same binary in worker mode),
//! killing, stopping and restarting them, and how each one ended.
//!
//! A slot is a worker's place in the run; a restarted worker keeps its slot
//! (and its proxy) but writes a new log file, so every file is one process.

use std::fs::{self, File};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::events::WorkerExit;
use crate::worker::WorkerArgs;

/// One worker slot.
struct Slot {
    child: Option<Child>,
    log: PathBuf,
    incarnation: usize,
    lock_url: String,
}

/// Every worker of the run.
pub struct WorkerPool {
    exe: PathBuf,
    dir: PathBuf,
    resource_url: String,
    locks: usize,
    until_us: u64,
    seed: u64,
    slots: Vec<Slot>,
    exits: Vec<WorkerExit>,
}

impl WorkerPool {
    /// A pool whose workers write their logs in `dir` and stop at `until_us`.
    pub fn new(
        dir: &Path,
        resource_url: String,
        locks: usize,
        until_us: u64,
        seed: u64,
    ) -> io::Result<Self> {
        Ok(Self {
            exe: std::env::current_exe()?,
            dir: dir.to_path_buf(),
            resource_url,
            locks,
            until_us,
            seed,
            slots: Vec::new(),
            exits: Vec::new(),
        })
    }

    /// Adds a slot whose worker reaches the lock server at `lock_url`, and
    /// starts it.
    pub fn add(&mut self, lock_url: String) -> io::Result<()> {
        self.slots.push(Slot {
            child: None,
            log: PathBuf::new(),
            incarnation: 0,
            lock_url,
        });
        self.start(self.slots.len() - 1)
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Starts a fresh process in `slot` (its previous one must be gone).
    fn start(&mut self, slot: usize) -> io::Result<()> {
        let s = &mut self.slots[slot];
        s.incarnation += 1;
        s.log = self
            .dir
            .join(format!("worker-{slot}-{}.jsonl", s.incarnation));
        let args = WorkerArgs {
            slot,
            lock_url: s.lock_url.clone(),
            resource_url: self.resource_url.clone(),
            locks: self.locks,
            until_us: self.until_us,
            log: s.log.clone(),
            seed: self.seed.wrapping_add((slot * 1000 + s.incarnation) as u64),
        };
        let mut cmd = Command::new(&self.exe);
        cmd.args(args.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(File::create(s.log.with_extension("stderr"))?));
        // SAFETY: prctl is async-signal-safe; the worker dies with the
        // runner instead of contending forever.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                Ok(())
            });
        }
        s.child = Some(cmd.spawn()?);
        Ok(())
    }

    /// The pid of the process in `slot`, if running.
    pub fn pid(&self, slot: usize) -> Option<u32> {
        self.slots[slot].child.as_ref().map(Child::id)
    }

    /// The log file of the process in `slot`.
    pub fn log(&self, slot: usize) -> String {
        self.slots[slot].log.display().to_string()
    }

    /// The slot whose current process logged a grant to `holder`.
    pub fn slot_of_holder(&self, holder: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| fs::read_to_string(&s.log).is_ok_and(|text| text.contains(holder)))
    }

    /// SIGKILLs the process in `slot`, records it, and starts a new one.
    pub fn kill_and_restart(&mut self, slot: usize) -> io::Result<()> {
        if let Some(mut child) = self.slots[slot].child.take() {
            let _ = child.kill();
            let status = child.wait().ok();
            let exit = self.exit_record(slot, status.and_then(|s| s.code()), true, false);
            self.exits.push(exit);
        }
        self.start(slot)
    }

    /// Sends `signal` (SIGSTOP, SIGCONT) to the process in `slot`.
    pub fn signal(&self, slot: usize, signal: libc::c_int) {
        if let Some(pid) = self.pid(slot) {
            // SAFETY: kill has no memory preconditions; the pid is our child.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
    }

    /// Waits until every worker has exited by itself, killing those still
    /// running at `deadline`, and returns how each process of the run ended.
    pub fn finish(mut self, deadline: Instant) -> Vec<WorkerExit> {
        for slot in 0..self.slots.len() {
            let Some(mut child) = self.slots[slot].child.take() else {
                continue;
            };
            let mut status = None;
            while Instant::now() < deadline {
                match child.try_wait() {
                    Ok(Some(s)) => {
                        status = Some(s);
                        break;
                    }
                    Ok(None) => thread::sleep(Duration::from_millis(50)),
                    Err(_) => break,
                }
            }
            let killed = status.is_none();
            if killed {
                let _ = child.kill();
                status = child.wait().ok();
            }
            let code = if killed {
                None
            } else {
                status.and_then(|s| s.code())
            };
            let exit = self.exit_record(slot, code, false, killed);
            self.exits.push(exit);
        }
        self.exits
    }

    fn exit_record(
        &self,
        slot: usize,
        code: Option<i32>,
        killed_by_fault: bool,
        killed_at_shutdown: bool,
    ) -> WorkerExit {
        let log = &self.slots[slot].log;
        let stderr = fs::read_to_string(log.with_extension("stderr"))
            .unwrap_or_default()
            .to_lowercase();
        WorkerExit {
            log: log.display().to_string(),
            killed_by_fault,
            code,
            killed_at_shutdown,
            panicked: stderr.contains("panicked"),
            eviction_warning: stderr.contains("maxmemory"),
        }
    }
}
