//! Throwaway `redis-server` processes on 127.0.0.1 for fairlock's integration
//! tests, examples and benchmarks.
//!
//! * [`ensure_redis_server`] locates (and, as root on Debian/Ubuntu, installs)
//!   the `redis-server` binary.
//! * [`RedisServer`] is a child `redis-server` on a free port with its own temp
//!   dir and no persistence. It is SIGKILLed and cleaned up on drop (also when a
//!   test panics), and it dies with the test process (`PR_SET_PDEATHSIG`).
//! * [`RedisServer::cmd`] / [`cmd_at`] are a minimal blocking RESP2 client for
//!   admin commands, so tests can inspect Redis without the library under test.
//! * [`RedisTarget::from_env_or_start`] uses `REDIS_URL` when set, and otherwise
//!   starts a throwaway server (for examples and benchmarks).
//!
//! ```no_run
//! use fairlock_testkit::{RedisServer, Resp};
//!
//! let server = RedisServer::builder().arg("--maxclients").arg("100").start()?;
//! assert_eq!(server.cmd(&["PING"])?, Resp::Simple("PONG".into()));
//! println!("connect the library under test to {}", server.url());
//! # Ok::<(), fairlock_testkit::TestkitError>(())
//! ```

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod resp;

pub use resp::Resp;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use resp::Conn;

/// The message returned when `redis-server` cannot be found or installed.
const NOT_INSTALLED_HINT: &str = "redis-server not found; install it with \
     `sudo apt-get install redis-server` (Debian/Ubuntu) or set \
     REDIS_SERVER=/path/to/redis-server";
/// Lock file serialising automatic installs across parallel test processes.
const INSTALL_LOCK: &str = "/tmp/fairlock-redis-install.lock";
/// Directories searched after `PATH`.
const FALLBACK_DIRS: &[&str] = &["/usr/bin", "/usr/sbin", "/usr/local/bin"];
/// How long a freshly started server has to answer PING.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ports (or, on restart, attempts on the same port) are tried.
const START_ATTEMPTS: usize = 5;
/// Connect/read/write timeout of the admin client.
const CMD_TIMEOUT: Duration = Duration::from_secs(5);
/// Lines of each log file included in [`TestkitError::StartFailed`].
const LOG_TAIL_LINES: usize = 40;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Errors returned by this crate.
#[derive(Debug)]
pub enum TestkitError {
    /// `redis-server` is missing; the message says how to install it.
    NotInstalled(String),
    /// An I/O error (spawning, connecting, reading, writing, temp dirs, ...).
    Io(io::Error),
    /// `redis-server` did not come up. `log_tail` starts with a one-line
    /// summary of what went wrong, followed by the tail of the server's log
    /// file and of its stderr (where Redis reports configuration errors).
    StartFailed {
        /// Summary line plus the last lines of the server's log and stderr.
        log_tail: String,
    },
    /// The server sent something that is not valid RESP2, or an unexpected
    /// reply to an admin command issued by this crate.
    Protocol(String),
}

impl fmt::Display for TestkitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TestkitError::NotInstalled(msg) => f.write_str(msg),
            TestkitError::Io(e) => write!(f, "I/O error: {e}"),
            TestkitError::StartFailed { log_tail } => {
                write!(f, "redis-server failed to start: {log_tail}")
            }
            TestkitError::Protocol(msg) => write!(f, "RESP protocol error: {msg}"),
        }
    }
}

impl std::error::Error for TestkitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TestkitError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for TestkitError {
    fn from(e: io::Error) -> Self {
        TestkitError::Io(e)
    }
}

// ---------------------------------------------------------------------------
// Locating / installing redis-server
// ---------------------------------------------------------------------------

static REDIS_SERVER_BIN: OnceLock<PathBuf> = OnceLock::new();

/// Returns the path of the `redis-server` binary.
///
/// Looks at `$REDIS_SERVER` if set (a path, or a bare name resolved via
/// `PATH`), otherwise searches `PATH`, `/usr/bin`, `/usr/sbin` and
/// `/usr/local/bin`. If nothing is found and the process runs as root on a
/// system with `apt-get`, installs the `redis-server` package once (guarded by
/// an exclusive lock on `/tmp/fairlock-redis-install.lock`, so parallel test
/// processes do not race). The result is cached for the life of the process.
///
/// # Errors
///
/// [`TestkitError::NotInstalled`] with instructions if the binary cannot be
/// found or installed.
pub fn ensure_redis_server() -> Result<PathBuf, TestkitError> {
    if let Some(path) = REDIS_SERVER_BIN.get() {
        return Ok(path.clone());
    }
    let found = locate_or_install()?;
    Ok(REDIS_SERVER_BIN.get_or_init(|| found).clone())
}

