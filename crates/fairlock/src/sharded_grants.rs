//! On a Redis Cluster: fairlock's own grant connections, one per node that
//! serves a slot this process waits in.
//!
//! On a cluster a grant is published with `SPUBLISH` on the process's
//! channel of the lock's slot, which only the node serving that slot
//! delivers. Each process subscribes that channel (`SSUBSCRIBE`) once per
//! slot it waits in, before its first enqueue there, and again at every
//! heartbeat round, because a slot migration or fail-over ends sharded
//! subscriptions. fred's subscriber did this before, and its messages
//! crossed fred's connection task and fairlock's router task before the
//! waiter ran; here, as on a single server (`grant_connection.rs`), the
//! task reading a node's socket wakes the waiter itself: one task hop, no
//! allocation per grant.
//!
//! One task (this module's) owns the connections: it takes subscription
//! requests from [`ClientState::subscribe_slot`], opens a node's
//! connection on first use (at the node fred's slot map names for the
//! slot, or the one a `MOVED` answer names), writes the `SSUBSCRIBE` and
//! hands the answer's sender to the node's reader, which answers requests
//! in the order they were sent. A connection is opened beside the task's
//! other work (a node that does not accept connections holds up only the
//! subscriptions waiting for it, never those of other nodes). A reader
//! that loses its connection, a node that does not answer in time and a
//! subscription the server ends (`sunsubscribe`: the slot left the node)
//! all ask the heartbeat for a round at once, which subscribes every slot
//! waited in again. A node whose connections keep failing (refused, or
//! closed at once: a node at its `maxclients`) is connected to again with
//! a backoff, 50 ms doubling to 2 s, per node; a connection that lived 2 s
//! or more resets it; a node's backoff and lost mark are forgotten once
//! fred's slot map no longer names it (nodes that come and go leave no
//! entry behind). Each connection is kept alive as on a single server:
//! after a heartbeat interval in which the node sent nothing it gets a
//! `PING`, and one unanswered for the command timeout closes it (so an idle
//! connection to a node that vanished without closing it, or stalled, does
//! not stay open, dead).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::grant_connection::{
    route_frames, ConnectionError, GrantConnection, FIRST_PAUSE, MAX_PAUSE, PING,
};
use crate::grant_stream::GrantStream;
use crate::grants::resubscribed;
use crate::resp2::{self, Frame};
use crate::state::{ClientState, ShardRefusal, ShardRequest};
use crate::task::{BackgroundTask, ShutdownSignal};

/// Where a subscription request's answer goes.
type Answer = oneshot::Sender<Result<(), ShardRefusal>>;

/// Answers awaited on one connection, in the order their requests went:
/// a subscription's (with its request's id), or (`None`) a keep-alive
/// `PING`'s.
type Awaiting = Arc<Mutex<VecDeque<Option<(u64, Answer)>>>>;

/// One node's connection.
struct Link {
    /// Tells this connection from a later one to the same node.
    id: u64,
    writer: WriteHalf<GrantStream>,
    awaiting: Awaiting,
    /// Reads the node's socket; dropping it stops it.
    reader: BackgroundTask,
    opened: Instant,
    /// Set by the reader whenever the node sent something.
    heard: Arc<AtomicBool>,
    /// When a keep-alive PING went out that nothing has answered since.
    pinged: Option<Instant>,
}

/// A node's connections that failed in a row, and when the next may be
/// opened.
struct Backoff {
    failures: u32,
    next_open: Instant,
}

/// What the task remembers of nodes whose connections failed or were
/// lost; at most one entry a node, and (see
/// [`Troubles::forget_departed`]) only for nodes still in the cluster.
#[derive(Default)]
struct Troubles {
    /// Nodes whose connection was lost and not opened again yet (the next
    /// connection opened to one counts as a reconnect).
    lost: HashSet<String>,
    /// Nodes whose last connections failed (see [`Troubles::failed`]).
    backoff: HashMap<String, Backoff>,
}

