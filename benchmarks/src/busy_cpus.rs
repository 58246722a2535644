//! `--busy-cpus`: a diagnostic, not a measure. Child processes at the
//! kernel's lowest priority (`SCHED_IDLE`) spin on every CPU for the whole
//! run, so that no CPU ever goes idle: any real work (Redis, the
//! contenders) preempts them at once, but a CPU that would have halted
//! between two messages stays awake.
//!
//! Why: on a virtual machine, waking a halted virtual CPU costs tens of
//! microseconds, paid on every round trip that finds the machine idle. A
//! run with and without this flag tells how much of a gap is that wake-up
//! (the machine) and how much is the lock's own work. The spinners' CPU
//! time is not the benchmark's (`bench CPU` counts this process only), and
//! a run with them is marked in its report; it needs `--out`, so that it
//! never replaces the benchmark's own results.

use std::process::{Child, Command, Stdio};

/// The hidden argument that makes `fairlock-bench` a spinner.
pub const SPINNER_FLAG: &str = "--busy-cpus-spinner";

/// The spinner processes; stopped (killed and reaped) by
/// [`BusyCpus::stop`] or when dropped.
pub struct BusyCpus {
    children: Vec<Child>,
}

impl BusyCpus {
    /// Starts `count` spinners: this executable run with [`SPINNER_FLAG`].
    pub fn start(count: usize) -> std::io::Result<BusyCpus> {
        let exe = std::env::current_exe()?;
        BusyCpus::start_with(count, || {
            let mut command = Command::new(&exe);
            command.arg(SPINNER_FLAG);
            command
        })
    }

    /// Starts `count` children made by `command` (the tests give a
    /// command of their own).
    fn start_with(count: usize, command: impl Fn() -> Command) -> std::io::Result<BusyCpus> {
        let mut busy = BusyCpus {
            children: Vec::with_capacity(count),
        };
        for _ in 0..count {
            // On an error, the drop of `busy` stops those already started.
            let child = command()
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()?;
            busy.children.push(child);
        }
        // A spinner that cannot take the lowest priority exits at once
        // rather than compete with the work: then there is no diagnostic.
        std::thread::sleep(std::time::Duration::from_millis(100));
        for child in &mut busy.children {
            if let Some(status) = child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "a --busy-cpus spinner exited at once ({status})"
                )));
            }
        }
        Ok(busy)
    }

    /// Kills and reaps every spinner.
    pub fn stop(&mut self) {
        for mut child in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for BusyCpus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A spinner's whole life: lowest priority, dies with its parent, spins.
/// Returns only if it cannot lower its priority (it must never compete
/// with the work it keeps company) or its parent is gone already.
pub fn spinner_main() -> std::io::Error {
    if let Err(error) = become_idle_priority() {
        return error;
    }
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number, and
    // getppid nothing; neither touches memory of ours.
    let orphaned = unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        // A parent that died before the prctl sent no signal: the spinner
        // was handed to init (or a subreaper) already.
        libc::getppid() == 1
    };
    if orphaned {
        return std::io::Error::other("the benchmark that started this spinner is gone");
    }
    loop {
        std::hint::spin_loop();
    }
}

/// Puts the calling thread under `SCHED_IDLE`: it runs only when nothing
/// else wants the CPU.
fn become_idle_priority() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param for the call's duration; pid 0
    // is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spinner_runs_at_idle_priority() {
        // Its own thread: the policy belongs to the thread that sets it.
        let policy = std::thread::spawn(|| {
            become_idle_priority().map(|()| {
                // SAFETY: pid 0 is the calling thread.
                unsafe { libc::sched_getscheduler(0) }
            })
        })
        .join()
        .expect("the thread does not panic")
        .expect("SCHED_IDLE needs no privilege");
        assert_eq!(policy, libc::SCHED_IDLE);
    }

    #[test]
    fn a_child_that_exits_at_once_is_an_error() {
        let started = BusyCpus::start_with(1, || Command::new("true"));
        assert!(
            started.is_err(),
            "a child that exited was taken for a spinner"
        );
    }

    #[test]
    fn stopping_kills_and_reaps_every_child() {
        let mut busy = BusyCpus::start_with(2, || {
            let mut command = Command::new("sleep");
            command.arg("600");
            command
        })
        .expect("sleep starts");
        assert_eq!(busy.children.len(), 2);
        let pids: Vec<u32> = busy.children.iter().map(Child::id).collect();
        busy.stop();
        assert!(busy.children.is_empty());
        for pid in pids {
            // Reaped: no process (not even a zombie) has the pid any more.
            assert!(
                !std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "child {pid} still exists"
            );
        }
    }
}
