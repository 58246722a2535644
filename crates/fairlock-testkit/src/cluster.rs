//! A local Redis Cluster: [`RedisCluster`], 3 primaries with one replica
//! each, on 127.0.0.1.
//!
//! The cluster is created the way users create theirs (`redis-cli --cluster
//! create ... --cluster-replicas 1`), so the tests meet the same slot layout
//! and replication a real deployment has. Slot migration and fail-over are
//! driven with the server's own admin commands (`CLUSTER SETSLOT`, `MIGRATE`,
//! `CLUSTER FAILOVER`, SIGKILL), never by editing state behind its back, and
//! every helper returns only once all live nodes agree on the new slot map:
//! a test that starts right after a helper sees a settled cluster.
//!
//! [`RedisCluster::start_tls`] starts the same cluster with every node also
//! listening for TLS and running `tls-cluster yes` (the cluster bus over
//! TLS) and `tls-replication yes`. Redis 7.0 then keeps both ports of every
//! node and answers `CLUSTER SLOTS`, `CLUSTER SHARDS`, `CLUSTER NODES` and
//! `MOVED` with the TLS ports to clients connected over TLS and with the
//! plain ports to the others, such as the kit's admin connections.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::cluster_view::{parse_nodes, slot_map, NodeEntry};
use crate::install::ensure_cli;
use crate::nodes::NodeSet;
use crate::process::{poll_until, run_with_timeout};
use crate::slots::SLOTS;
use crate::stats::parse_fields;
use crate::version::ServerKind;
use crate::{RedisServer, Resp, TestkitError, TlsFiles};

/// Primaries the cluster starts with.
const PRIMARIES: usize = 3;
/// `cluster-node-timeout`: short, so a killed primary is failed over in a
/// few seconds, yet long enough that a busy 2-core CI machine does not
/// trigger spurious fail-overs.
const NODE_TIMEOUT_MS: u64 = 2000;
/// How long `redis-cli --cluster create` may run.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the cluster may take to settle after a change.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Keys moved per `MIGRATE` call.
const MIGRATE_BATCH: usize = 100;
/// `MIGRATE`'s own timeout (ms) for each step of its transfer: well below
/// the admin connection's 5 s read timeout, so a slow transfer is reported
/// by the server as an error reply instead of surfacing as our read timing
/// out with the command still running.
const MIGRATE_TIMEOUT_MS: &str = "2000";
/// A manual fail-over not done within Redis' fixed 5 s is aborted without
/// a word; `CLUSTER FAILOVER` is sent again if the replica is still a
/// replica this long after the last request.
const FAILOVER_RESEND: Duration = Duration::from_secs(8);

/// A local Redis Cluster (or Valkey cluster, with `FAIRLOCK_TEST_SERVER=valkey`):
/// 3 primaries and 1 replica each, on free 127.0.0.1 ports, each node with
/// its own temp dir and `nodes.conf`, no persistence.
///
/// Dropping it SIGKILLs every node. Roles change after a fail-over, so the
/// accessors ask the cluster rather than remembering who was primary.
///
/// The accessors name nodes by their plain addresses (`127.0.0.1:<port>`),
/// also in a cluster started with [`start_tls`](Self::start_tls); every
/// method taking an address accepts a node's TLS address as well, and
/// [`RedisServer::tls_addr`] of [`node`](Self::node) gives the TLS address
/// a TLS client is sent.
///
/// ```no_run
/// use fairlock_testkit::{key_slot, RedisCluster};
///
/// let mut cluster = RedisCluster::start()?;
/// let slot = key_slot(b"lock:{orders}:owner");
/// let from = cluster.slot_owner(slot)?;
/// let to = cluster.primaries()?.into_iter().find(|p| *p != from).unwrap();
/// cluster.migrate_slot(slot, &to)?;
/// let promoted = cluster.failover(&to)?;
/// # Ok::<(), fairlock_testkit::TestkitError>(())
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    /// Killed nodes (see [`kill_node`](Self::kill_node)) are left out of
    /// every wait.
    nodes: NodeSet,
}