impl Troubles {
    /// Counts a failed connection to `address` (not opened, or lost within
    /// [`MAX_PAUSE`] of opening): the next waits [`FIRST_PAUSE`], doubled
    /// for each failure in a row, at most [`MAX_PAUSE`].
    fn failed(&mut self, address: &str) {
        let backoff = self
            .backoff
            .entry(address.to_owned())
            .or_insert_with(|| Backoff {
                failures: 0,
                next_open: Instant::now(),
            });
        backoff.failures = backoff.failures.saturating_add(1);
        let doublings = backoff.failures.saturating_sub(1).min(16);
        let pause: Duration = FIRST_PAUSE.saturating_mul(1 << doublings).min(MAX_PAUSE);
        backoff.next_open = Instant::now() + pause;
    }

    /// Forgets every node that `primaries` (fred's slot map) does not name
    /// and that is not `connected` (open or opening); a backoff only once
    /// [`MAX_PAUSE`] has passed since it allowed the next connection, so a
    /// node still tried now and then (one a `MOVED` names while fred's map
    /// is stale) keeps backing off. An empty slot map (not read yet)
    /// forgets nothing.
    fn forget_departed(&mut self, primaries: &[String], connected: impl Fn(&str) -> bool) {
        if primaries.is_empty() {
            return;
        }
        let keep = |address: &str| connected(address) || primaries.iter().any(|p| p == address);
        self.lost.retain(|address| keep(address));
        let now = Instant::now();
        self.backoff
            .retain(|address, backoff| keep(address) || now < backoff.next_open + MAX_PAUSE);
    }
}

/// A subscription waiting for its node's connection to open.
struct Pending {
    channel: String,
    id: u64,
    done: Answer,
}

/// The connections of one client, kept by its cluster grant task.
struct Nodes {
    state: Arc<ClientState>,
    links: HashMap<String, Link>,
    // The node each slot was last asked of is kept in the client state
    // (`ClientState::slot_node`), which acquire reads too.
    /// Connections being opened, and the subscriptions that wait for each.
    opening: HashMap<String, Vec<Pending>>,
    /// The opening connections themselves: each ends on its own (connect
    /// timeout, or shutdown).
    opens: JoinSet<(String, Result<GrantConnection, ConnectionError>)>,
    next_id: u64,
    /// What is remembered of nodes' failed and lost connections.
    troubles: Troubles,
    /// Readers report here that their connection ended: `(id, address)`.
    ended: mpsc::UnboundedSender<(u64, String)>,
}

/// Starts the task that keeps the cluster's grant connections.
pub(crate) fn spawn_sharded_grants(
    state: Arc<ClientState>,
    mut requests: mpsc::UnboundedReceiver<ShardRequest>,
) -> BackgroundTask {
    BackgroundTask::spawn(
        "cluster grant connections",
        move |mut shutdown: ShutdownSignal| async move {
            let (ended, mut ended_rx) = mpsc::unbounded_channel();
            let interval = state.config.heartbeat_interval;
            let mut keepalive = tokio::time::interval_at(Instant::now() + interval, interval);
            keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut nodes = Nodes {
                state,
                links: HashMap::new(),
                opening: HashMap::new(),
                opens: JoinSet::new(),
                next_id: 0,
                troubles: Troubles::default(),
                ended,
            };
            loop {
                tokio::select! {
                    biased;
                    () = shutdown.requested() => break,
                    Some((id, address)) = ended_rx.recv() => nodes.drop_link(&address, Some(id)),
                    Some(opened) = nodes.opens.join_next() => match opened {
                        Ok((address, opened)) => nodes.opened(address, opened).await,
                        Err(error) => tracing::warn!(%error, "fairlock's cluster connect task failed"),
                    },
                    request = requests.recv() => match request {
                        Some(request) => nodes.handle(request, &shutdown).await,
                        None => break,
                    },
                    _ = keepalive.tick() => {
                        nodes.keep_alive().await;
                        nodes.forget_departed_nodes();
                    }
                }
            }
            // Opening connections see the shutdown too and end.
            while nodes.opens.join_next().await.is_some() {}
            for (_, mut link) in nodes.links.drain() {
                link.reader.shutdown().await;
            }
        },
    )
}

