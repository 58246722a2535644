//! A throwaway Prometheus server on 127.0.0.1, and `promtool`, for the
//! tests that check fairlock's metrics, dashboard and alert rules with the
//! real tools instead of a hand-written parser of the text format.
//!
//! * [`ensure_prometheus`] locates (and, as root with apt-get, installs the
//!   Debian package `prometheus`, which ships both binaries) `prometheus`
//!   and `promtool`.
//! * [`PrometheusServer`] is a child `prometheus` on a free port (reserved
//!   for the kit like a `RedisServer`'s) with a
//!   generated config (scrape and rule evaluation every second), its own
//!   temp storage, killed on drop and when the test process dies
//!   (`PR_SET_PDEATHSIG`, forked from the testkit's spawner thread like
//!   `RedisServer`).
//! * [`PrometheusServer::query`] is a small blocking client of the instant
//!   query API (`/api/v1/query`) with timeouts, so a test never hangs on a
//!   server that stopped answering.
//!
//! ```no_run
//! use fairlock_testkit::PrometheusServer;
//!
//! let exporter: std::net::SocketAddr = "127.0.0.1:9464".parse().unwrap();
//! let prometheus = PrometheusServer::builder().target(exporter).start()?;
//! for sample in prometheus.query("sum(fairlock_acquire_total)")? {
//!     println!("{:?} {}", sample.labels, sample.value);
//! }
//! # Ok::<(), fairlock_testkit::PrometheusError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use crate::install::ensure_debian_binaries;
use crate::ports::{self, PortLease};
use crate::process::{die_with_parent, fresh_temp_dir, spawn_child, tail_lines};

/// How long a fresh server has to answer `/-/ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Connect, read and write timeout of one API call.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Ports tried when the one picked was taken in between.
const START_ATTEMPTS: usize = 5;
/// The job name every configured target is scraped under.
pub const SCRAPE_JOB: &str = "fairlock";

/// Why Prometheus could not be found, started or asked.
#[derive(Debug)]
pub enum PrometheusError {
    /// `prometheus` or `promtool` is missing and could not be installed;
    /// the message says why and how to install it. Tests skip on this one
    /// only, with the message printed.
    NotInstalled(String),
    /// Spawning, reading the temp dir, or a socket failed.
    Io(io::Error),
    /// The server did not come up; the tail of its log follows.
    StartFailed(String),
    /// The query API answered with an error (`status: error`, a non-200
    /// status, or a body that is not the documented JSON).
    Api(String),
}

impl fmt::Display for PrometheusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInstalled(why) => f.write_str(why),
            Self::Io(e) => write!(f, "I/O error: {e}"),
            Self::StartFailed(log) => write!(f, "prometheus failed to start: {log}"),
            Self::Api(why) => write!(f, "Prometheus query API: {why}"),
        }
    }
}

impl std::error::Error for PrometheusError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for PrometheusError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

// ---------------------------------------------------------------------------
// Locating / installing
// ---------------------------------------------------------------------------

/// The two binaries of the Debian package `prometheus`.
#[derive(Clone, Debug)]
pub struct PrometheusBins {
    /// The server.
    pub prometheus: PathBuf,
    /// The rules and config checker (`promtool check rules`, `test rules`).
    pub promtool: PathBuf,
}

impl PrometheusBins {
    /// Runs `promtool` with `args` in `dir` and returns its output,
    /// whatever its exit status (the caller asserts on it).
    ///
    /// # Errors
    ///
    /// [`PrometheusError::Io`] if it cannot be run.
    pub fn promtool(&self, dir: &Path, args: &[&str]) -> Result<Output, PrometheusError> {
        Ok(Command::new(&self.promtool)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()?)
    }
}

static BINS: OnceLock<PrometheusBins> = OnceLock::new();

/// Returns the paths of `prometheus` and `promtool`, found on `PATH` (or
/// `/usr/bin`, ...), or installed once with `apt-get install prometheus`
/// when running as root (see [`ensure_debian_binaries`]). Cached for the
/// life of the process.
///
/// # Errors
///
/// [`PrometheusError::NotInstalled`] with the reason when they are missing
/// and could not be installed.
pub fn ensure_prometheus() -> Result<PrometheusBins, PrometheusError> {
    if let Some(bins) = BINS.get() {
        return Ok(bins.clone());
    }
    let found = match ensure_debian_binaries(&["prometheus", "promtool"], "prometheus")
        .map_err(PrometheusError::NotInstalled)?
        .as_slice()
    {
        [prometheus, promtool] => PrometheusBins {
            prometheus: prometheus.clone(),
            promtool: promtool.clone(),
        },
        other => {
            return Err(PrometheusError::NotInstalled(format!(
                "expected two binaries, found {other:?}"
            )))
        }
    };
    Ok(BINS.get_or_init(|| found).clone())
}

