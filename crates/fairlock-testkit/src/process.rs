//! Spawning one server process and waiting until it serves: the part every
//! topology shares.
//!
//! Children are forked from one long-lived thread and get `PR_SET_PDEATHSIG`,
//! so a server never outlives the test process, even when the test thread
//! that asked for it has finished or the test binary is killed. Ports come
//! from [`crate::ports`], reserved across processes for a server's whole
//! life; a start is still judged by PING from the child we spawned (checked
//! by pid), so a port some program outside the kit grabbed between the
//! reservation and the bind is detected and retried.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::resp::{Conn, Resp};
use crate::TestkitError;

/// How long a freshly started server has to answer PING.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ports (or, on restart, attempts on the same port) are tried.
pub(crate) const START_ATTEMPTS: usize = 5;
/// Lines of each log file included in [`TestkitError::StartFailed`].
const LOG_TAIL_LINES: usize = 40;
/// How long [`poll_until`] polls at its fast rate before backing off.
const FAST_POLL_FOR: Duration = Duration::from_secs(1);

/// What to run: the binary, an optional config file (which must come first
/// on the command line, e.g. for `--sentinel`), extra arguments, and
/// environment variables set for the server alone (e.g. a shifted clock).
#[derive(Debug, Clone)]
pub(crate) struct LaunchSpec {
    pub(crate) bin: PathBuf,
    pub(crate) config_file: Option<PathBuf>,
    pub(crate) args: Vec<OsString>,
    pub(crate) env: Vec<(OsString, OsString)>,
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();

/// Spawns `cmd` from a dedicated thread that lives as long as the process.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not
/// the process. Test harnesses run every test on its own short-lived thread,
/// so forking from the calling thread would kill servers kept in statics (or
/// created on a `spawn_blocking` thread) as soon as that thread finishes.
pub(crate) fn spawn_child(mut cmd: Command) -> io::Result<Child> {
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("fairlock-testkit-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .ok()
            .map(|_| tx)
    });
    let Some(spawner) = spawner else {
        // Could not create the spawner thread: fall back to forking here.
        return cmd.spawn();
    };
    let (reply_tx, reply_rx) = mpsc::channel();
    if let Err(mpsc::SendError((returned, _))) = spawner.send((cmd, reply_tx)) {
        cmd = returned;
        return cmd.spawn();
    }
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("fairlock-testkit spawner thread is gone"))?
}

fn build_command(spec: &LaunchSpec, port: u16, dir: &Path) -> io::Result<Command> {
    let mut cmd = Command::new(&spec.bin);
    cmd.args(spec.config_file.iter())
        .arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--save")
        .arg("")
        .arg("--appendonly")
        .arg("no")
        .arg("--daemonize")
        .arg("no")
        .arg("--protected-mode")
        .arg("yes")
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .args(&spec.args)
        .envs(spec.env.iter().map(|(name, value)| (name, value)))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Redis reports configuration errors on stderr before it opens the
        // log file; keep them (out of the test output) for the error message.
        .stderr(Stdio::from(File::create(dir.join("redis.stderr"))?));
    die_with_parent(&mut cmd);
    Ok(cmd)
}

/// Makes the child get SIGKILL when the thread that forks it dies; with
/// [`spawn_child`]'s long-lived thread, when the test process dies.
pub(crate) fn die_with_parent(cmd: &mut Command) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the closure only calls async-signal-safe functions (prctl,
        // getppid) and does not allocate.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // The parent died before prctl took effect: do not outlive it.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
}

pub(crate) fn fresh_temp_dir() -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "fairlock-redis-{}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            nanos
        ));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Summary line plus the tails of `redis.log` and `redis.stderr` in `dir`.