impl Nodes {
    async fn handle(&mut self, request: ShardRequest, shutdown: &ShutdownSignal) {
        match request {
            ShardRequest::Subscribe {
                slot,
                channel,
                at,
                id,
                done,
            } => {
                let Some(address) = at.or_else(|| self.state.redis.node_of_slot(slot)) else {
                    let none = "no node is known for the slot yet".to_owned();
                    let _ = done.send(Err(ShardRefusal::NoConnection(none)));
                    return;
                };
                self.state.note_slot_node(slot, &address);
                if self.links.contains_key(&address) {
                    self.subscribe(&address, &channel, id, done).await;
                    return;
                }
                let pending = Pending { channel, id, done };
                if let Some(waiting) = self.opening.get_mut(&address) {
                    waiting.push(pending);
                    return;
                }
                self.opening.insert(address.clone(), vec![pending]);
                let (state, mut shutdown) = (Arc::clone(&self.state), shutdown.clone());
                let not_before = self
                    .troubles
                    .backoff
                    .get(&address)
                    .map(|backoff| backoff.next_open);
                self.opens.spawn(async move {
                    let open = async {
                        if let Some(not_before) = not_before {
                            tokio::time::sleep_until(not_before).await;
                        }
                        let endpoint = state
                            .redis
                            .grant_endpoint()
                            .ok_or(ConnectionError::Unexpected)?;
                        let timeout = state.config.connect_timeout;
                        GrantConnection::open_node(endpoint, address.clone(), timeout).await
                    };
                    let opened = tokio::select! {
                        () = shutdown.requested() => Err(ConnectionError::Closed),
                        opened = open => opened,
                    };
                    (address, opened)
                });
            }
            ShardRequest::Silent { id } => {
                // The connection the request was written on, if it is
                // still open: not one opened since, nor one that only
                // holds requests whose callers went away (a dropped
                // `lock()`), whichever node the slot is asked of now.
                let links = self.links.iter().map(|(a, l)| (a, &l.awaiting));
                if let Some(address) = node_holding(links, id) {
                    tracing::warn!(
                        %address,
                        "fairlock's pub/sub connection to a cluster node did not answer; opening it again"
                    );
                    self.drop_link(&address, None);
                }
            }
        }
    }

    /// A connection finished opening: its reader starts and the
    /// subscriptions that waited for it are sent, or they all fail.
    async fn opened(&mut self, address: String, opened: Result<GrantConnection, ConnectionError>) {
        let waiting = self.opening.remove(&address).unwrap_or_default();
        match opened {
            Ok(connection) => {
                self.start(connection);
                for Pending { channel, id, done } in waiting {
                    self.subscribe(&address, &channel, id, done).await;
                }
            }
            Err(error) => {
                self.troubles.failed(&address);
                for pending in waiting {
                    let why = format!("the connection to {address} failed: {error}");
                    let reply = Err(ShardRefusal::NoConnection(why));
                    let _ = pending.done.send(reply);
                }
            }
        }
    }

    /// Writes `SSUBSCRIBE channel` on the open connection to `address`.
    async fn subscribe(&mut self, address: &str, channel: &str, id: u64, done: Answer) {
        let Some(link) = self.links.get_mut(address) else {
            let why = format!("the connection to {address} closed");
            let _ = done.send(Err(ShardRefusal::NoConnection(why)));
            return;
        };
        let mut frame = Vec::new();
        resp2::command(&mut frame, &[b"SSUBSCRIBE", channel.as_bytes()]);
        link.awaiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(Some((id, done)));
        let timeout = self.state.config.command_timeout;
        let write = async {
            link.writer.write_all(&frame).await?;
            link.writer.flush().await
        };
        match tokio::time::timeout(timeout, write).await {
            Ok(Ok(())) => {}
            // The answers awaited are dropped with the link: their
            // requesters see the connection closed and try again.
            Ok(Err(error)) => {
                tracing::warn!(%address, %error, "fairlock's pub/sub connection to a cluster node failed");
                self.drop_link(address, None);
            }
            Err(_) => self.drop_link(address, None),
        }
    }

