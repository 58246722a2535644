//! The harness's own view of Redis: the throwaway server, reset between
//! cells, and the statistics the report is built from (`INFO
//! commandstats`, `INFO cpu`, `INFO memory`, `CLIENT LIST`).
//!
//! It speaks through fairlock-testkit's small blocking admin connection,
//! so none of these commands share a connection with a lock under test.
//! Calls run on tokio's blocking pool and never stall a worker thread.

use std::collections::BTreeMap;
use std::sync::Arc;

use fairlock_testkit::{RedisCluster, RedisServer, Resp, SentinelGroup, TlsFiles};

use crate::impls::Result;

/// Commands the harness itself sends while a cell is measured (statistics,
/// and the PINGs that measure the round trip under load); they are not
/// counted as lock work.
pub const HARNESS_COMMANDS: &[&str] = &["info", "config|resetstat", "ping"];

/// The servers a run measures: one throwaway `redis-server`, or a whole
/// topology (Redis Cluster, Sentinel group) whose primaries are summed.
pub trait Servers: Send + Sync {
    /// The URL the locks under test connect to.
    fn url(&self) -> String;
    /// The primaries: statistics are summed over them, resets hit each.
    fn primaries(&self) -> Vec<&RedisServer>;
    /// The URL naming the TLS ports, for servers started with TLS.
    fn tls_url(&self) -> Option<String>;
}

impl Servers for RedisServer {
    fn url(&self) -> String {
        RedisServer::url(self)
    }
    fn tls_url(&self) -> Option<String> {
        RedisServer::tls_url(self)
    }
    fn primaries(&self) -> Vec<&RedisServer> {
        vec![self]
    }
}

impl Servers for RedisCluster {
    fn url(&self) -> String {
        RedisCluster::url(self)
    }
    fn tls_url(&self) -> Option<String> {
        RedisCluster::tls_url(self)
    }
    fn primaries(&self) -> Vec<&RedisServer> {
        RedisCluster::primaries(self)
            .unwrap_or_default()
            .iter()
            .filter_map(|addr| self.node(addr).ok())
            .collect()
    }
}

impl Servers for SentinelGroup {
    fn url(&self) -> String {
        SentinelGroup::url(self)
    }
    fn tls_url(&self) -> Option<String> {
        SentinelGroup::tls_url(self)
    }
    fn primaries(&self) -> Vec<&RedisServer> {
        self.primary_addr()
            .ok()
            .and_then(|addr| self.node(&addr).ok())
            .into_iter()
            .collect()
    }
}

/// A topology whose servers also listen for TLS, reached through its TLS
/// URL (`rediss://`, `rediss-cluster://`, `rediss-sentinel://`); the
/// harness's admin commands still go over plain TCP. Owns the certificate
/// files the servers read.
pub struct OverTls<S> {
    servers: S,
    url: String,
    _files: TlsFiles,
}

impl<S: Servers> OverTls<S> {
    /// `servers`, started with `files`, reached at their TLS URL.
    pub fn new(servers: S, files: TlsFiles) -> Result<Self> {
        let url = servers
            .tls_url()
            .ok_or("the servers were started without a TLS port")?;
        Ok(Self {
            servers,
            url,
            _files: files,
        })
    }
}

impl<S: Servers> Servers for OverTls<S> {
    fn url(&self) -> String {
        self.url.clone()
    }
    fn primaries(&self) -> Vec<&RedisServer> {
        self.servers.primaries()
    }
    fn tls_url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

/// The throwaway Redis server(s) and admin commands against them.
#[derive(Clone)]
pub struct Admin {
    servers: Arc<dyn Servers>,
}

impl Admin {
    /// Starts a throwaway `redis-server` on 127.0.0.1.
    pub fn start() -> Result<Admin> {
        Ok(Admin::over(RedisServer::start()?))
    }

    /// Measures `servers` (a cluster, a Sentinel group...).
    pub fn over(servers: impl Servers + 'static) -> Admin {
        Admin {
            servers: Arc::new(servers),
        }
    }

    /// The URL the locks under test connect to.
    pub fn url(&self) -> String {
        self.servers.url()
    }

    /// Runs one command on the first primary's admin connection.
    pub async fn cmd(&self, args: &[&str]) -> Result<Resp> {
        let mut replies = self.on_primaries(args).await?;
        if replies.is_empty() {
            return Err("no primary to send an admin command to".into());
        }
        Ok(replies.swap_remove(0))
    }

    /// Runs one command on every primary; errors if any refuses it.
    async fn on_primaries(&self, args: &[&str]) -> Result<Vec<Resp>> {
        let replies = self.on_primaries_raw(args).await?;
        if let Some(Resp::Error(e)) = replies.iter().find(|r| matches!(r, Resp::Error(_))) {
            return Err(format!("Redis refused an admin command: {e}").into());
        }
        Ok(replies)
    }