pub(crate) fn start_failure(dir: &Path, summary: &str) -> TestkitError {
    let mut out = summary.to_string();
    for name in ["redis.log", "redis.stderr"] {
        let path = dir.join(name);
        match fs::read(&path) {
            Ok(bytes) if !bytes.is_empty() => {
                let text = String::from_utf8_lossy(&bytes);
                out.push_str(&format!(
                    "\n--- last lines of {} ---\n{}",
                    path.display(),
                    tail_lines(&text, LOG_TAIL_LINES)
                ));
            }
            _ => out.push_str(&format!("\n--- {} is empty or missing ---", path.display())),
        }
    }
    TestkitError::StartFailed { log_tail: out }
}

pub(crate) enum StartError {
    /// Worth retrying (the process exited early, e.g. the port was taken).
    Retry(TestkitError),
    /// Not worth retrying (spawn failed, or PING timed out).
    Fatal(TestkitError),
}

impl StartError {
    pub(crate) fn into_inner(self) -> TestkitError {
        match self {
            StartError::Retry(e) | StartError::Fatal(e) => e,
        }
    }
}

/// Outcome of one readiness probe.
enum Probe {
    /// Answered PING; `Some(pid)` if INFO reported a process id.
    Ready(Option<u32>),
    NotYet,
}

fn probe(port: u16) -> Probe {
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    let Ok(mut conn) = Conn::connect_addr(addr, Duration::from_secs(1)) else {
        return Probe::NotYet;
    };
    let Ok(replies) = conn.pipeline(&[&["PING"], &["INFO", "server"]]) else {
        return Probe::NotYet;
    };
    if replies.first().and_then(Resp::as_str) != Some("PONG") {
        // E.g. `-LOADING`.
        return Probe::NotYet;
    }
    let pid = replies.get(1).and_then(Resp::as_str).and_then(|info| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse::<u32>().ok())
    });
    Probe::Ready(pid)
}

pub(crate) fn kill_child(child: &mut Child) {
    // Errors only mean the process is already gone.
    let _ = child.kill();
    let _ = child.wait();
}

/// Spawns one redis-server on `port` and waits until it answers PING.
pub(crate) fn launch(spec: &LaunchSpec, port: u16, dir: &Path) -> Result<Child, StartError> {
    let cmd = build_command(spec, port, dir).map_err(|e| StartError::Fatal(TestkitError::Io(e)))?;
    let mut child = spawn_child(cmd).map_err(|e| {
        StartError::Fatal(TestkitError::Io(io::Error::new(
            e.kind(),
            format!("cannot spawn {}: {e}", spec.bin.display()),
        )))
    })?;
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return Err(StartError::Retry(start_failure(
                    dir,
                    &format!("redis-server on port {port} exited during startup ({status})"),
                )));
            }
            Ok(None) => {}
            Err(e) => {
                kill_child(&mut child);
                return Err(StartError::Fatal(TestkitError::Io(e)));
            }
        }
        if let Probe::Ready(pid) = probe(port) {
            if pid.is_some_and(|pid| pid != child.id()) {
                // A redis outside the kit's reservations grabbed the port
                // between our reservation and our server's bind.
                kill_child(&mut child);
                return Err(StartError::Retry(start_failure(
                    dir,
                    &format!("port {port} is used by another redis-server"),
                )));
            }
            if let Ok(None) = child.try_wait() {
                return Ok(child);
            }
            continue; // Exited meanwhile; reported by the next iteration.
        }
        if Instant::now() >= deadline {
            kill_child(&mut child);
            return Err(StartError::Fatal(start_failure(
                dir,
                &format!(
                    "redis-server on port {port} did not answer PING within {}s",
                    STARTUP_TIMEOUT.as_secs()
                ),
            )));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Calls `probe` until it returns `Ok(Some(_))` or `timeout` passes: every
/// 20 ms for the first second, then every 100 ms (a settle round of a
/// topology sends a few dozen admin commands, too many to repeat at full
/// speed on a busy machine for half a minute). An `Err` from `probe` counts
/// as "not yet" (a node may be restarting); the last one is reported on
/// timeout, with `what`.
pub(crate) fn poll_until<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, TestkitError>,
) -> Result<T, TestkitError> {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut last = String::new();
    loop {
        match probe() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last = e.to_string(),
        }
        if Instant::now() >= deadline {
            let detail = if last.is_empty() {
                String::new()
            } else {
                format!(" (last error: {last})")
            };
            return Err(TestkitError::Timeout(format!(
                "{what} within {:.1}s{detail}",
                timeout.as_secs_f64()
            )));
        }
        thread::sleep(poll_interval(start.elapsed()));
    }
}