// ---------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------

/// Configures a [`PrometheusServer`] before it starts.
#[derive(Debug, Default)]
pub struct PrometheusServerBuilder {
    targets: Vec<SocketAddr>,
    rule_files: Vec<PathBuf>,
}

impl PrometheusServerBuilder {
    /// Scrapes `addr` (`http://addr/metrics`) every second, as job
    /// [`SCRAPE_JOB`].
    pub fn target(mut self, addr: SocketAddr) -> Self {
        self.targets.push(addr);
        self
    }

    /// Loads an alerting or recording rules file, evaluated every second.
    pub fn rule_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.rule_files.push(path.into());
        self
    }

    /// Installs Prometheus if needed and starts it on a free port, ready to
    /// answer queries, and returns once every target has been scraped
    /// successfully: Prometheus hands new targets to its scrapers only
    /// about 5 s after it starts, and a workload run before that would
    /// leave no trace but its final counts.
    ///
    /// # Errors
    ///
    /// [`PrometheusError::NotInstalled`], or [`PrometheusError::StartFailed`]
    /// with the tail of its log, also when a target was never scraped.
    pub fn start(self) -> Result<PrometheusServer, PrometheusError> {
        let bins = ensure_prometheus()?;
        let dir = fresh_temp_dir()?;
        let config = dir.join("prometheus.yml");
        fs::write(&config, self.config_yaml())?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let lease = ports::reserve()?;
            let port = lease.port();
            match launch(&bins.prometheus, &dir, port) {
                Ok(child) => {
                    let server = PrometheusServer {
                        child,
                        port,
                        _lease: lease,
                        dir,
                    };
                    server.wait_for_targets(self.targets.len())?;
                    return Ok(server);
                }
                Err(e) => last = Some(e),
            }
        }
        let _ = fs::remove_dir_all(&dir);
        Err(last.unwrap_or_else(|| PrometheusError::StartFailed("no attempt made".into())))
    }

    fn config_yaml(&self) -> String {
        let targets = self
            .targets
            .iter()
            .map(|addr| format!("'{addr}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let rules = if self.rule_files.is_empty() {
            " []\n".to_owned()
        } else {
            self.rule_files
                .iter()
                .map(|path| format!("\n  - '{}'", path.display()))
                .collect::<String>()
                + "\n"
        };
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:{rules}\
             scrape_configs:\n  - job_name: '{SCRAPE_JOB}'\n    static_configs:\n      - targets: [{targets}]\n"
        )
    }
}

/// Starts one `prometheus` and waits for `/-/ready`, answered by this
/// child: after a 200 the child must still be running and, where `/proc`
/// tells, be the process listening on `port`. A child that exits early
/// (its port was taken) is an error worth another port.
fn launch(bin: &Path, dir: &Path, port: u16) -> Result<Child, PrometheusError> {
    let log = dir.join("prometheus.log");
    let mut cmd = Command::new(bin);
    cmd.arg(format!(
        "--config.file={}",
        dir.join("prometheus.yml").display()
    ))
    .arg(format!(
        "--storage.tsdb.path={}",
        dir.join("data").display()
    ))
    .arg(format!("--web.listen-address=127.0.0.1:{port}"))
    .arg("--storage.tsdb.retention.time=1h")
    .current_dir(dir)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::from(File::create(&log)?));
    die_with_parent(&mut cmd);
    let mut child = spawn_child(cmd)?;
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + READY_TIMEOUT;
    let failure = |summary: &str| {
        let text = fs::read_to_string(&log).unwrap_or_default();
        PrometheusError::StartFailed(format!(
            "{summary}\n--- last lines of {} ---\n{}",
            log.display(),
            tail_lines(&text, 30)
        ))
    };
    loop {
        if let Some(status) = child.try_wait()? {
            return Err(failure(&format!("prometheus exited with {status}")));
        }
        if matches!(http_get(addr, "/-/ready"), Ok((200, _))) {
            // Somebody else's server may answer while ours fails to bind.
            if child.try_wait()?.is_some() {
                continue; // Reported at the top of the loop.
            }
            if listens_on(child.id(), port) != Some(false) {
                return Ok(child);
            }
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failure(&format!(
                "not ready within {} s",
                READY_TIMEOUT.as_secs()
            )));
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// A child `prometheus` on 127.0.0.1, killed and its storage removed on
/// drop. Start it with [`PrometheusServer::builder`].
#[derive(Debug)]
pub struct PrometheusServer {
    child: Child,
    port: u16,
    /// Keeps other servers of the kit off `port` until drop.
    _lease: PortLease,
    dir: PathBuf,
}

/// One sample of an instant query's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct PromSample {
    /// The series' labels (`__name__` included when the query kept it).
    pub labels: BTreeMap<String, String>,
    /// The sample value (`NaN` and the infinities are kept as such).
    pub value: f64,
}

