//! The harness's own view of Redis: the throwaway server, reset between
//! cells, and the statistics the report is built from (`INFO
//! commandstats`, `INFO cpu`, `INFO memory`, `CLIENT LIST`).
//!
//! It speaks through fairlock-testkit's small blocking admin connection,
//! so none of these commands share a connection with a lock under test.
//! Calls run on tokio's blocking pool and never stall a worker thread.

use std::collections::BTreeMap;
use std::sync::Arc;

use fairlock_testkit::{RedisServer, Resp};

use crate::impls::Result;

/// Commands the harness itself sends while a cell is measured (statistics,
/// and the PINGs that measure the round trip under load); they are not
/// counted as lock work.
pub const HARNESS_COMMANDS: &[&str] = &["info", "config|resetstat", "ping"];

/// The throwaway Redis server and admin commands against it.
#[derive(Clone)]
pub struct Admin {
    server: Arc<RedisServer>,
}

impl Admin {
    /// Starts a throwaway `redis-server` on 127.0.0.1.
    pub fn start() -> Result<Admin> {
        Ok(Admin {
            server: Arc::new(RedisServer::start()?),
        })
    }

    /// The URL the locks under test connect to.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Runs one command on the admin connection.
    pub async fn cmd(&self, args: &[&str]) -> Result<Resp> {
        let server = Arc::clone(&self.server);
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let reply = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            server.cmd(&args)
        })
        .await??;
        if let Resp::Error(e) = &reply {
            return Err(format!("Redis refused an admin command: {e}").into());
        }
        Ok(reply)
    }

    /// Empties the data set (scripts stay loaded).
    pub async fn flushall(&self) -> Result<()> {
        self.cmd(&["FLUSHALL"]).await.map(drop)
    }

    /// `CONFIG RESETSTAT`: zeroes `INFO commandstats`.
    pub async fn reset_stats(&self) -> Result<()> {
        self.cmd(&["CONFIG", "RESETSTAT"]).await.map(drop)
    }

    /// `INFO commandstats` as `{command: calls}`.
    pub async fn commandstats(&self) -> Result<BTreeMap<String, u64>> {
        let server = Arc::clone(&self.server);
        Ok(tokio::task::spawn_blocking(move || server.commandstats()).await??)
    }

    /// The numeric fields of one `INFO` section.
    pub async fn info(&self, section: &str) -> Result<BTreeMap<String, f64>> {
        let reply = self.cmd(&["INFO", section]).await?;
        let text = reply
            .as_str()
            .ok_or_else(|| format!("INFO {section}: unexpected reply {reply:?}"))?;
        Ok(text
            .lines()
            .filter_map(|line| line.trim().split_once(':'))
            .filter_map(|(k, v)| v.parse::<f64>().ok().map(|v| (k.to_owned(), v)))
            .collect())
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

    /// Integer values of `keys` (missing keys read as 0).
    pub async fn counters(&self, keys: &[String]) -> Result<Vec<i64>> {
        let mut args: Vec<&str> = vec!["MGET"];
        args.extend(keys.iter().map(String::as_str));
        let reply = self.cmd(&args).await?;
        let values = reply
            .as_array()
            .ok_or_else(|| format!("MGET: unexpected reply {reply:?}"))?;
        values
            .iter()
            .map(|v| match v.as_str() {
                None => Ok(0),
                Some(s) => s
                    .parse::<i64>()
                    .map_err(|e| format!("counter value {s:?}: {e}").into()),
            })
            .collect()
    }
}
