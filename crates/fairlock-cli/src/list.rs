//! `fairlock list`: locks that have a holder or waiters.
//!
//! The client has no scan API (a lock library should not enumerate the
//! keyspace), so this module talks to Redis through fred directly, with
//! SCAN only: never KEYS, which blocks the server. The scan is bounded
//! (COUNT per call and a cap on calls, each with a timeout) and says when
//! it stopped early. On a Redis Cluster it scans every primary.
//!
//! Keys are `<prefix>{<escaped name>}:<kind>`; a lock with a holder has an
//! `:owner` key and one with waiters a `:queue` key, so those two kinds are
//! collected and folded by name, then each lock is inspected.

use std::collections::BTreeSet;
use std::time::Duration;

use fairlock::{LockClient, LockName};
use fred::prelude::{Builder, ClientLike, ClusterInterface, Config, Server, Value};
use fred::types::{ClusterHash, CustomCommand};
use serde::Serialize;

use crate::args::GlobalArgs;
use crate::connect::redis_url;
use crate::duration::human_millis;
use crate::exit::{Failure, FAILURE, UNAVAILABLE};
use crate::name::{hex_if_binary, shown};
use crate::output::emit;

/// Keys asked for per SCAN call.
const SCAN_COUNT: u32 = 1_000;

#[derive(Serialize)]
struct ListReport {
    /// Locks found, by name, with their state.
    locks: Vec<ListedLock>,
    /// False if the scan stopped at `--max-scans` or `--limit` before
    /// covering the whole keyspace.
    complete: bool,
}

#[derive(Serialize)]
struct ListedLock {
    /// The name if UTF-8, else escaped as `b"..."` (see [`crate::name`]).
    name: String,
    /// The exact bytes of a name that is not UTF-8, as hex; `None` when
    /// `name` is exact.
    name_hex: Option<String>,
    holder: Option<String>,
    token: Option<u64>,
    lease_left_ms: Option<u64>,
    queue_len: u64,
}

/// Lists up to `limit` locks under the global prefix.
pub async fn list(
    global: &GlobalArgs,
    client: &LockClient,
    limit: usize,
    max_scans: u32,
) -> Result<(), Failure> {
    let (names, complete) = scan_lock_names(global, limit, max_scans).await?;
    let mut locks = Vec::with_capacity(names.len());
    for name in names {
        // By the exact bytes: a lossy rendering would name another lock.
        let state = client.inspect(name.as_bytes()).await?;
        // Between the scan and now the lock may have gone idle.
        if state.owner.is_none() && state.queue_len == 0 {
            continue;
        }
        let held = state.owner.is_some();
        locks.push(ListedLock {
            name: shown(name.as_bytes()),
            name_hex: hex_if_binary(name.as_bytes()),
            token: held.then_some(state.token),
            lease_left_ms: held
                .then(|| u64::try_from(state.owner_pttl_ms).ok())
                .flatten(),
            holder: state.owner,
            queue_len: state.queue_len,
        });
    }
    let report = ListReport { locks, complete };
    emit(global.json, &report, || human(&report))
}

fn human(report: &ListReport) -> String {
    let mut out = format!(
        "{:<32}  {:>18}  {:>10}  {:>6}  holder\n",
        "lock", "token", "lease left", "queue"
    );
    for lock in &report.locks {
        out.push_str(&format!(
            "{:<32}  {:>18}  {:>10}  {:>6}  {}\n",
            lock.name,
            lock.token.map_or_else(|| "-".to_owned(), |t| t.to_string()),
            lock.lease_left_ms
                .map_or_else(|| "-".to_owned(), human_millis),
            lock.queue_len,
            lock.holder.as_deref().unwrap_or("(free)"),
        ));
    }
    if report.locks.is_empty() {
        out.push_str("(no lock has a holder or waiters)\n");
    }
    if !report.complete {
        out.push_str("(scan stopped early: raise --max-scans or --limit to see more)\n");
    }
    out
}