/// The pause between two probes of [`poll_until`], `elapsed` into the wait.
pub(crate) fn poll_interval(elapsed: Duration) -> Duration {
    if elapsed < FAST_POLL_FOR {
        Duration::from_millis(20)
    } else {
        Duration::from_millis(100)
    }
}

/// Runs a short-lived helper program (e.g. `redis-cli --cluster create`)
/// with its output in `log`, killing it if it runs longer than `timeout`.
/// Like the servers, it is forked from the spawner thread with
/// `PR_SET_PDEATHSIG`, so it dies with the test process.
pub(crate) fn run_with_timeout(
    mut cmd: Command,
    log: &Path,
    timeout: Duration,
) -> Result<(), TestkitError> {
    let out = File::create(log)?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out));
    die_with_parent(&mut cmd);
    let description = format!("{cmd:?}");
    let mut child = spawn_child(cmd)?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            kill_child(&mut child);
            let text = fs::read_to_string(log).unwrap_or_default();
            return Err(TestkitError::Timeout(format!(
                "{description} did not finish within {}s: {}",
                timeout.as_secs(),
                tail_lines(&text, 20)
            )));
        }
        thread::sleep(Duration::from_millis(20));
    };
    if status.success() {
        Ok(())
    } else {
        let text = fs::read_to_string(log).unwrap_or_default();
        Err(TestkitError::StartFailed {
            log_tail: format!(
                "{description} exited with {status}:\n{}",
                tail_lines(&text, 20)
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_dirs_are_unique() {
        let a = fresh_temp_dir().unwrap();
        let b = fresh_temp_dir().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(std::env::temp_dir()));
        fs::remove_dir(a).unwrap();
        fs::remove_dir(b).unwrap();
    }

    #[test]
    fn polling_backs_off_after_the_first_second() {
        assert_eq!(poll_interval(Duration::ZERO), Duration::from_millis(20));
        assert_eq!(
            poll_interval(Duration::from_millis(999)),
            Duration::from_millis(20)
        );
        assert_eq!(
            poll_interval(Duration::from_secs(2)),
            Duration::from_millis(100)
        );
        let mut calls = 0;
        let err = poll_until("never", Duration::from_millis(1500), || {
            calls += 1;
            Ok(None::<()>)
        })
        .unwrap_err();
        assert!(err.to_string().contains("never within 1.5s"), "{err}");
        // ~50 fast probes in the first second, ~5 slow ones after.
        assert!(calls < 70, "{calls} probes in 1.5 s");
    }

    #[test]
    fn helper_programs_die_with_the_test_process() {
        // PR_GET_PDEATHSIG (2) of the helper itself, read with python3.
        let script = "import ctypes; v = ctypes.c_int(); \
                      ctypes.CDLL(None).prctl(2, ctypes.byref(v)); print('sig', v.value)";
        if Command::new("python3").arg("-c").arg("1").output().is_err() {
            return; // No python3 here: nothing to read the signal with.
        }
        let dir = fresh_temp_dir().unwrap();
        let log = dir.join("helper.log");
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(script);
        run_with_timeout(cmd, &log, Duration::from_secs(30)).unwrap();
        let out = fs::read_to_string(&log).unwrap();
        assert_eq!(out.trim(), format!("sig {}", libc::SIGKILL), "{out}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