    /// Starts the reader of a connection just opened.
    fn start(&mut self, connection: GrantConnection) {
        let (address, stream, buf) = connection.into_parts();
        if self.troubles.lost.remove(&address) {
            resubscribed(&self.state);
        }
        let (reader, writer) = tokio::io::split(stream);
        let awaiting = Awaiting::default();
        self.next_id += 1;
        let id = self.next_id;
        let heard = Arc::new(AtomicBool::new(false));
        let reader = spawn_node_reader(
            Arc::clone(&self.state),
            NodeReader {
                id,
                address: address.clone(),
                reader,
                buf,
                awaiting: Arc::clone(&awaiting),
                ended: self.ended.clone(),
                heard: Arc::clone(&heard),
            },
        );
        self.links.insert(
            address,
            Link {
                id,
                writer,
                awaiting,
                reader,
                opened: Instant::now(),
                heard,
                pinged: None,
            },
        );
        self.publish_addresses();
    }

    /// Forgets the connection to `address` (only if it is connection `id`,
    /// when given), stopping its reader, and asks for a heartbeat round
    /// now: it subscribes every slot waited in again, which opens a new
    /// connection (counted as a reconnect by [`Nodes::start`]).
    fn drop_link(&mut self, address: &str, id: Option<u64>) {
        let current = self.links.get(address).map(|link| link.id);
        if current.is_none() || (id.is_some() && id != current) {
            return;
        }
        if let Some(link) = self.links.remove(address) {
            if link.opened.elapsed() >= MAX_PAUSE {
                self.troubles.backoff.remove(address);
            } else {
                self.troubles.failed(address);
            }
        }
        self.state.forget_slots(self.state.slots_on_node(address));
        self.troubles.lost.insert(address.to_owned());
        self.publish_addresses();
        self.state.heartbeat_now.notify_one();
    }

    /// Once per heartbeat interval: a `PING` on each connection that heard
    /// nothing since the last check, and each whose `PING` has gone
    /// unanswered for the command timeout is closed.
    async fn keep_alive(&mut self) {
        let timeout = self.state.config.command_timeout;
        let mut silent = Vec::new();
        for (address, link) in &mut self.links {
            if link.heard.swap(false, Ordering::Relaxed) {
                link.pinged = None;
                continue;
            }
            match link.pinged {
                Some(sent) if sent.elapsed() >= timeout => silent.push(address.clone()),
                Some(_) => {}
                None => {
                    link.awaiting
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_back(None);
                    let ping = async {
                        link.writer.write_all(PING).await?;
                        link.writer.flush().await
                    };
                    match tokio::time::timeout(timeout, ping).await {
                        Ok(Ok(())) => link.pinged = Some(Instant::now()),
                        _ => silent.push(address.clone()),
                    }
                }
            }
        }
        for address in silent {
            tracing::warn!(
                %address,
                "fairlock's pub/sub connection to a cluster node did not answer a PING; closing it"
            );
            self.drop_link(&address, None);
        }
    }

    /// Forgets what is remembered of nodes that fred's slot map no longer
    /// names and that have no connection, open or opening: a cluster whose
    /// nodes come and go (new addresses after a restart, nodes removed)
    /// would otherwise leave an entry per address for the client's life.
    fn forget_departed_nodes(&mut self) {
        let primaries = self.state.redis.cluster_primaries();
        let (links, opening) = (&self.links, &self.opening);
        self.troubles.forget_departed(&primaries, |address| {
            links.contains_key(address) || opening.contains_key(address)
        });
    }

    /// Records the nodes connected to (see [`ClientState::grants_at`]).
    fn publish_addresses(&self) {
        let mut addresses: Vec<String> = self.links.keys().cloned().collect();
        addresses.sort();
        *self
            .state
            .grants_at
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = addresses;
    }
}

/// What a node's reader owns.
struct NodeReader {
    id: u64,
    address: String,
    reader: ReadHalf<GrantStream>,
    buf: Vec<u8>,
    awaiting: Awaiting,
    ended: mpsc::UnboundedSender<(u64, String)>,
    heard: Arc<AtomicBool>,
}