impl PrometheusServer {
    /// A builder: add scrape targets and rule files, then `start`.
    pub fn builder() -> PrometheusServerBuilder {
        PrometheusServerBuilder::default()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's temp dir (config, storage, `prometheus.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// Runs an instant PromQL query at the server's current time. A vector
    /// answer is returned sample by sample, a scalar as one sample without
    /// labels; an empty vector is an empty `Vec`.
    ///
    /// # Errors
    ///
    /// [`PrometheusError::Api`] when the query is refused (bad PromQL, a
    /// timeout on the server) or the answer is not the documented JSON;
    /// [`PrometheusError::Io`] on a socket error or timeout.
    pub fn query(&self, promql: &str) -> Result<Vec<PromSample>, PrometheusError> {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        let body = self.api_get(&path)?;
        parse_query(&body).map_err(|why| PrometheusError::Api(format!("{promql}: {why}")))
    }

    /// The raw JSON body of a GET on an API path, e.g. `/api/v1/rules` or
    /// `/api/v1/alerts`, after checking `"status":"success"`.
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query).
    pub fn api_get(&self, path: &str) -> Result<serde_json::Value, PrometheusError> {
        let (status, body) = http_get(self.addr(), path)?;
        let json: serde_json::Value = serde_json::from_str(&body).map_err(|e| {
            PrometheusError::Api(format!("GET {path}: HTTP {status}, not JSON ({e}): {body}"))
        })?;
        if status != 200 || json["status"] != "success" {
            return Err(PrometheusError::Api(format!(
                "GET {path}: HTTP {status}: {} {}",
                json["errorType"], json["error"]
            )));
        }
        Ok(json)
    }

    /// Waits until `count` targets of [`SCRAPE_JOB`] answered a scrape.
    fn wait_for_targets(&self, count: usize) -> Result<(), PrometheusError> {
        if count == 0 {
            return Ok(());
        }
        let query = format!("count(up{{job=\"{SCRAPE_JOB}\"}} == 1)");
        let up = self.query_until(&query, READY_TIMEOUT, |samples| {
            samples.first().is_some_and(|s| s.value >= count as f64)
        })?;
        if up.first().is_some_and(|s| s.value >= count as f64) {
            return Ok(());
        }
        let log = fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        Err(PrometheusError::StartFailed(format!(
            "{count} target(s) not all scraped within {} s ({query} = {up:?})\n{}",
            READY_TIMEOUT.as_secs(),
            tail_lines(&log, 30)
        )))
    }

    /// Asks `query` every 250 ms until `done` accepts its answer, or
    /// `timeout` passes; returns the last answer either way (the caller
    /// asserts on it, so a failure shows what Prometheus last said).
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query), for the last attempt.
    pub fn query_until(
        &self,
        promql: &str,
        timeout: Duration,
        done: impl Fn(&[PromSample]) -> bool,
    ) -> Result<Vec<PromSample>, PrometheusError> {
        let deadline = Instant::now() + timeout;
        loop {
            let answer = self.query(promql);
            let finished = matches!(&answer, Ok(samples) if done(samples));
            if finished || Instant::now() >= deadline {
                return answer;
            }
            thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Whether process `pid` has the socket listening on `127.0.0.1:port`
/// open, from `/proc/net/tcp` and `/proc/<pid>/fd`; `None` when `/proc`
/// does not tell (then the caller trusts the answer it got).
fn listens_on(pid: u32, port: u16) -> Option<bool> {
    let table = fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    // Columns: sl local_address rem_address st ... inode; 0A is LISTEN.
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            (cols.get(1) == Some(&local.as_str()) && cols.get(3) == Some(&"0A"))
                .then(|| cols.get(9).map(|inode| format!("socket:[{inode}]")))
                .flatten()
        })
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(fds.filter_map(Result::ok).any(|fd| {
        fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    }))
}