impl RedisCluster {
    /// Starts 6 nodes, creates the cluster with `redis-cli --cluster create
    /// --cluster-replicas 1` (or `valkey-cli`), and waits until every node
    /// reports `cluster_state:ok`, all nodes agree on the slot map and every
    /// replica is in sync with its primary.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`]; [`TestkitError::StartFailed`] with the
    /// cli's output if the create fails; [`TestkitError::Timeout`] if the
    /// cluster does not settle within 30 s.
    pub fn start() -> Result<RedisCluster, TestkitError> {
        RedisCluster::start_with(ServerKind::from_env()?, None)
    }

    /// As [`start`](Self::start), but every node also listens for TLS on a
    /// second port with the server certificate of `files` (which must
    /// outlive the cluster), and runs `tls-cluster yes` and
    /// `tls-replication yes`: the cluster bus, replication and `MIGRATE`
    /// go over TLS, and a client connected over TLS is sent the TLS ports
    /// in `CLUSTER SLOTS`, `CLUSTER SHARDS` and `MOVED` (connect it with
    /// [`tls_url`](Self::tls_url), trusting [`TlsFiles::ca`]). The plain
    /// ports stay open: the kit's admin helpers and `redis-cli --cluster
    /// create` use them, and are sent plain ports.
    ///
    /// Always Redis, whatever `FAIRLOCK_TEST_SERVER` says: the Valkey build
    /// the suite installs has no TLS.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_tls(files: &TlsFiles) -> Result<RedisCluster, TestkitError> {
        RedisCluster::start_with(ServerKind::Redis, Some(files))
    }

    fn start_with(kind: ServerKind, tls: Option<&TlsFiles>) -> Result<RedisCluster, TestkitError> {
        let mut nodes = Vec::with_capacity(PRIMARIES * 2);
        for _ in 0..PRIMARIES * 2 {
            nodes.push(start_node(kind, tls)?);
        }
        let cluster = RedisCluster {
            nodes: NodeSet::new("cluster node", nodes),
        };
        let cli = ensure_cli(kind)?;
        let mut create = Command::new(cli);
        create.arg("--cluster").arg("create");
        create.args(cluster.addrs());
        create.args(["--cluster-replicas", "1", "--cluster-yes"]);
        let log = cluster.nodes.all()[0].dir().join("cluster-create.log");
        run_with_timeout(create, &log, CREATE_TIMEOUT)?;
        cluster.wait_settled()?;
        Ok(cluster)
    }

    /// Every node, primaries and replicas, in start order (killed ones too).
    pub fn nodes(&self) -> &[RedisServer] {
        self.nodes.all()
    }

    /// `127.0.0.1:<port>` of every node, in start order.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.all().iter().map(RedisServer::addr).collect()
    }

    /// A `redis-cluster://127.0.0.1:<port>?node=...&node=...` URL naming
    /// every node, as fred's `Config::from_url` accepts it.
    pub fn url(&self) -> String {
        cluster_url("redis-cluster", self.addrs())
    }

    /// For a cluster started with [`start_tls`](Self::start_tls), a
    /// `rediss-cluster://127.0.0.1:<TLS port>?node=127.0.0.1:<TLS port>&...`
    /// URL naming every node's TLS port, as fred's `Config::from_url`
    /// accepts it; `None` for a cluster without TLS.
    pub fn tls_url(&self) -> Option<String> {
        // Every node has a TLS port exactly when the cluster was started
        // with TLS.
        let addrs: Option<Vec<String>> =
            self.nodes.all().iter().map(RedisServer::tls_addr).collect();
        addrs.map(|addrs| cluster_url("rediss-cluster", addrs))
    }

    /// The node listening on `addr` (`127.0.0.1:<port>`, the plain or the
    /// TLS port).
    ///
    /// # Errors
    ///
    /// [`TestkitError::Protocol`] when no node of this cluster has that address.
    pub fn node(&self, addr: &str) -> Result<&RedisServer, TestkitError> {
        self.nodes.get(addr)
    }

    /// The slot map as one live node sees it.
    fn view(&self) -> Result<Vec<NodeEntry>, TestkitError> {
        let mut last = None;
        for node in self.nodes.live() {
            match self.view_of(node) {
                Ok(view) => return Ok(view),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| TestkitError::Protocol("no live cluster node".into())))
    }

    /// `CLUSTER NODES` of `node`, every address made the node's plain one.
    /// Over a plain connection Redis 7.0 reports plain ports, except for a
    /// node it has not heard from since it loaded `nodes.conf` (right after
    /// a restart), which only records the TLS port.
    fn view_of(&self, node: &RedisServer) -> Result<Vec<NodeEntry>, TestkitError> {
        let mut view = parse_nodes(&node.cmd_ok(&["CLUSTER", "NODES"])?)?;
        for entry in &mut view {
            entry.addr = self.nodes.plain_addr(&entry.addr);
        }
        Ok(view)
    }

    /// Addresses of the primaries that own slots, sorted.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::cmd`] when no live node answers.
    pub fn primaries(&self) -> Result<Vec<String>, TestkitError> {
        let mut out: Vec<String> = self
            .view()?
            .into_iter()
            .filter(|e| e.has_flag("master") && !e.is_failed() && !e.slots.is_empty())
            .map(|e| e.addr)
            .collect();
        out.sort();
        Ok(out)
    }

    /// The first primary (by address) other than `than`: where to move a
    /// slot that `than` owns, or which node to fail over to.
    ///
    /// # Errors
    ///
    /// As [`primaries`](Self::primaries), or [`TestkitError::Protocol`]
    /// when no other primary owns slots.
    pub fn other_primary(&self, than: &str) -> Result<String, TestkitError> {
        self.primaries()?
            .into_iter()
            .find(|primary| primary != than)
            .ok_or_else(|| TestkitError::Protocol(format!("no primary other than {than}")))
    }

    /// Addresses of the live replicas of the primary at `primary`.
    ///
    /// # Errors
    ///
    /// As [`primaries`](Self::primaries), or [`TestkitError::Protocol`] if
    /// `primary` is not a node of the cluster.
    pub fn replicas_of(&self, primary: &str) -> Result<Vec<String>, TestkitError> {
        let view = self.view()?;
        let plain = self.nodes.plain_addr(primary);
        let id = view
            .iter()
            .find(|e| e.addr == plain)
            .map(|e| e.id.clone())
            .ok_or_else(|| TestkitError::Protocol(format!("{primary} is not in CLUSTER NODES")))?;
        Ok(view
            .into_iter()
            .filter(|e| e.primary_id.as_deref() == Some(id.as_str()) && !e.is_failed())
            .map(|e| e.addr)
            .collect())
    }

    /// The cluster node id of the node at `addr`.
    ///
    /// # Errors
    ///
    /// As [`replicas_of`](Self::replicas_of).
    pub fn node_id(&self, addr: &str) -> Result<String, TestkitError> {
        match self.node(addr)?.cmd_ok(&["CLUSTER", "MYID"])? {
            reply @ (Resp::Bulk(_) | Resp::Simple(_)) => reply
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| TestkitError::Protocol("CLUSTER MYID is not text".into())),
            other => Err(TestkitError::Protocol(format!(
                "unexpected CLUSTER MYID reply {other:?}"
            ))),
        }
    }

    /// The address of the primary that owns `slot`.
    ///
    /// # Errors
    ///
    /// As [`primaries`](Self::primaries), or [`TestkitError::Protocol`] if no
    /// live primary owns it.
    pub fn slot_owner(&self, slot: u16) -> Result<String, TestkitError> {
        self.view()?
            .into_iter()
            .find(|e| e.has_flag("master") && !e.is_failed() && e.owns(slot))
            .map(|e| e.addr)
            .ok_or_else(|| TestkitError::Protocol(format!("no live primary owns slot {slot}")))
    }

    /// How many of the 16384 slots live primaries own, as a live node sees it.
    ///
    /// # Errors
    ///
    /// As [`primaries`](Self::primaries).
    pub fn covered_slots(&self) -> Result<u32, TestkitError> {
        Ok(self
            .view()?
            .iter()
            .filter(|e| e.has_flag("master") && !e.is_failed())
            .flat_map(|e| e.slots.iter())
            .map(|&(a, b)| u32::from(b - a) + 1)
            .sum())
    }

    /// Starts moving `slot` to the primary at `to`: `CLUSTER SETSLOT slot
    /// IMPORTING` on the target, then `MIGRATING` on the source. From here
    /// on the source answers `ASK` for keys it no longer has. Returns the
    /// source's address.
    ///
    /// # Errors
    ///
    /// As [`slot_owner`](Self::slot_owner), or an error reply of a step.
    pub fn begin_slot_migration(&self, slot: u16, to: &str) -> Result<String, TestkitError> {
        let from = self.slot_owner(slot)?;
        if self.node(to)?.listens_at(&from) {
            return Err(TestkitError::Protocol(format!(
                "{to} already owns slot {slot}"
            )));
        }
        let slot_arg = slot.to_string();
        let (from_id, to_id) = (self.node_id(&from)?, self.node_id(to)?);
        self.node(to)?
            .cmd_ok(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id])?;
        self.node(&from)?
            .cmd_ok(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id])?;
        Ok(from)
    }

    /// Moves every key of `slot` from `from` to `to` with `MIGRATE ... KEYS`
    /// in batches; returns how many keys moved. In a TLS cluster `MIGRATE`
    /// connects over TLS (`tls-cluster yes`), so it is sent `to`'s TLS port.
    ///
    /// # Errors
    ///
    /// An error reply of `CLUSTER GETKEYSINSLOT` or `MIGRATE`.
    pub fn move_slot_keys(&self, slot: u16, from: &str, to: &str) -> Result<usize, TestkitError> {
        let source = self.node(from)?;
        let target = self.node(to)?;
        // Only nodes of a TLS cluster have a TLS port.
        let port = target.tls_port().unwrap_or(target.port());
        let (port, slot_arg, batch) = (
            port.to_string(),
            slot.to_string(),
            MIGRATE_BATCH.to_string(),
        );
        let mut moved = 0;
        loop {
            let reply = source.cmd_ok(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, &batch])?;
            let keys: Vec<&str> = reply
                .as_array()
                .unwrap_or_default()
                .iter()
                .filter_map(Resp::as_str)
                .collect();
            if keys.is_empty() {
                return Ok(moved);
            }
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                &port,
                "",
                "0",
                MIGRATE_TIMEOUT_MS,
                "REPLACE",
                "KEYS",
            ];
            args.extend(keys.iter().copied());
            source.cmd_ok(&args)?;
            moved += keys.len();
        }
    }

    /// Ends a migration: `CLUSTER SETSLOT slot NODE <to>` on the target, the
    /// source and then every other live primary, and waits until all live
    /// nodes agree that `to` owns `slot`.
    ///
    /// # Errors
    ///
    /// An error reply of `SETSLOT`, or [`TestkitError::Timeout`].
    pub fn finish_slot_migration(
        &self,
        slot: u16,
        from: &str,
        to: &str,
    ) -> Result<(), TestkitError> {
        let (from, to) = (self.nodes.plain_addr(from), self.nodes.plain_addr(to));
        let (from, to) = (from.as_str(), to.as_str());
        let to_id = self.node_id(to)?;
        let slot_arg = slot.to_string();
        let setslot = [
            "CLUSTER",
            "SETSLOT",
            slot_arg.as_str(),
            "NODE",
            to_id.as_str(),
        ];
        self.node(to)?.cmd_ok(&setslot)?;
        self.node(from)?.cmd_ok(&setslot)?;
        for primary in self.primaries()? {
            if primary != to && primary != from {
                self.node(&primary)?.cmd_ok(&setslot)?;
            }
        }
        self.wait_settled()?;
        poll_until(
            &format!("every node to see slot {slot} on {to}"),
            SETTLE_TIMEOUT,
            || {
                for node in self.nodes.live() {
                    let view = self.view_of(node)?;
                    let owner = view.iter().find(|e| e.has_flag("master") && e.owns(slot));
                    if owner.map(|e| e.addr.as_str()) != Some(to) {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
    }

    /// Moves `slot` and its keys to the primary at `to`: the three steps
    /// [`begin_slot_migration`](Self::begin_slot_migration),
    /// [`move_slot_keys`](Self::move_slot_keys) and
    /// [`finish_slot_migration`](Self::finish_slot_migration). Returns how
    /// many keys moved.
    ///
    /// # Errors
    ///
    /// As those three.
    pub fn migrate_slot(&self, slot: u16, to: &str) -> Result<usize, TestkitError> {
        let from = self.begin_slot_migration(slot, to)?;
        let moved = self.move_slot_keys(slot, &from, to)?;
        self.finish_slot_migration(slot, &from, to)?;
        Ok(moved)
    }

    /// A manual fail-over of the primary at `primary`: `CLUSTER FAILOVER` on
    /// one of its replicas, which waits for the replica to catch up first, so
    /// no acknowledged write is lost. Returns the promoted replica's address
    /// once all live nodes agree on it. Redis aborts a manual fail-over not
    /// done within 5 s without telling anybody (e.g. on a busy machine), so
    /// the request is repeated while the replica is still a replica 8 s
    /// after the last one.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Protocol`] if `primary` has no live replica, an error
    /// reply, or [`TestkitError::Timeout`].
    pub fn failover(&self, primary: &str) -> Result<String, TestkitError> {
        let replica = self
            .replicas_of(primary)?
            .into_iter()
            .next()
            .ok_or_else(|| TestkitError::Protocol(format!("{primary} has no live replica")))?;
        let node = self.node(&replica)?;
        node.cmd_ok(&["CLUSTER", "FAILOVER"])?;
        let mut last_request = Instant::now();
        poll_until(
            &format!("{replica} to become a primary"),
            SETTLE_TIMEOUT,
            || {
                let info = node.info("replication")?;
                if info.get("role").map(String::as_str) == Some("master") {
                    return Ok(Some(()));
                }
                if last_request.elapsed() >= FAILOVER_RESEND {
                    // An error reply (e.g. it was promoted just now) is
                    // left to the next round.
                    let _ = node.cmd(&["CLUSTER", "FAILOVER"])?;
                    last_request = Instant::now();
                }
                Ok(None)
            },
        )?;
        self.wait_settled()?;
        Ok(replica)
    }

    /// SIGKILLs the primary at `primary` and waits until the cluster has
    /// failed over to its replica (after `cluster-node-timeout`, 2 s) and
    /// settled. Returns the promoted replica's address. Writes the replica
    /// had not received are lost, as in a real crash.
    ///
    /// # Errors
    ///
    /// As [`failover`](Self::failover).
    pub fn kill_primary(&mut self, primary: &str) -> Result<String, TestkitError> {
        let replica = self
            .replicas_of(primary)?
            .into_iter()
            .next()
            .ok_or_else(|| TestkitError::Protocol(format!("{primary} has no live replica")))?;
        self.kill_node(primary)?;
        self.wait_promoted(&replica)?;
        Ok(replica)
    }

    /// SIGKILLs the node at `addr` (primary or replica) without waiting for
    /// the cluster to react.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Protocol`] if `addr` is not a node of this cluster.
    pub fn kill_node(&mut self, addr: &str) -> Result<(), TestkitError> {
        self.nodes.kill(addr)
    }

    /// Restarts a killed node on its port with its `nodes.conf` (its data is
    /// gone); it rejoins, as a replica if it was failed over. Waits until
    /// the cluster has settled.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::restart`], or [`TestkitError::Timeout`].
    pub fn restart_node(&mut self, addr: &str) -> Result<(), TestkitError> {
        self.nodes.restart(addr)?;
        self.wait_settled()
    }

    fn wait_promoted(&self, replica: &str) -> Result<(), TestkitError> {
        let node = self.node(replica)?;
        poll_until(
            &format!("{replica} to become a primary"),
            SETTLE_TIMEOUT,
            || {
                let info = node.info("replication")?;
                Ok(Some(()).filter(|_| info.get("role").map(String::as_str) == Some("master")))
            },
        )?;
        self.wait_settled()
    }

    /// Waits until every live node reports `cluster_state:ok`, all live
    /// nodes map every slot to the same live primary, and every live replica
    /// has caught up with its primary's replication offset.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Timeout`] naming the condition that did not hold.
    pub fn wait_settled(&self) -> Result<(), TestkitError> {
        poll_until(
            "cluster_state:ok and one slot map on every node",
            SETTLE_TIMEOUT,
            || {
                let mut maps = Vec::new();
                for node in self.nodes.live() {
                    let info = parse_fields(&node.cmd_ok(&["CLUSTER", "INFO"])?)?;
                    if info.get("cluster_state").map(String::as_str) != Some("ok") {
                        return Ok(None);
                    }
                    let view = self.view_of(node)?;
                    // After a fail-over the old primary keeps its role, without
                    // slots, until it learns it has been replaced.
                    let roles_settled = view.iter().filter(|e| !e.is_failed()).all(|e| {
                        (e.has_flag("master") && !e.slots.is_empty())
                            || (e.has_flag("slave") && e.primary_id.is_some())
                    });
                    // Every live node, e.g. one just restarted, is known and
                    // no longer flagged as failed.
                    let all_seen = self.nodes.live().all(|live| {
                        view.iter().any(|e| {
                            e.addr == live.addr() && !e.is_failed() && !e.has_flag("handshake")
                        })
                    });
                    if !roles_settled || !all_seen {
                        return Ok(None);
                    }
                    maps.push(slot_map(&view));
                }
                let agreed = maps.windows(2).all(|w| w[0] == w[1]);
                let full = maps.first().is_some_and(|m| {
                    m.iter()
                        .map(|(&a, &(b, _))| u32::from(b - a) + 1)
                        .sum::<u32>()
                        == u32::from(SLOTS)
                });
                Ok(Some(()).filter(|_| agreed && full))
            },
        )?;
        poll_until(
            "every live replica in sync with its primary",
            SETTLE_TIMEOUT,
            || {
                for node in self.nodes.live() {
                    let info = node.info("replication")?;
                    if info.get("role").map(String::as_str) != Some("slave") {
                        continue;
                    }
                    let host = info.get("master_host").cloned().unwrap_or_default();
                    let port = info.get("master_port").cloned().unwrap_or_default();
                    let primary = self.node(&format!("{host}:{port}"))?;
                    if !node.caught_up_with(primary)? {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
    }
}

/// `<scheme>://<first addr>?node=<addr>&node=...`.
fn cluster_url(scheme: &str, addrs: Vec<String>) -> String {
    let mut addrs = addrs.into_iter();
    let first = addrs.next().unwrap_or_default();
    let rest: Vec<String> = addrs.map(|a| format!("node={a}")).collect();
    format!("{scheme}://{first}?{}", rest.join("&"))
}

/// Starts one cluster node with its bus on a second port the kit reserves
/// (the default bus port, port + 10000, is reserved by nobody and does not
/// exist for ports above 55535); with `tls`, also on a TLS port, with the
/// bus and replication over TLS. The builder picks new ports for each of
/// its start attempts.
fn start_node(kind: ServerKind, tls: Option<&TlsFiles>) -> Result<RedisServer, TestkitError> {
    let mut builder = RedisServer::builder();
    if let Some(files) = tls {
        builder = builder
            .tls(files)
            .args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
    }
    builder
        .kind(kind)
        .cluster_enabled()
        .arg("--cluster-node-timeout")
        .arg(NODE_TIMEOUT_MS.to_string())
        // A replica's first sync would otherwise wait 5 s for others.
        .args(["--repl-diskless-sync-delay", "0"])
        .start()
}