/// Starts the task reading one node's connection: grants to their waiters,
/// answers to their requests, and word to the owner when it ends.
fn spawn_node_reader(state: Arc<ClientState>, node: NodeReader) -> BackgroundTask {
    BackgroundTask::spawn(
        "cluster node grant connection",
        move |mut shutdown: ShutdownSignal| async move {
            let NodeReader {
                id,
                address,
                mut reader,
                mut buf,
                awaiting,
                ended,
                heard,
            } = node;
            let lost = loop {
                match route_frames(&state, &buf, |frame| answer(&state, &awaiting, frame)) {
                    Ok(used) => {
                        buf.drain(..used);
                    }
                    Err(error) => break error,
                }
                tokio::select! {
                    biased;
                    () = shutdown.requested() => return,
                    read = reader.read_buf(&mut buf) => match read {
                        Ok(0) => break ConnectionError::Closed,
                        Ok(_) => heard.store(true, Ordering::Relaxed),
                        Err(error) => break ConnectionError::Io(error),
                    },
                }
            };
            tracing::warn!(%address, error = %lost, "fairlock's pub/sub connection to a cluster node was lost");
            let _ = ended.send((id, address));
        },
    )
}

/// Handles a frame other than a grant: the answer to the oldest request
/// awaited (a subscription's, or a keep-alive `PING`'s, whose answer is
/// only taken off the line), or the end of a subscription.
fn answer(state: &Arc<ClientState>, awaiting: &Awaiting, frame: Frame<'_>) {
    let reply = match frame {
        // `["pong", ""]` once subscribed, `+PONG` before.
        Frame::Subscribed(_) | Frame::Other | Frame::Simple(_) => Ok(()),
        Frame::Error(error) => Err(ShardRefusal::Redis(
            String::from_utf8_lossy(error).into_owned(),
        )),
        Frame::Unsubscribed(channel) => {
            // The slot left this node (a migration or fail-over): the
            // heartbeat subscribes the slots waited in again where they
            // are now, and the next enqueue in this slot subscribes it.
            state.forget_slots([fairlock_core::key_slot(channel)]);
            resubscribe_where_slots_are(state);
            return;
        }
        _ => return,
    };
    let next = awaiting
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop_front();
    if let Some(Some((_, done))) = next {
        let _ = done.send(reply);
    }
}

/// Asks the heartbeat for a round (which subscribes every slot waited in
/// again) once fred's slot map is read again. fred refreshes its map only
/// on a `MOVED` or a reconnect, and a node that ended a subscription after
/// a `CLUSTER FAILOVER` is a replica that still accepts `SSUBSCRIBE` and
/// hears the slot's messages, while the new primary's grant counts no
/// listener and has its lease cut to the waiter TTL: with the old map, the
/// subscription went straight back to it (`cluster.rs`:
/// `a_waiter_queued_before_a_manual_failover_keeps_its_own_lease`). One
/// refresh at a time: the slots a fail-over moves end together.
fn resubscribe_where_slots_are(state: &Arc<ClientState>) {
    if state.refreshing_slot_map.swap(true, Ordering::SeqCst) {
        return;
    }
    let refreshing = Arc::clone(state);
    drop(state.spawn_cleanup(async move {
        if let Err(error) = refreshing.redis.refresh_slot_map().await {
            tracing::debug!(%error, "fairlock could not read the cluster's slot map again; subscribing with the one it has");
        }
        refreshing.refreshing_slot_map.store(false, Ordering::SeqCst);
        refreshing.heartbeat_now.notify_one();
    }));
}