fn locate_or_install() -> Result<PathBuf, TestkitError> {
    if let Some(value) = std::env::var_os("REDIS_SERVER").filter(|v| !v.is_empty()) {
        let candidate = PathBuf::from(&value);
        let resolved = if candidate.components().count() == 1 && !candidate.is_absolute() {
            search_path(&value)
        } else {
            Some(candidate).filter(|p| is_executable(p))
        };
        return resolved.ok_or_else(|| {
            TestkitError::NotInstalled(format!(
                "REDIS_SERVER={} is not an executable file; {NOT_INSTALLED_HINT}",
                value.to_string_lossy()
            ))
        });
    }
    if let Some(path) = find_redis_server() {
        return Ok(path);
    }
    match install_with_apt() {
        Ok(Some(path)) => Ok(path),
        Ok(None) => Err(TestkitError::NotInstalled(NOT_INSTALLED_HINT.to_string())),
        Err(why) => Err(TestkitError::NotInstalled(format!(
            "{NOT_INSTALLED_HINT} (automatic installation failed: {why})"
        ))),
    }
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Searches `PATH` and then the fallback directories for `name`.
fn search_path(name: &OsStr) -> Option<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .into_iter()
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn find_redis_server() -> Option<PathBuf> {
    search_path(OsStr::new("redis-server"))
}

/// Installs redis-server via apt-get when running as root.
///
/// `Ok(None)`: not attempted (not root / no apt-get) or still missing after a
/// successful apt run; `Err(why)`: apt-get failed.
fn install_with_apt() -> Result<Option<PathBuf>, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let Some(apt_get) = search_path(OsStr::new("apt-get")) else {
        return Ok(None);
    };
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(INSTALL_LOCK)
        .map_err(|e| format!("cannot open {INSTALL_LOCK}: {e}"))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {INSTALL_LOCK}: {e}"))?;
    // Another process may have installed it while we waited for the lock.
    if let Some(path) = find_redis_server() {
        return Ok(Some(path));
    }
    eprintln!(
        "fairlock-testkit: redis-server not found; running `apt-get update && \
         apt-get install redis-server` as root (one-time setup)"
    );
    let run = |args: &[&str]| -> Result<(), String> {
        let out = Command::new(&apt_get)
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", apt_get.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            Err(format!(
                "`apt-get {}` exited with {}: {}",
                args.join(" "),
                out.status,
                tail_lines(&stderr, 10).trim()
            ))
        }
    };
    // A failed update is not fatal: the package lists may already be usable.
    let update = run(&["update", "-qq"]);
    if let Err(e) = run(&[
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "redis-server",
    ]) {
        return Err(match update {
            Err(u) => format!("{u}; {e}"),
            Ok(()) => e,
        });
    }
    Ok(find_redis_server())
    // `lock` is released when the file is closed here.
}

// ---------------------------------------------------------------------------
// Spawning
// ---------------------------------------------------------------------------

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();

