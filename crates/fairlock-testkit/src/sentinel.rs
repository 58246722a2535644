//! A primary, its replicas and three sentinels on 127.0.0.1:
//! [`SentinelGroup`].
//!
//! The fail-over hazard fairlock documents is a grant the primary made that
//! its replica never received, promoted anyway. To test it, the group can
//! make a replica lag on purpose: [`pause_replication`](SentinelGroup::pause_replication)
//! points the replica's replication login at a user the primary does not
//! have and drops its link, so the replica keeps answering sentinels (it is
//! not down, and stays eligible for promotion) but receives no more writes.
//! `DEBUG SLEEP` or `CLIENT PAUSE` do not do that: a sleeping replica is
//! marked down and never promoted, and writes already sent to a paused one
//! still arrive.
//!
//! [`SentinelGroup::start_tls`] starts the same group with every process
//! also listening for TLS and running `tls-replication yes`: replicas
//! replicate over TLS and announce their TLS ports, sentinels talk to the
//! data nodes and to each other over TLS, and so every address a sentinel
//! reports is a TLS one. The plain ports stay open for the kit's admin
//! commands.

use std::time::Duration;

use crate::nodes::NodeSet;
use crate::process::poll_until;
use crate::version::ServerKind;
use crate::{RedisServer, RedisServerBuilder, Resp, TestkitError, TlsFiles};

/// The name the sentinels monitor the primary under.
const MASTER_NAME: &str = "fairlock-primary";
/// Sentinels in the group; a quorum of 2 agrees a primary is down.
const SENTINELS: usize = 3;
/// `down-after-milliseconds`: how long a primary may be silent before it is
/// considered down. Short, so a killed primary is replaced in seconds, but
/// above the sentinels' fixed 1 s ping period: a sentinel sends its first
/// `PING` on a new link (a primary it just switched to, a replica it just
/// added) 1 s after creating it and counts the silence from the creation, so
/// with 1000 ms it could call a healthy new primary down at the moment it
/// pinged it, and a second, spurious fail-over then promoted the restarted
/// old primary (CI, `tls_sentinels_replace_a_killed_primary`).
const DOWN_AFTER_MS: u64 = 2000;
/// `failover-timeout`: how long a promotion may take before the sentinels
/// give it up, and half the pause before a sentinel that ran (or voted in)
/// an election tries again. Short, so that even two failed elections (a
/// split vote on a busy machine) fit in [`SETTLE_TIMEOUT`]: with 10 s each
/// retry came 20 s after the last, and two exceeded it.
const FAILOVER_TIMEOUT_MS: u64 = 5_000;
/// How long the group may take to settle after a change.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(40);

/// A primary, 1-2 replicas and 3 sentinels monitoring it, on 127.0.0.1 (with
/// `FAIRLOCK_TEST_SERVER=valkey`, all of them Valkey). Every process is
/// SIGKILLed on drop.
///
/// Data nodes are named by the address the sentinels report: the plain one
/// (`127.0.0.1:<port>`), or in a group started with
/// [`start_tls`](Self::start_tls) the TLS one. That is what
/// [`primary_addr`](Self::primary_addr), [`replica_addrs`](Self::replica_addrs),
/// [`failover`](Self::failover) and [`kill_primary`](Self::kill_primary)
/// return; every method taking an address accepts either.
///
/// ```no_run
/// use fairlock_testkit::SentinelGroup;
///
/// let mut group = SentinelGroup::start(1)?;
/// println!("connect through {}", group.url());
/// let old = group.primary_addr()?;
/// let new = group.kill_primary()?;
/// assert_ne!(old, new);
/// # Ok::<(), fairlock_testkit::TestkitError>(())
/// ```
#[derive(Debug)]
pub struct SentinelGroup {
    /// Data nodes: the first was the primary at start, the rest replicas.
    nodes: NodeSet,
    sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    /// Starts a primary, `replicas` replicas (1 or 2 make sense) and 3
    /// sentinels, and waits until every replica is in sync and every
    /// sentinel knows the primary, all replicas and the other two sentinels.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`], or [`TestkitError::Timeout`] if the group
    /// does not settle within 40 s.
    pub fn start(replicas: usize) -> Result<SentinelGroup, TestkitError> {
        SentinelGroup::start_with(ServerKind::from_env()?, replicas, None)
    }