/// Scans for owner and queue keys under the prefix; the lock names found
/// (at most `limit`) and whether the scan covered the whole keyspace.
async fn scan_lock_names(
    global: &GlobalArgs,
    limit: usize,
    max_scans: u32,
) -> Result<(BTreeSet<LockName>, bool), Failure> {
    let url = redis_url(global);
    let config = Config::from_url(&url)
        .map_err(|e| Failure::new(FAILURE, format!("Redis URL is not valid: {}", e.details())))?;
    let timeout = global.timeout;
    let redis = Builder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = timeout;
            c.internal_command_timeout = timeout;
        })
        .with_performance_config(|p| p.default_command_timeout = timeout)
        .build()
        .map_err(|e| Failure::new(FAILURE, format!("cannot create a Redis client: {e}")))?;
    let unreachable =
        |reason: String| Failure::new(UNAVAILABLE, format!("Redis is unreachable: {reason}"));
    bounded(timeout, redis.init())
        .await
        .map_err(unreachable)?
        .map_err(|e| unreachable(e.to_string()))?;

    let pattern = format!("{}{{*}}:*", glob_escape(&global.prefix));
    let scan = CustomCommand::new_static("SCAN", ClusterHash::Random, false);
    // Every primary of a cluster has its own keyspace and cursor; a single
    // server is one "node" reached as usual.
    let nodes: Vec<Option<Server>> = match redis.cached_cluster_state() {
        Some(routing) if redis.is_clustered() => routing
            .unique_primary_nodes()
            .into_iter()
            .map(Some)
            .collect(),
        _ => vec![None],
    };
    let mut names = BTreeSet::new();
    let mut scans_left = max_scans;
    let mut complete = true;
    'nodes: for node in nodes {
        let mut cursor = "0".to_owned();
        loop {
            if scans_left == 0 || names.len() >= limit {
                complete = false;
                break 'nodes;
            }
            scans_left -= 1;
            let args = vec![
                cursor.clone(),
                "MATCH".into(),
                pattern.clone(),
                "COUNT".into(),
                SCAN_COUNT.to_string(),
            ];
            let reply: Result<Result<Value, _>, String> = match &node {
                Some(server) => {
                    let on_node = redis.with_cluster_node(server.clone());
                    bounded(timeout, on_node.custom(scan.clone(), args)).await
                }
                None => bounded(timeout, redis.custom(scan.clone(), args)).await,
            };
            let reply: Value = reply
                .map_err(unreachable)?
                .map_err(|e| Failure::new(FAILURE, format!("SCAN failed: {e}")))?;
            let (next, keys) = parse_scan(reply)?;
            for key in keys {
                if let Some(name) = lock_name_of(&global.prefix, &key) {
                    names.insert(name);
                }
            }
            cursor = next;
            if cursor == "0" {
                break;
            }
        }
    }
    let _ = bounded(timeout, redis.quit()).await;
    if names.len() > limit {
        complete = false;
        names = names.into_iter().take(limit).collect();
    }
    Ok((names, complete))
}

async fn bounded<T>(
    limit: Duration,
    future: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    tokio::time::timeout(limit, future)
        .await
        .map_err(|_| format!("no answer within {limit:?}"))
}

/// SCAN's reply: the next cursor and the keys of this page.
fn parse_scan(reply: Value) -> Result<(String, Vec<String>), Failure> {
    let bad = || Failure::new(FAILURE, "SCAN answered with an unexpected shape");
    let Value::Array(mut parts) = reply else {
        return Err(bad());
    };
    if parts.len() != 2 {
        return Err(bad());
    }
    let keys = parts.pop().ok_or_else(bad)?;
    let cursor = parts.pop().and_then(|c| c.into_string()).ok_or_else(bad)?;
    let Value::Array(keys) = keys else {
        return Err(bad());
    };
    Ok((
        cursor,
        keys.into_iter().filter_map(Value::into_string).collect(),
    ))
}

/// The lock name of an owner or queue key under `prefix`, unescaped
/// (`%7D` → `}`, `%25` → `%`, `%XX` → a byte that is not UTF-8; see
/// [`LockName::from_tag`]), exact to the byte; `None` for any other key.
fn lock_name_of(prefix: &str, key: &str) -> Option<LockName> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let (tag, kind) = rest.split_once('}')?;
    if kind != ":owner" && kind != ":queue" {
        return None;
    }
    LockName::from_tag(tag)
}

/// `text` with Redis glob metacharacters escaped, so a prefix matches itself.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_back_from_owner_and_queue_keys_only() {
        let name = |key: &str| lock_name_of("fairlock:", key).map(|n| n.as_bytes().to_vec());
        assert_eq!(
            name("fairlock:{orders:42}:owner").as_deref(),
            Some(&b"orders:42"[..])
        );
        assert_eq!(
            name("fairlock:{a%7Db%25c}:queue").as_deref(),
            Some(&b"a}b%c"[..])
        );
        assert_eq!(name("fairlock:{x}:seq"), None);
        assert_eq!(name("other:{x}:owner"), None);
        assert_eq!(
            name("fairlock:{100%25%7D}:owner").as_deref(),
            Some(&b"100%}"[..])
        );
        // Exact bytes, not the lossy "a\u{fffd}" (another lock's name).
        assert_eq!(
            name("fairlock:{a%FF}:owner").as_deref(),
            Some(&b"a\xff"[..])
        );
    }

    #[test]
    fn prefix_globs_are_escaped() {
        assert_eq!(glob_escape("app*[1]:"), "app\\*\\[1\\]:");
    }
}