/// Spawns `cmd` from a dedicated thread that lives as long as the process.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not
/// the process. Test harnesses run every test on its own short-lived thread,
/// so forking from the calling thread would kill servers kept in statics (or
/// created on a `spawn_blocking` thread) as soon as that thread finishes.
fn spawn_child(mut cmd: Command) -> io::Result<Child> {
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

fn build_command(bin: &Path, port: u16, dir: &Path, extra: &[OsString]) -> io::Result<Command> {
    let mut cmd = Command::new(bin);
    cmd.arg("--port")
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
        .args(extra)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Redis reports configuration errors on stderr before it opens the
        // log file; keep them (out of the test output) for the error message.
        .stderr(Stdio::from(File::create(dir.join("redis.stderr"))?));
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
    Ok(cmd)
}

fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn fresh_temp_dir() -> io::Result<PathBuf> {
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

fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Summary line plus the tails of `redis.log` and `redis.stderr` in `dir`.
fn start_failure(dir: &Path, summary: &str) -> TestkitError {
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

enum StartError {
    /// Worth retrying (the process exited early, e.g. the port was taken).
    Retry(TestkitError),
    /// Not worth retrying (spawn failed, or PING timed out).
    Fatal(TestkitError),
}

impl StartError {
    fn into_inner(self) -> TestkitError {
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

fn kill_child(child: &mut Child) {
    // Errors only mean the process is already gone.
    let _ = child.kill();
    let _ = child.wait();
}

/// Spawns one redis-server on `port` and waits until it answers PING.
fn launch(bin: &Path, port: u16, dir: &Path, extra: &[OsString]) -> Result<Child, StartError> {
    let cmd =
        build_command(bin, port, dir, extra).map_err(|e| StartError::Fatal(TestkitError::Io(e)))?;
    let mut child = spawn_child(cmd).map_err(|e| {
        StartError::Fatal(TestkitError::Io(io::Error::new(
            e.kind(),
            format!("cannot spawn {}: {e}", bin.display()),
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
                // Somebody else's redis grabbed the port between our probe
                // for a free port and our server's bind.
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

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

/// A throwaway `redis-server` child process on `127.0.0.1`.
///
/// The server runs without persistence (`--save "" --appendonly no`) in its
/// own fresh temp dir (which also holds `redis.log`). Dropping the value
/// SIGKILLs the process, reaps it and removes the temp dir; that also happens
/// when a test panics. If the whole test process dies, the kernel kills the
/// server too (`PR_SET_PDEATHSIG`).
///
/// `RedisServer` is `Send + Sync`, so it can be shared (e.g. in a
/// `static OnceLock<RedisServer>`) between tests.
pub struct RedisServer {
    bin: PathBuf,
    port: u16,
    pid: u32,
    dir: PathBuf,
    args: Vec<OsString>,
    child: Option<Child>,
    conn: Mutex<Option<Conn>>,
}

/// Builder for a [`RedisServer`] with extra command-line arguments.
#[derive(Debug, Clone, Default)]
pub struct RedisServerBuilder {
    args: Vec<OsString>,
}

impl RedisServerBuilder {
    /// Appends one extra `redis-server` argument, e.g. `.arg("--maxclients").arg("100")`.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// Appends several extra `redis-server` arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Starts the server; see [`RedisServer::start`].
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`].
    pub fn start(self) -> Result<RedisServer, TestkitError> {
        RedisServer::start_with_args(self.args)
    }
}

impl RedisServer {
    /// Starts a server on a free port and waits (up to 10 s) until it answers
    /// PING. Up to 5 ports are tried if the server exits during startup.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NotInstalled`] if `redis-server` is missing,
    /// [`TestkitError::StartFailed`] (with the log tail) if it does not come
    /// up, [`TestkitError::Io`] for spawn or temp-dir errors.
    pub fn start() -> Result<RedisServer, TestkitError> {
        RedisServer::start_with_args(Vec::new())
    }

    /// Returns a builder for passing extra `redis-server` arguments.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    fn start_with_args(args: Vec<OsString>) -> Result<RedisServer, TestkitError> {
        let bin = ensure_redis_server()?;
        let dir = fresh_temp_dir()?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let port = match free_port() {
                Ok(port) => port,
                Err(e) => {
                    last_err = Some(TestkitError::Io(e));
                    break;
                }
            };
            // Start every attempt with fresh logs so the error shows this attempt.
            let _ = fs::remove_file(dir.join("redis.log"));
            match launch(&bin, port, &dir, &args) {
                Ok(child) => {
                    return Ok(RedisServer {
                        bin,
                        port,
                        pid: child.id(),
                        dir,
                        args,
                        child: Some(child),
                        conn: Mutex::new(None),
                    });
                }
                Err(StartError::Retry(e)) => last_err = Some(e),
                Err(StartError::Fatal(e)) => {
                    last_err = Some(e);
                    break;
                }
            }
        }
        let _ = fs::remove_dir_all(&dir);
        Err(last_err.unwrap_or_else(|| start_failure(Path::new(""), "no start attempt was made")))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:<port>`, e.g. for [`cmd_at`].
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The TCP port (stays the same across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id of the current (or, after [`kill`](Self::kill), the
    /// last) server process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's temp dir (holds `redis.log`); removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `true` while the server process is running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn drop_conn(&self) {
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// SIGKILLs the server and waits for it to exit (simulates a crash).
    /// Does nothing if it is not running. [`restart`](Self::restart) brings it
    /// back on the same port.
    pub fn kill(&mut self) {
        self.drop_conn();
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
    }

    /// Kills the server (if running) and starts it again on the same port with
    /// the same arguments, waiting until it answers PING. All data is lost
    /// (there is no persistence).
    ///
    /// # Errors
    ///
    /// [`TestkitError::StartFailed`] (with the log tail) if it does not come
    /// back, e.g. because another process took the port meanwhile.
    pub fn restart(&mut self) -> Result<(), TestkitError> {
        self.kill();
        let mut last_err = None;
        for attempt in 0..START_ATTEMPTS {
            if attempt > 0 {
                thread::sleep(Duration::from_millis(100));
            }
            match launch(&self.bin, self.port, &self.dir, &self.args) {
                Ok(child) => {
                    self.pid = child.id();
                    self.child = Some(child);
                    return Ok(());
                }
                Err(StartError::Retry(e)) => last_err = Some(e),
                Err(fatal) => return Err(fatal.into_inner()),
            }
        }
        Err(last_err.unwrap_or_else(|| start_failure(&self.dir, "no restart attempt was made")))
    }

    /// Sends one command over a reused admin connection (5 s connect, read
    /// and write timeouts) and returns the reply. Redis error replies come
    /// back as `Ok(Resp::Error(..))`.
    ///
    /// Note that admin commands show up in [`commandstats`](Self::commandstats)
    /// like any other command.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Io`] if the server is unreachable or times out,
    /// [`TestkitError::Protocol`] for malformed replies.
    pub fn cmd(&self, args: &[&str]) -> Result<Resp, TestkitError> {
        let mut guard = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(conn) = guard.as_mut() {
            match conn.request(args) {
                Ok(reply) => return Ok(reply),
                Err(e) => {
                    *guard = None;
                    // A stale connection (e.g. closed by CLIENT KILL or a
                    // restart) fails without a reply: retry once on a new one.
                    let stale = matches!(&e, TestkitError::Io(io) if matches!(
                        io.kind(),
                        io::ErrorKind::UnexpectedEof
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::BrokenPipe
                    ));
                    if !stale {
                        return Err(e);
                    }
                }
            }
        }
        let mut conn = Conn::connect(&self.addr(), CMD_TIMEOUT)?;
        let reply = conn.request(args)?;
        *guard = Some(conn);
        Ok(reply)
    }

    /// Parses `INFO commandstats` into `{command name: calls}`, e.g.
    /// `{"evalsha": 12, "set": 1}`. Subcommands keep Redis' spelling
    /// (`"client|setname"`). Includes this crate's own admin commands and
    /// the `ping`/`info` of the startup probe; compare before/after values or
    /// call [`reset_stats`](Self::reset_stats) first.
    ///
    /// # Errors
    ///
    /// As [`cmd`](Self::cmd), plus [`TestkitError::Protocol`] for an
    /// unexpected reply.
    pub fn commandstats(&self) -> Result<BTreeMap<String, u64>, TestkitError> {
        parse_commandstats(&self.cmd(&["INFO", "commandstats"])?)
    }

    /// Sum of all `calls` in [`commandstats`](Self::commandstats).
    ///
    /// # Errors
    ///
    /// As [`commandstats`](Self::commandstats).
    pub fn total_commands(&self) -> Result<u64, TestkitError> {
        Ok(self.commandstats()?.values().sum())
    }

    /// Resets the server's statistics (`CONFIG RESETSTAT`). The reset command
    /// itself is then counted as `config|resetstat`.
    ///
    /// # Errors
    ///
    /// As [`cmd`](Self::cmd), plus [`TestkitError::Protocol`] for an error reply.
    pub fn reset_stats(&self) -> Result<(), TestkitError> {
        match self.cmd(&["CONFIG", "RESETSTAT"])? {
            Resp::Simple(_) => Ok(()),
            other => Err(TestkitError::Protocol(format!(
                "unexpected reply to CONFIG RESETSTAT: {other:?}"
            ))),
        }
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid)
            .field("running", &self.child.is_some())
            .field("dir", &self.dir)
            .field("args", &self.args)
            .finish()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn parse_commandstats(reply: &Resp) -> Result<BTreeMap<String, u64>, TestkitError> {
    let text = reply.as_str().ok_or_else(|| {
        TestkitError::Protocol(format!("unexpected reply to INFO commandstats: {reply:?}"))
    })?;
    let mut stats = BTreeMap::new();
    for line in text.lines() {
        let Some((name, fields)) = line
            .trim()
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|c| c.parse::<u64>().ok())
            .ok_or_else(|| {
                TestkitError::Protocol(format!("malformed commandstats line {line:?}"))
            })?;
        stats.insert(name.to_string(), calls);
    }
    Ok(stats)
}

/// Sends one command to the Redis server at `addr` over a fresh connection
/// (5 s connect, read and write timeouts) and returns the reply.
///
/// `addr` is `host:port`; a `redis://host:port[/db]` URL without credentials
/// is accepted too (the db number is ignored).
///
/// # Errors
///
/// As [`RedisServer::cmd`].
pub fn cmd_at(addr: &str, args: &[&str]) -> Result<Resp, TestkitError> {
    let host_port = addr.strip_prefix("redis://").unwrap_or(addr);
    let host_port = host_port.split('/').next().unwrap_or(host_port);
    Conn::connect(host_port, CMD_TIMEOUT)?.request(args)
}

// ---------------------------------------------------------------------------
// RedisTarget
// ---------------------------------------------------------------------------

/// Where examples and benchmarks should connect: an external server given by
/// `REDIS_URL`, or a throwaway local [`RedisServer`].
#[derive(Debug)]
pub enum RedisTarget {
    /// An externally managed server (the value of `REDIS_URL`).
    External(String),
    /// A throwaway server started by this process; stopped when dropped.
    Local(RedisServer),
}

impl RedisTarget {
    /// Uses `REDIS_URL` if it is set and non-empty; otherwise starts a
    /// throwaway `redis-server` (keep the returned value alive while using it).
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`] when no `REDIS_URL` is set.
    pub fn from_env_or_start() -> Result<RedisTarget, TestkitError> {
        RedisTarget::from_url_or_start(std::env::var("REDIS_URL").ok())
    }

    fn from_url_or_start(url: Option<String>) -> Result<RedisTarget, TestkitError> {
        match url.filter(|u| !u.trim().is_empty()) {
            Some(url) => Ok(RedisTarget::External(url.trim().to_string())),
            None => Ok(RedisTarget::Local(RedisServer::start()?)),
        }
    }

    /// The URL to connect to.
    pub fn url(&self) -> String {
        match self {
            RedisTarget::External(url) => url.clone(),
            RedisTarget::Local(server) => server.url(),
        }
    }

    /// One line for a program's output saying which Redis it uses.
    pub fn describe(&self) -> String {
        match self {
            RedisTarget::Local(server) => format!(
                "redis: throwaway redis-server on 127.0.0.1:{} (set REDIS_URL to use your own)",
                server.port()
            ),
            RedisTarget::External(url) => format!("redis: {url} (from REDIS_URL)"),
        }
    }

    /// The local server, if one was started.
    pub fn local(&self) -> Option<&RedisServer> {
        match self {
            RedisTarget::External(_) => None,
            RedisTarget::Local(server) => Some(server),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;

    fn refused(port: u16) -> bool {
        TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            Duration::from_secs(1),
        )
        .is_err()
    }

    #[test]
    fn finds_installed_binary() {
        let bin = ensure_redis_server().unwrap();
        assert!(is_executable(&bin), "{}", bin.display());
        assert_eq!(ensure_redis_server().unwrap(), bin);
    }

    #[test]
    fn ping_and_accessors() {
        let server = RedisServer::start().unwrap();
        assert_eq!(server.cmd(&["PING"]).unwrap(), Resp::Simple("PONG".into()));
        assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
        assert!(Path::new(&format!("/proc/{}", server.pid())).exists());
        assert!(server.dir().join("redis.log").exists());
        // No persistence and the expected bind address.
        let save = server.cmd(&["CONFIG", "GET", "save"]).unwrap();
        assert_eq!(save.as_array().unwrap()[1].as_str(), Some(""));
        let bind = server.cmd(&["CONFIG", "GET", "bind"]).unwrap();
        assert_eq!(bind.as_array().unwrap()[1].as_str(), Some("127.0.0.1"));
        let aof = server.cmd(&["CONFIG", "GET", "appendonly"]).unwrap();
        assert_eq!(aof.as_array().unwrap()[1].as_str(), Some("no"));
    }

    #[test]
    fn set_get_roundtrip_and_replies() {
        let server = RedisServer::start().unwrap();
        assert_eq!(
            server.cmd(&["SET", "k", "hello world"]).unwrap(),
            Resp::Simple("OK".into())
        );
        assert_eq!(
            server.cmd(&["GET", "k"]).unwrap().as_str(),
            Some("hello world")
        );
        assert!(server.cmd(&["GET", "missing"]).unwrap().is_nil());
        assert_eq!(server.cmd(&["INCR", "n"]).unwrap().as_int(), Some(1));
        assert!(server.cmd(&["NOSUCHCMD"]).unwrap().is_error());
        // The connection stays usable after an error reply.
        assert_eq!(server.cmd(&["RPUSH", "l", "a", "b"]).unwrap(), Resp::Int(2));
        assert_eq!(
            server.cmd(&["LRANGE", "l", "0", "-1"]).unwrap(),
            Resp::Array(Some(vec![
                Resp::Bulk(Some(b"a".to_vec())),
                Resp::Bulk(Some(b"b".to_vec())),
            ]))
        );
        // cmd_at with host:port and with a URL.
        assert_eq!(
            cmd_at(&server.addr(), &["GET", "k"]).unwrap().as_str(),
            Some("hello world")
        );
        assert_eq!(
            cmd_at(&format!("{}/0", server.url()), &["PING"]).unwrap(),
            Resp::Simple("PONG".into())
        );
    }

    #[test]
    fn cmd_reconnects_after_client_kill() {
        let server = RedisServer::start().unwrap();
        server.cmd(&["SET", "k", "v"]).unwrap();
        // Kills every normal client, including our cached admin connection
        // (the reply is sent before the connection is closed).
        server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]).unwrap();
        assert_eq!(server.cmd(&["GET", "k"]).unwrap().as_str(), Some("v"));
    }

    #[test]
    fn commandstats_counts_set() {
        let server = RedisServer::start().unwrap();
        let before = server.commandstats().unwrap();
        assert!(before.contains_key("ping"), "{before:?}");
        server.cmd(&["SET", "a", "1"]).unwrap();
        server.cmd(&["SET", "b", "2"]).unwrap();
        let after = server.commandstats().unwrap();
        assert_eq!(
            after.get("set").copied().unwrap_or(0),
            before.get("set").copied().unwrap_or(0) + 2
        );
        // The first INFO commandstats is counted by the second one.
        assert!(after.get("info").copied().unwrap_or(0) >= 1);
        assert_eq!(
            server.total_commands().unwrap(),
            after.values().sum::<u64>() + 1
        );

        server.reset_stats().unwrap();
        let reset = server.commandstats().unwrap();
        assert_eq!(reset.get("set"), None);
        assert_eq!(reset.get("config|resetstat"), Some(&1));
    }

    #[test]
    fn parses_commandstats_text() {
        let text = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\ncmdstat_client|setname:calls=1,usec=1,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n";
        let stats = parse_commandstats(&Resp::Bulk(Some(text.as_bytes().to_vec()))).unwrap();
        assert_eq!(stats.len(), 2);
        assert_eq!(stats["evalsha"], 12);
        assert_eq!(stats["client|setname"], 1);
        assert!(parse_commandstats(&Resp::Error("ERR".into())).is_err());
    }

    #[test]
    fn builder_passes_extra_args() {
        let server = RedisServer::builder()
            .arg("--maxclients")
            .arg("100")
            .args(["--databases", "3"])
            .start()
            .unwrap();
        let reply = server.cmd(&["CONFIG", "GET", "maxclients"]).unwrap();
        assert_eq!(reply.as_array().unwrap()[1].as_str(), Some("100"));
        let reply = server.cmd(&["CONFIG", "GET", "databases"]).unwrap();
        assert_eq!(reply.as_array().unwrap()[1].as_str(), Some("3"));
    }

    #[test]
    fn bad_args_fail_with_log_tail() {
        let err = RedisServer::builder()
            .arg("--no-such-option")
            .arg("1")
            .start()
            .unwrap_err();
        let TestkitError::StartFailed { log_tail } = &err else {
            panic!("unexpected error {err:?}");
        };
        assert!(log_tail.contains("no-such-option"), "{log_tail}");
        assert!(err.to_string().contains("Bad directive"), "{err}");
    }

    #[test]
    fn restart_keeps_port_and_loses_data() {
        let mut server = RedisServer::builder()
            .arg("--maxclients")
            .arg("50")
            .start()
            .unwrap();
        let (port, pid) = (server.port(), server.pid());
        server.cmd(&["SET", "k", "v"]).unwrap();
        server.restart().unwrap();
        assert_eq!(server.port(), port);
        assert_ne!(server.pid(), pid);
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        assert_eq!(server.cmd(&["PING"]).unwrap(), Resp::Simple("PONG".into()));
        assert!(server.cmd(&["GET", "k"]).unwrap().is_nil());
        // Same args as before.
        let reply = server.cmd(&["CONFIG", "GET", "maxclients"]).unwrap();
        assert_eq!(reply.as_array().unwrap()[1].as_str(), Some("50"));
    }

    #[test]
    fn kill_then_restart() {
        let mut server = RedisServer::start().unwrap();
        let (port, pid) = (server.port(), server.pid());
        server.kill();
        assert!(!server.is_running());
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        assert!(refused(port));
        assert!(matches!(server.cmd(&["PING"]), Err(TestkitError::Io(_))));
        server.kill(); // idempotent
        server.restart().unwrap();
        assert!(server.is_running());
        assert_eq!(server.port(), port);
        assert_eq!(server.cmd(&["PING"]).unwrap(), Resp::Simple("PONG".into()));
    }

    #[test]
    fn drop_kills_process_and_removes_dir() {
        let server = RedisServer::start().unwrap();
        let (port, pid, dir) = (server.port(), server.pid(), server.dir().to_path_buf());
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        drop(server);
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        assert!(refused(port));
        assert!(!dir.exists());
    }

    #[test]
    fn drop_runs_on_panic() {
        let (tx, rx) = mpsc::channel();
        let result = thread::spawn(move || {
            let server = RedisServer::start().unwrap();
            tx.send((server.pid(), server.port())).unwrap();
            panic!("test failure while a server is running");
        })
        .join();
        assert!(result.is_err());
        let (pid, port) = rx.recv().unwrap();
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        assert!(refused(port));
    }

    #[test]
    fn outlives_the_thread_that_started_it() {
        // PR_SET_PDEATHSIG is tied to the forking thread; servers are forked
        // from a long-lived spawner thread so this must keep working.
        let server = thread::spawn(|| RedisServer::start().unwrap())
            .join()
            .unwrap();
        thread::sleep(Duration::from_millis(300));
        assert_eq!(server.cmd(&["PING"]).unwrap(), Resp::Simple("PONG".into()));
    }

    #[test]
    fn parallel_servers_get_distinct_ports() {
        let servers: Vec<RedisServer> = (0..8)
            .map(|_| thread::spawn(|| RedisServer::start().unwrap()))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), servers.len());
        for s in &servers {
            assert_eq!(s.cmd(&["PING"]).unwrap(), Resp::Simple("PONG".into()));
        }
    }

    #[test]
    fn target_external_or_local() {
        let ext = RedisTarget::from_url_or_start(Some("redis://example:6379".into())).unwrap();
        assert_eq!(ext.url(), "redis://example:6379");
        assert!(ext.local().is_none());
        for url in [None, Some(String::new()), Some("  ".into())] {
            let local = RedisTarget::from_url_or_start(url).unwrap();
            let server = local.local().unwrap();
            assert_eq!(local.url(), server.url());
            assert_eq!(
                cmd_at(&local.url(), &["PING"]).unwrap(),
                Resp::Simple("PONG".into())
            );
        }
    }

    #[test]
    fn error_display() {
        let e = TestkitError::NotInstalled(NOT_INSTALLED_HINT.into());
        assert!(e.to_string().contains("sudo apt-get install redis-server"));
        assert!(e.to_string().contains("REDIS_SERVER=/path/to/redis-server"));
        let io = TestkitError::from(io::Error::other("boom"));
        assert!(std::error::Error::source(&io).is_some());
        assert!(io.to_string().contains("boom"));
    }

    #[test]
    fn temp_dirs_are_unique() {
        let a = fresh_temp_dir().unwrap();
        let b = fresh_temp_dir().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(std::env::temp_dir()));
        fs::remove_dir(a).unwrap();
        fs::remove_dir(b).unwrap();
    }
}