    /// Runs one command on every primary, error replies included.
    async fn on_primaries_raw(&self, args: &[&str]) -> Result<Vec<Resp>> {
        let servers = Arc::clone(&self.servers);
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let replies = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            servers
                .primaries()
                .into_iter()
                .map(|server| server.cmd(&args))
                .collect::<std::result::Result<Vec<Resp>, _>>()
        })
        .await??;
        Ok(replies)
    }

    /// Empties the data set of every primary (scripts stay loaded).
    pub async fn flushall(&self) -> Result<()> {
        self.on_primaries(&["FLUSHALL"]).await.map(drop)
    }

    /// `CONFIG RESETSTAT` on every primary: zeroes `INFO commandstats`.
    pub async fn reset_stats(&self) -> Result<()> {
        self.on_primaries(&["CONFIG", "RESETSTAT"]).await.map(drop)
    }

    /// `INFO commandstats` as `{command: calls}`, summed over the primaries.
    pub async fn commandstats(&self) -> Result<BTreeMap<String, u64>> {
        let servers = Arc::clone(&self.servers);
        let each = tokio::task::spawn_blocking(move || {
            servers
                .primaries()
                .into_iter()
                .map(|server| server.commandstats())
                .collect::<std::result::Result<Vec<_>, _>>()
        })
        .await??;
        let mut total = BTreeMap::new();
        for stats in each {
            for (command, calls) in stats {
                *total.entry(command).or_insert(0) += calls;
            }
        }
        Ok(total)
    }

    /// The numeric fields of one `INFO` section, summed over the primaries.
    pub async fn info(&self, section: &str) -> Result<BTreeMap<String, f64>> {
        let mut total = BTreeMap::new();
        for reply in self.on_primaries(&["INFO", section]).await? {
            let text = reply
                .as_str()
                .ok_or_else(|| format!("INFO {section}: unexpected reply {reply:?}"))?;
            for (k, v) in text
                .lines()
                .filter_map(|line| line.trim().split_once(':'))
                .filter_map(|(k, v)| v.parse::<f64>().ok().map(|v| (k.to_owned(), v)))
            {
                *total.entry(k).or_insert(0.0) += v;
            }
        }
        Ok(total)
    }

    /// Redis CPU time so far (`used_cpu_sys + used_cpu_user`), seconds.
    pub async fn cpu_seconds(&self) -> Result<f64> {
        let cpu = self.info("cpu").await?;
        Ok(cpu.get("used_cpu_sys").copied().unwrap_or(0.0)
            + cpu.get("used_cpu_user").copied().unwrap_or(0.0))
    }

    /// `used_memory`, bytes.
    pub async fn used_memory(&self) -> Result<f64> {
        self.info("memory")
            .await?
            .get("used_memory")
            .copied()
            .ok_or_else(|| "INFO memory has no used_memory".into())
    }

    /// The server's version string.
    pub async fn version(&self) -> Result<String> {
        let reply = self.cmd(&["INFO", "server"]).await?;
        Ok(reply
            .as_str()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.trim().strip_prefix("redis_version:"))
            })
            .unwrap_or("unknown")
            .to_owned())
    }

    /// `CLIENT LIST` without the admin connection itself: one map of
    /// fields (`id`, `flags`, `sub`, ...) per client connection.
    pub async fn clients(&self) -> Result<Vec<BTreeMap<String, String>>> {
        let reply = self.cmd(&["CLIENT", "LIST"]).await?;
        let text = reply
            .as_str()
            .ok_or_else(|| format!("CLIENT LIST: unexpected reply {reply:?}"))?;
        Ok(text
            .lines()
            .map(|line| {
                line.split_whitespace()
                    .filter_map(|field| field.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect::<BTreeMap<_, _>>()
            })
            .filter(|fields| fields.get("cmd").map(String::as_str) != Some("client|list"))
            .collect())
    }

    /// Integer values of `keys` (missing keys read as 0). Each key is read
    /// with GET from the primary that has it (on a cluster the others
    /// answer MOVED).
    pub async fn counters(&self, keys: &[String]) -> Result<Vec<i64>> {
        let mut values = Vec::with_capacity(keys.len());
        for key in keys {
            let replies = self.on_primaries_raw(&["GET", key]).await?;
            let value = replies
                .iter()
                .find(|r| !matches!(r, Resp::Error(_)))
                .ok_or_else(|| format!("GET {key}: every primary refused: {replies:?}"))?;
            values.push(match value.as_str() {
                None => 0,
                Some(s) => s
                    .parse::<i64>()
                    .map_err(|e| format!("counter value {s:?}: {e}"))?,
            });
        }
        Ok(values)
    }
}