/// The node whose connection holds subscription request `id` unanswered.
fn node_holding<'a>(
    mut links: impl Iterator<Item = (&'a String, &'a Awaiting)>,
    id: u64,
) -> Option<String> {
    links
        .find(|(_, awaiting)| {
            awaiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .flatten()
                .any(|(held, _)| *held == id)
        })
        .map(|(address, _)| address.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names<'a>(addresses: impl Iterator<Item = &'a String>) -> Vec<&'a str> {
        let mut names: Vec<&str> = addresses.map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// A requester that timed out has the connection its request was
    /// written on closed, whichever node the slot was asked of since, and
    /// no other: not an idle one, not one with only a keep-alive `PING`
    /// out, not one whose requests all still wait, and not one holding a
    /// request whose caller went away (a dropped `lock()`), which a
    /// healthy node answers in time. Before, the connection to the slot's
    /// last-asked node was closed whatever it held.
    #[test]
    fn only_the_connection_holding_the_timed_out_request_is_silent() {
        let nodes = [
            "10.0.0.1:7000",
            "10.0.0.2:7000",
            "10.0.0.3:7000",
            "10.0.0.4:7000",
        ];
        let links: Vec<(String, Awaiting)> = nodes
            .iter()
            .map(|address| (address.to_string(), Awaiting::default()))
            .collect();
        let push = |node: usize, entry: Option<(u64, Answer)>| {
            links[node].1.lock().expect("awaiting").push_back(entry);
        };
        let holding = |id: u64| node_holding(links.iter().map(|(a, w)| (a, w)), id);
        // Node 0 idle; node 1 a PING out; node 2 request 7 waited for;
        // node 3 request 8 whose caller went away, then request 9.
        push(1, None);
        let (waited, _requester) = oneshot::channel();
        push(2, Some((7, waited)));
        let (dropped, requester) = oneshot::channel();
        drop(requester);
        push(3, Some((8, dropped)));
        let (timed_out, _requester) = oneshot::channel();
        push(3, Some((9, timed_out)));
        assert_eq!(holding(9).as_deref(), Some(nodes[3]));
        assert_eq!(holding(7).as_deref(), Some(nodes[2]));
        assert_eq!(holding(5), None, "a request no connection holds");
    }

    /// A node that left fred's slot map and has no connection is forgotten
    /// (its backoff once it has not been tried for a while); one the map
    /// still names, or that is connected (or connecting), keeps its lost
    /// mark and its backoff; before the map is read, all do.
    #[tokio::test]
    async fn nodes_gone_from_the_slot_map_are_forgotten() {
        const NODES: [&str; 4] = [
            "10.0.0.1:7000",
            "10.0.0.2:7000",
            "10.0.0.3:7000",
            "10.0.0.4:7000",
        ];
        let mut troubles = Troubles::default();
        for address in NODES {
            troubles.failed(address);
            troubles.failed(address);
            troubles.lost.insert(address.to_owned());
        }
        // A node tried lately (its backoff running, or just over) keeps
        // its backoff, also when the map does not name it.
        troubles.forget_departed(&["10.0.0.9:7000".to_owned()], |_| false);
        assert!(
            troubles.lost.is_empty(),
            "lost marks of departed nodes kept"
        );
        assert_eq!(
            troubles.backoff.len(),
            4,
            "a backoff under way was forgotten"
        );
        for address in NODES {
            troubles.lost.insert(address.to_owned());
        }
        // Not tried since: every backoff ended over MAX_PAUSE ago.
        let long_ago = Instant::now()
            .checked_sub(MAX_PAUSE + FIRST_PAUSE)
            .expect("an instant in the past");
        for backoff in troubles.backoff.values_mut() {
            backoff.next_open = long_ago;
        }
        troubles.forget_departed(&[], |_| false);
        assert_eq!(
            troubles.lost.len(),
            4,
            "a slot map not read yet forgot nodes"
        );
        assert_eq!(
            troubles.backoff.len(),
            4,
            "a slot map not read yet forgot backoffs"
        );

        let primaries = ["10.0.0.1:7000".to_owned(), "10.0.0.9:7000".to_owned()];
        troubles.forget_departed(&primaries, |address| address == "10.0.0.3:7000");
        assert_eq!(
            names(troubles.lost.iter()),
            ["10.0.0.1:7000", "10.0.0.3:7000"]
        );
        assert_eq!(
            names(troubles.backoff.keys()),
            ["10.0.0.1:7000", "10.0.0.3:7000"]
        );
        let kept = &troubles.backoff["10.0.0.1:7000"];
        assert_eq!(kept.failures, 2, "a node still in the map lost its backoff");
    }
}