/// The samples of a `/api/v1/query` answer.
fn parse_query(json: &serde_json::Value) -> Result<Vec<PromSample>, String> {
    let data = &json["data"];
    let sample = |labels: &serde_json::Value, pair: &serde_json::Value| {
        let value = pair[1]
            .as_str()
            .ok_or_else(|| format!("no [time, \"value\"] pair in {pair}"))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().map_err(|e| format!("value {v:?}: {e}"))?,
        };
        let labels = labels
            .as_object()
            .map(|map| {
                map.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        Ok::<_, String>(PromSample { labels, value })
    };
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .ok_or("no result array")?
            .iter()
            .map(|s| sample(&s["metric"], &s["value"]))
            .collect(),
        Some("scalar") => Ok(vec![sample(&serde_json::Value::Null, &data["result"])?]),
        other => Err(format!("unexpected resultType {other:?}")),
    }
}

/// Percent-encodes a query string value (RFC 3986 unreserved kept).
fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A blocking HTTP/1.0 GET with timeouts on connect, write and every read;
/// the server closes the connection after the body. Returns the status
/// code and the body.
fn http_get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = Vec::new();
    let deadline = Instant::now() + HTTP_TIMEOUT;
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        response.extend_from_slice(&buf[..n]);
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "GET {path}: the answer took over {} s",
                    HTTP_TIMEOUT.as_secs()
                ),
            ));
        }
    }
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no HTTP header"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no HTTP status"))?;
    Ok((status, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_lists_targets_and_rule_files() {
        let bare = PrometheusServer::builder().config_yaml();
        assert!(bare.contains("rule_files: []\n"), "{bare}");
        assert!(bare.contains("scrape_interval: 1s"), "{bare}");
        let full = PrometheusServer::builder()
            .target("127.0.0.1:9464".parse().unwrap())
            .rule_file("/tmp/a.yml")
            .config_yaml();
        assert!(full.contains("rule_files:\n  - '/tmp/a.yml'\n"), "{full}");
        assert!(full.contains("targets: ['127.0.0.1:9464']"), "{full}");
    }

    /// A real server answers a scalar, refuses bad PromQL with an API
    /// error, and is gone with its storage after drop.
    #[test]
    fn a_real_server_answers_and_refuses() {
        if let Err(PrometheusError::NotInstalled(why)) = ensure_prometheus() {
            let _ = writeln!(
                io::stderr(),
                "SKIPPED a_real_server_answers_and_refuses: {why}"
            );
            return;
        }
        let server = PrometheusServer::builder().start().unwrap();
        let answer = server.query("1 + 1").unwrap();
        assert_eq!(answer.len(), 1);
        assert_eq!(answer[0].value, 2.0);
        assert!(
            server.query("up").unwrap().is_empty(),
            "no targets, no up series"
        );
        assert!(matches!(
            server.query("sum(("),
            Err(PrometheusError::Api(_))
        ));
        let dir = server.dir().to_owned();
        let addr = server.addr();
        drop(server);
        assert!(!dir.exists());
        assert!(
            http_get(addr, "/-/ready").is_err(),
            "still answering after drop"
        );
    }

    #[test]
    fn listener_ownership_is_read_from_proc() {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(listens_on(std::process::id(), port), Some(true));
        // PID 1 is not us, and does not listen on our port.
        if fs::read_dir("/proc/1/fd").is_ok() {
            assert_eq!(listens_on(1, port), Some(false));
        }
        // Nobody listens on the near end of an open connection, and
        // nobody can while it is open (a port just given up instead could
        // be taken at once by another process: this test once saw
        // `Some(false)` for it in CI).
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let near = client.local_addr().unwrap().port();
        assert_eq!(listens_on(std::process::id(), near), None);
    }

    #[test]
    fn url_encoding_keeps_promql_intact() {
        assert_eq!(
            url_encode("sum(rate(x{a=\"b\"}[1m]))"),
            "sum%28rate%28x%7Ba%3D%22b%22%7D%5B1m%5D%29%29"
        );
    }

    #[test]
    fn vector_and_scalar_answers_parse() {
        let vector: serde_json::Value = serde_json::from_str(
            r#"{"status":"success","data":{"resultType":"vector","result":[
                {"metric":{"outcome":"acquired"},"value":[1.5,"42"]},
                {"metric":{},"value":[1.5,"NaN"]}]}}"#,
        )
        .unwrap();
        let samples = parse_query(&vector).unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].labels["outcome"], "acquired");
        assert_eq!(samples[0].value, 42.0);
        assert!(samples[1].value.is_nan());
        let scalar: serde_json::Value = serde_json::from_str(
            r#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"3"]}}"#,
        )
        .unwrap();
        assert_eq!(parse_query(&scalar).unwrap()[0].value, 3.0);
    }
}