    /// As [`start`](Self::start), but every process (data nodes and
    /// sentinels) also listens for TLS on a second port with the server
    /// certificate of `files` (which must outlive the group) and runs
    /// `tls-replication yes`: replicas replicate from the primary's TLS
    /// port and announce their own, and the sentinels monitor the primary
    /// at its TLS port and talk to the data nodes and to each other over
    /// TLS. So the sentinels report TLS addresses only, to every client,
    /// and [`primary_addr`](Self::primary_addr) and the other helpers
    /// return them. Connect a client through [`tls_url`](Self::tls_url),
    /// trusting [`TlsFiles::ca`]; the kit's admin commands keep using the
    /// plain ports.
    ///
    /// Always Redis, whatever `FAIRLOCK_TEST_SERVER` says: the Valkey build
    /// the suite installs has no TLS.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_tls(replicas: usize, files: &TlsFiles) -> Result<SentinelGroup, TestkitError> {
        SentinelGroup::start_with(ServerKind::Redis, replicas, Some(files))
    }

    fn start_with(
        kind: ServerKind,
        replicas: usize,
        tls: Option<&TlsFiles>,
    ) -> Result<SentinelGroup, TestkitError> {
        let primary = data_node(kind, None, tls)?;
        // The port replicas and sentinels reach the primary on.
        let primary_port = announced_port(&primary);
        let mut nodes = vec![primary];
        for _ in 0..replicas {
            nodes.push(data_node(kind, Some(primary_port), tls)?);
        }
        let config = format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {MASTER_NAME} {SENTINELS}\n",
            port = primary_port
        );
        let mut sentinels = Vec::with_capacity(SENTINELS);
        for _ in 0..SENTINELS {
            sentinels.push(
                with_tls(RedisServer::builder(), tls)
                    .kind(kind)
                    .config(config.clone())
                    .arg("--sentinel")
                    .start()?,
            );
        }
        let group = SentinelGroup {
            nodes: NodeSet::new("data node", nodes),
            sentinels,
        };
        group.wait_settled()?;
        Ok(group)
    }

    /// The name the sentinels monitor the primary under (for
    /// `SENTINEL get-master-addr-by-name` and fred's `service_name`).
    pub fn master_name(&self) -> &'static str {
        MASTER_NAME
    }

    /// `127.0.0.1:<port>` of each sentinel (the plain port, also in a TLS
    /// group).
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::addr).collect()
    }

    /// `127.0.0.1:<TLS port>` of each sentinel of a group started with
    /// [`start_tls`](Self::start_tls); empty for a group without TLS.
    pub fn sentinel_tls_addrs(&self) -> Vec<String> {
        // Only sentinels of a TLS group have a TLS port.
        self.sentinels
            .iter()
            .filter_map(RedisServer::tls_addr)
            .collect()
    }

    /// The sentinel processes.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The data nodes (primary and replicas, killed ones too), in start order.
    pub fn nodes(&self) -> &[RedisServer] {
        self.nodes.all()
    }

    /// The data node at `addr` (its plain or its TLS address).
    ///
    /// # Errors
    ///
    /// [`TestkitError::Protocol`] when no data node has that address.
    pub fn node(&self, addr: &str) -> Result<&RedisServer, TestkitError> {
        self.nodes.get(addr)
    }

    /// A `redis-sentinel://127.0.0.1:<port>?sentinelServiceName=...&node=...`
    /// URL naming all three sentinels, as fred's `Config::from_url` accepts it.
    /// In a TLS group the sentinels it names answer in plain text but name
    /// the primary's TLS port: use [`tls_url`](Self::tls_url) there.
    pub fn url(&self) -> String {
        sentinel_url("redis-sentinel", self.sentinel_addrs())
    }

    /// For a group started with [`start_tls`](Self::start_tls), a
    /// `rediss-sentinel://127.0.0.1:<TLS port>?sentinelServiceName=...&node=127.0.0.1:<TLS port>&...`
    /// URL naming all three sentinels' TLS ports, as fred's
    /// `Config::from_url` accepts it (fred then talks TLS to the sentinels
    /// and to the primary they name); `None` for a group without TLS.
    pub fn tls_url(&self) -> Option<String> {
        Some(self.sentinel_tls_addrs())
            .filter(|addrs| !addrs.is_empty())
            .map(|addrs| sentinel_url("rediss-sentinel", addrs))
    }

    /// The primary's address according to the first sentinel that answers
    /// (`SENTINEL get-master-addr-by-name`): its TLS address in a TLS group.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::cmd`] when no sentinel answers.
    pub fn primary_addr(&self) -> Result<String, TestkitError> {
        let mut last = None;
        for sentinel in &self.sentinels {
            match master_addr(sentinel) {
                Ok(addr) => return Ok(addr),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| TestkitError::Protocol("no sentinel".into())))
    }

    /// The live data nodes other than the current primary, by the address
    /// the sentinels know them by (the TLS one in a TLS group).
    ///
    /// # Errors
    ///
    /// As [`primary_addr`](Self::primary_addr).
    pub fn replica_addrs(&self) -> Result<Vec<String>, TestkitError> {
        let primary = self.primary_addr()?;
        Ok(self
            .nodes
            .live()
            .filter(|n| !n.listens_at(&primary))
            .map(|n| format!("127.0.0.1:{}", announced_port(n)))
            .collect())
    }

    /// Asks a sentinel for a fail-over (`SENTINEL FAILOVER`), which promotes
    /// a replica without waiting for agreement that the primary is down.
    /// Returns the new primary's address once every sentinel names it and it
    /// acts as primary. The old primary keeps acting as a primary until the
    /// sentinels' next `INFO` round (up to 10 s) turns it into a replica, as
    /// in production; call [`wait_settled`](Self::wait_settled) to wait for
    /// that.
    ///
    /// # Errors
    ///
    /// An error reply (e.g. `NOGOODSLAVE`), or [`TestkitError::Timeout`].
    pub fn failover(&self) -> Result<String, TestkitError> {
        let old = self.primary_addr()?;
        self.sentinels[0].cmd_ok(&["SENTINEL", "FAILOVER", MASTER_NAME])?;
        self.wait_new_primary(&old)
    }

    /// SIGKILLs the current primary and waits until the sentinels agree it
    /// is down (after 2 s of silence), promote a replica, every sentinel
    /// names it and the other live replicas follow it. Returns the new
    /// primary's address. Writes the promoted
    /// replica had not received are lost, as in a real crash.
    ///
    /// # Errors
    ///
    /// As [`failover`](Self::failover).
    pub fn kill_primary(&mut self) -> Result<String, TestkitError> {
        let old = self.primary_addr()?;
        self.kill_node(&old)?;
        let new = self.wait_new_primary(&old)?;
        self.wait_settled()?;
        Ok(new)
    }

    /// SIGKILLs the data node at `addr` (plain or TLS) without waiting for
    /// the sentinels.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Protocol`] when no data node has that address.
    pub fn kill_node(&mut self, addr: &str) -> Result<(), TestkitError> {
        self.nodes.kill(addr)
    }

    /// Restarts a killed data node (empty: there is no persistence) and makes
    /// it a replica of the current primary with `REPLICAOF`, as the sentinels
    /// would after their next `INFO` round (up to 10 s later); waits until it
    /// is in sync and the sentinels list it.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::restart`], or [`TestkitError::Timeout`].
    pub fn restart_node(&mut self, addr: &str) -> Result<(), TestkitError> {
        self.nodes.restart(addr)?;
        let primary = self.primary_addr()?;
        let node = self.node(addr)?;
        if !node.listens_at(&primary) {
            // The sentinels' address: the TLS port in a TLS group, where the
            // node replicates over TLS.
            let (host, primary_port) = primary.split_once(':').unwrap_or(("127.0.0.1", ""));
            node.cmd_ok(&["REPLICAOF", host, primary_port])?;
        }
        self.wait_settled()
    }

    /// Makes the replica at `replica` stop receiving writes while it keeps
    /// answering (so sentinels still see it up and may promote it): its
    /// replication login is pointed at a user the primary does not know and
    /// its link is dropped, so every reconnect fails. It is also given the
    /// best `replica-priority`, so a fail-over picks it over an in-sync
    /// replica; with more than one replica this waits until every sentinel
    /// has seen that priority (their `INFO` round, up to 10 s).
    ///
    /// # Errors
    ///
    /// An error reply, or [`TestkitError::Timeout`].
    pub fn pause_replication(&self, replica: &str) -> Result<(), TestkitError> {
        let node = self.node(replica)?;
        node.cmd_ok(&["CONFIG", "SET", "masteruser", "fairlock-lag"])?;
        node.cmd_ok(&["CONFIG", "SET", "masterauth", "no-such-password"])?;
        node.cmd_ok(&["CONFIG", "SET", "replica-priority", "1"])?;
        node.cmd_ok(&["CLIENT", "KILL", "TYPE", "master"])?;
        poll_until(
            &format!("{replica}'s replication link to go down"),
            SETTLE_TIMEOUT,
            || {
                let info = node.info("replication")?;
                Ok(Some(())
                    .filter(|_| info.get("master_link_status").map(String::as_str) == Some("down")))
            },
        )?;
        if self.nodes.live().count() <= 2 {
            // The only replica: a fail-over has no other choice.
            return Ok(());
        }
        let port = announced_port(node).to_string();
        poll_until(
            "every sentinel to see the lagging replica's priority",
            SETTLE_TIMEOUT,
            || {
                for sentinel in &self.sentinels {
                    let replicas = sentinel.cmd_ok(&["SENTINEL", "REPLICAS", MASTER_NAME])?;
                    let seen = replicas.as_array().unwrap_or_default().iter().any(|r| {
                        let fields = pairs(r);
                        fields.iter().any(|(k, v)| k == "port" && *v == port)
                            && fields
                                .iter()
                                .any(|(k, v)| k == "slave-priority" && v == "1")
                    });
                    if !seen {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
    }

    /// Undoes [`pause_replication`](Self::pause_replication): the replica
    /// logs in again, catches up, and gets the default priority back.
    ///
    /// # Errors
    ///
    /// An error reply, or [`TestkitError::Timeout`].
    pub fn resume_replication(&self, replica: &str) -> Result<(), TestkitError> {
        let node = self.node(replica)?;
        node.cmd_ok(&["CONFIG", "SET", "masteruser", ""])?;
        node.cmd_ok(&["CONFIG", "SET", "masterauth", ""])?;
        node.cmd_ok(&["CONFIG", "SET", "replica-priority", "100"])?;
        self.wait_settled()
    }

    fn wait_new_primary(&self, old: &str) -> Result<String, TestkitError> {
        let new = poll_until(
            &format!("every sentinel to name a primary other than {old}"),
            SETTLE_TIMEOUT,
            || {
                let mut seen = None;
                for sentinel in &self.sentinels {
                    let addr = master_addr(sentinel)?;
                    if addr == old || seen.as_ref().is_some_and(|s| *s != addr) {
                        return Ok(None);
                    }
                    seen = Some(addr);
                }
                Ok(seen)
            },
        )?;
        let node = self.node(&new)?;
        poll_until(&format!("{new} to act as primary"), SETTLE_TIMEOUT, || {
            let info = node.info("replication")?;
            Ok(Some(()).filter(|_| info.get("role").map(String::as_str) == Some("master")))
        })?;
        Ok(new)
    }

    /// Waits until all sentinels name the same primary, which acts as one;
    /// every other live data node replicates from it and (unless its
    /// replication is paused) is in sync; and every sentinel knows the other
    /// two and every live replica.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Timeout`] naming the condition that did not hold.
    pub fn wait_settled(&self) -> Result<(), TestkitError> {
        poll_until(
            "sentinels and replicas to agree on the primary",
            SETTLE_TIMEOUT,
            || {
                let primary = self.primary_addr()?;
                for sentinel in &self.sentinels {
                    if master_addr(sentinel)? != primary {
                        return Ok(None);
                    }
                    let others = sentinel.cmd_ok(&["SENTINEL", "SENTINELS", MASTER_NAME])?;
                    if others.as_array().map_or(0, <[Resp]>::len) != SENTINELS - 1 {
                        return Ok(None);
                    }
                    let replicas = sentinel.cmd_ok(&["SENTINEL", "REPLICAS", MASTER_NAME])?;
                    let known_up = replicas
                        .as_array()
                        .unwrap_or_default()
                        .iter()
                        .filter(|r| {
                            pairs(r).iter().any(|(k, v)| {
                                k == "flags"
                                    && v.split(',').all(|f| f != "s_down" && f != "disconnected")
                            })
                        })
                        .count();
                    if known_up < self.nodes.live().count() - 1 {
                        return Ok(None);
                    }
                }
                let primary_node = self.node(&primary)?;
                let primary_info = primary_node.info("replication")?;
                if primary_info.get("role").map(String::as_str) != Some("master") {
                    return Ok(None);
                }
                for node in self.nodes.live().filter(|n| !n.listens_at(&primary)) {
                    let info = node.info("replication")?;
                    let follows = info.get("role").map(String::as_str) == Some("slave")
                        && info
                            .get("master_port")
                            .and_then(|port| port.parse().ok())
                            .is_some_and(|port| primary_node.listens_on(port));
                    let paused = node
                        .cmd_ok(&["CONFIG", "GET", "masteruser"])?
                        .as_array()
                        .and_then(|a| a.get(1))
                        .and_then(Resp::as_str)
                        .is_some_and(|u| !u.is_empty());
                    if !follows || !(paused || node.caught_up_with(primary_node)?) {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
    }
}

/// The `[key, value, key, value, ...]` reply of `SENTINEL REPLICAS` entries.
fn pairs(reply: &Resp) -> Vec<(String, String)> {
    reply
        .as_array()
        .unwrap_or_default()
        .chunks(2)
        .filter_map(|kv| {
            Some((
                kv.first()?.as_str()?.to_string(),
                kv.get(1)?.as_str()?.to_string(),
            ))
        })
        .collect()
}

fn master_addr(sentinel: &RedisServer) -> Result<String, TestkitError> {
    let reply = sentinel.cmd_ok(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])?;
    match reply.as_array() {
        Some([host, port]) => match (host.as_str(), port.as_str()) {
            (Some(host), Some(port)) => Ok(format!("{host}:{port}")),
            _ => Err(TestkitError::Protocol(format!(
                "unexpected address {reply:?}"
            ))),
        },
        _ => Err(TestkitError::Protocol(format!(
            "unexpected SENTINEL GET-MASTER-ADDR-BY-NAME reply {reply:?}"
        ))),
    }
}

/// `<scheme>://<first addr>?sentinelServiceName=...&node=<addr>&...`.
fn sentinel_url(scheme: &str, addrs: Vec<String>) -> String {
    let mut addrs = addrs.into_iter();
    let first = addrs.next().unwrap_or_default();
    let rest: String = addrs.map(|a| format!("&node={a}")).collect();
    format!("{scheme}://{first}?sentinelServiceName={MASTER_NAME}{rest}")
}

/// With `tls`, makes the server also listen for TLS and replicate (a data
/// node) or monitor (a sentinel) over TLS.
fn with_tls(builder: RedisServerBuilder, tls: Option<&TlsFiles>) -> RedisServerBuilder {
    match tls {
        Some(files) => builder.tls(files).args(["--tls-replication", "yes"]),
        None => builder,
    }
}

/// The port a server started by [`with_tls`] is reached on by its peers,
/// and reported by the sentinels: the TLS one when it has one.
fn announced_port(server: &RedisServer) -> u16 {
    server.tls_port().unwrap_or_else(|| server.port())
}

/// One data node: an empty config file (so sentinels' `CONFIG REWRITE`
/// after a role change succeeds) and no diskless-sync delay (so a replica's
/// first sync starts at once). `replica_of` is the primary's port (its TLS
/// port with `tls`).
fn data_node(
    kind: ServerKind,
    replica_of: Option<u16>,
    tls: Option<&TlsFiles>,
) -> Result<RedisServer, TestkitError> {
    let mut builder = with_tls(RedisServer::builder(), tls)
        .kind(kind)
        .config("")
        .args(["--repl-diskless-sync-delay", "0"]);
    if let Some(port) = replica_of {
        builder = builder
            .arg("--replicaof")
            .arg("127.0.0.1")
            .arg(port.to_string());
    }
    builder.start()
}
