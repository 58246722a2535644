//! The only module that talks to fred, and the one that sends every
//! command call.
//!
//! Everything else in the client speaks in fairlock-core's terms (script
//! calls, [`Reply`](fairlock_core::Reply)) so the Redis client can be
//! swapped by rewriting this module alone. Three connections per process:
//! two command lanes and one subscriber that carries the process's single
//! pub/sub channel; on a single server and behind Sentinel two more, the
//! lanes' script sockets, on which the hot path's calls (the acquire and
//! release of a lock and of a permit set, and their waiter heartbeats)
//! are written and read by the calling tasks
//! (`script_socket/`), and on a cluster two per node called
//! (`sockets.rs`). On a single server, on a Sentinel-managed primary
//! and on a cluster's nodes, over plain TCP or TLS, that subscriber is not
//! fred's but fairlock's own grant connection (`grant_connection.rs`, one
//! per node in
//! `sharded_grants.rs`), read by the task that wakes the waiters; this
//! module only says where it connects ([`RedisConnection::grant_endpoint`],
//! which behind Sentinel follows fred's reconnects).
//!
//! The two command lanes keep a holder's work out of the waiters' line.
//! Each lane is pipelined: a command waits for every command sent before
//! it on that lane. With all commands on one lane, a holder's release (and
//! the fenced calls of its critical section) queued behind thousands of
//! waiters' enqueue, heartbeat and cancel scripts when a burst arrived, so
//! the lock changed hands once per backlog instead of once per round trip.
//! [`Lane::Holders`] carries what holders send (release, renewal, fenced
//! calls); [`Lane::Waiters`] everything else.
//!
//! Each connection's fred task is kept running by a [`BackgroundTask`]
//! (see [`keep_connected`]): fred ends that task for good on some routing
//! errors, and a client whose task ended answers no call again.
//!
//! Files: this one connects and closes; `calls.rs` sends the calls
//! (scripts, with their `NOSCRIPT` reload, resend and timeout);
//! `grant_endpoint.rs` says where fairlock's own grant connections go;
//! `fred_pubsub.rs` is fred's subscriber where it still carries grants;
//! `script_socket/` is the socket of fairlock's own that a calling task
//! writes a hot-path script call to and reads its reply from (its
//! `pipe.rs` keeps the calls in flight), `sockets.rs` which socket a call
//! takes (on a cluster, by the call's slot);
//! `keeper.rs` restarts a fred connection task that ended;
//! `moved_primary.rs` connects again when a single server answers
//! `READONLY` (demoted, its name moved to a new primary);
//! `stalled_primary.rs` connects again through the sentinels when a call
//! times out behind Sentinel (a primary that stopped answering); `errors.rs`
//! turns fred's errors into fairlock's; `reconnect_count.rs` tells a
//! `WAIT` answered on the write's connection from one answered after a
//! reconnect.

mod calls;
mod errors;
mod fred_pubsub;
mod grant_endpoint;
mod keeper;
mod moved_primary;
mod reconnect_count;
mod script_socket;
mod sockets;
mod stalled_primary;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::prelude::{
    Builder, Client, ClientLike, ClusterInterface, Config, Error as FredError, EventInterface,
    ReconnectPolicy, ServerConfig,
};
use tokio::sync::Semaphore;

use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::task::BackgroundTask;

use errors::{redis_error, with_certificate_hint};
use grant_endpoint::{address, grant_tls, GrantPlace};
use keeper::keep_connected;
use reconnect_count::ReconnectCount;

pub(crate) use errors::redact;
pub(crate) use fred_pubsub::{Messages, Reconnects};
pub(crate) use grant_endpoint::{check_scheme, GrantEndpoint};
pub(crate) use reconnect_count::ReconnectMark;
pub(crate) use script_socket::Order;

use moved_primary::MovedPrimary;
use sockets::Sockets;
use stalled_primary::StalledPrimary;

/// Which command connection a call goes on (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Enqueue, cancel, heartbeat, inspection and administration.
    Waiters,
    /// Release, renewal and fenced calls: what a holder is waited on for.
    Holders,
}

impl Lane {
    /// This lane's place in per-lane arrays.
    fn index(self) -> usize {
        match self {
            Lane::Waiters => 0,
            Lane::Holders => 1,
        }
    }
}

/// How a script call travels: through the lane's fred connection, or on
/// the lane's script socket (`script_socket/`) where there is one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Via<'a> {
    /// fred's connection of the lane, behind every call sent on it before.
    Fred,
    /// The lane's script socket in `Order`, else fred; the flag, if given,
    /// is set while the call's reply on the socket is unread (see
    /// [`ScriptSocket::call`]).
    Socket(Order, Option<&'a AtomicBool>),
}

/// Which connection carries a client's pub/sub subscriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PubSub {
    /// fairlock's own grant connections: on every topology, over plain TCP
    /// or TLS.
    OwnWherePossible,
    /// Always fred's subscriber (RedLock's primaries, which subscribe
    /// channels of their own).
    Fred,
}

/// What carries a client's pub/sub subscription.
enum Subscriber {
    /// fred's subscriber connection.
    Fred(SubscriberClient),
    /// fairlock's own grant connection, which connects here (opened by
    /// `grant_connection.rs`, not by this module).
    Own(GrantEndpoint),
}

/// The command connections and the subscriber connection of one client.
pub(crate) struct RedisConnection {
    /// Whether the server is a Redis Cluster: then a script may only touch
    /// keys of one slot, and batched calls are made per slot.
    clustered: bool,
    /// Whether the connections speak RESP3 (chosen in the URL).
    resp3: bool,
    commands: Client,
    holders: Client,
    subscriber: Subscriber,
    command_timeout: Duration,
    /// Script calls in flight per lane, `[waiters, holders]`, at most
    /// [`ClientConfig::max_in_flight`] each; `None` without that bound and
    /// on a cluster (see there).
    windows: Option<[Semaphore; 2]>,
    /// One per connection: connects it again if its fred task ends with an
    /// error. Taken and stopped by [`RedisConnection::quit`].
    keepers: Mutex<Vec<BackgroundTask>>,
    /// Set by [`RedisConnection::quit`]: a cancelled call is then final.
    closing: AtomicBool,
    /// With replica acknowledgement on, the command connections'
    /// reconnects: a `WAIT` is not believed across one
    /// (`reconnect_count.rs`).
    reconnects: Option<ReconnectCount>,
    /// fairlock's own sockets for the hot path's script calls, one per
    /// lane, `[waiters, holders]`, and on a cluster one such pair per node
    /// (`script_socket/`, `sockets.rs`); `None` where every call goes
    /// through fred.
    sockets: Option<Sockets>,
    /// On a single server's URL: the connections are opened again when
    /// the server answers `READONLY` (`moved_primary.rs`); `None` where
    /// fred follows the primary itself or a client must not move.
    moved_primary: Option<MovedPrimary>,
    /// Behind Sentinel: the command connections are opened again when a
    /// call times out (`stalled_primary.rs`); `None` elsewhere.
    stalled_primary: Option<StalledPrimary>,
}

impl RedisConnection {
    /// Connects the command connections and, unless fairlock's own grant
    /// connection is to carry the subscription (`pubsub`), fred's
    /// subscriber, all within the connect timeout.
    pub(crate) async fn connect(config: &ClientConfig, pubsub: PubSub) -> Result<Self> {
        let url = redact(&config.url);
        check_scheme(&config.url, &url)?;
        let fred_config = Config::from_url(&config.url).map_err(|e| {
            Error::InvalidOptions(format!(
                "Redis URL {url} is not valid: {}; expected redis://[user:password@]host:port[/db]",
                e.details()
            ))
        })?;
        let resp3 = fred_config.version == fred::types::RespVersion::RESP3;
        let tls = grant_tls(&fred_config);
        let grant_place = match pubsub {
            PubSub::OwnWherePossible => GrantPlace::of(&fred_config, tls.as_ref()),
            PubSub::Fred => None,
        };
        let (username, password) = (fred_config.username.clone(), fred_config.password.clone());
        // A single server's URL, followed where it leads after a
        // `READONLY` answer (`moved_primary.rs`).
        let moved_primary =
            matches!(grant_place, Some(GrantPlace::Fixed(_))).then(MovedPrimary::default);
        let stalled_primary = matches!(fred_config.server, ServerConfig::Sentinel { .. })
            .then(StalledPrimary::default);
        // Where grants come on fairlock's own connections too (see
        // `script_socket/`), and without replica acknowledgement (a `WAIT`
        // covers fred's connections).
        let sockets = match &grant_place {
            _ if !config.direct_calls || config.replica_acks.is_some() => None,
            Some(GrantPlace::Fixed(_) | GrantPlace::SentinelPrimary) => {
                Some(Sockets::one(fred_config.database, config.connect_timeout))
            }
            Some(GrantPlace::ClusterNodes) => Some(Sockets::per_node(config.connect_timeout)),
            None => None,
        };
        let mut builder = Builder::from_config(fred_config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = config.connect_timeout;
                c.internal_command_timeout = config.command_timeout;
                // fred resends a command after a reconnect; every fairlock
                // script is idempotent, so a resend is harmless.
                c.max_command_attempts = 3;
            })
            .with_performance_config(|p| {
                p.default_command_timeout = config.command_timeout;
                // Nobody listens to the command connections' event
                // channels (messages, reconnects, errors, ...): fred's
                // default buffer. Each of those ten channels preallocates
                // its buffer, so 4,096 on all three connections cost
                // 7 MB per client; the subscriber's is raised below.
                p.broadcast_channel_capacity = COMMAND_EVENT_BUFFER;
            })
            // Keep reconnecting forever (0 = no attempt limit), backing off to 2 s.
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2));
        let commands = builder
            .build()
            .map_err(|e| redis_error("building the command connection", e))?;
        let holders = builder
            .build()
            .map_err(|e| redis_error("building the holders' command connection", e))?;
        // Grants arrive in bursts when many locks hand over at once;
        // fred's default of 32 buffered messages overflows then.
        builder.with_performance_config(|p| p.broadcast_channel_capacity = GRANT_BUFFER);
        let subscriber = match grant_place {
            // Listening to fred's reconnects before `init`: its first
            // connect is announced too.
            Some(place) => Subscriber::Own(GrantEndpoint::new(
                place,
                || commands.reconnect_rx(),
                tls,
                username,
                password,
            )),
            None => Subscriber::Fred(
                builder
                    .build_subscriber_client()
                    .map_err(|e| redis_error("building the subscriber connection", e))?,
            ),
        };

        // Listening before `init`, like the grant endpoint.
        let reconnects = config
            .replica_acks
            .map(|_| ReconnectCount::new(&[&commands, &holders]));
        let started = async {
            let commands_task = commands.init().await?;
            let holders_task = holders.init().await?;
            let subscriber_task = match &subscriber {
                Subscriber::Fred(subscriber) => Some(subscriber.init().await?),
                Subscriber::Own(_) => None,
            };
            Ok::<_, FredError>((commands_task, holders_task, subscriber_task))
        };
        let started = match tokio::time::timeout(config.connect_timeout, started).await {
            Ok(Ok(tasks)) => Ok(tasks),
            Ok(Err(e)) => Err((with_certificate_hint(e.details()), Some(e))),
            Err(_) => Err((
                format!(
                    "no connection within the connect timeout of {:?}",
                    config.connect_timeout
                ),
                None,
            )),
        };
        let (commands_task, holders_task, subscriber_task) = match started {
            Ok(tasks) => tasks,
            Err((reason, source)) => {
                let grace = Duration::from_millis(100);
                let _ = tokio::time::timeout(grace, commands.quit()).await;
                let _ = tokio::time::timeout(grace, holders.quit()).await;
                if let Subscriber::Fred(subscriber) = &subscriber {
                    let _ = tokio::time::timeout(grace, subscriber.quit()).await;
                }
                return Err(Error::Unreachable {
                    url,
                    reason,
                    source,
                });
            }
        };
        let mut keepers = vec![
            keep_connected(
                "waiters' command connection",
                commands.clone(),
                commands_task,
            ),
            keep_connected("holders' command connection", holders.clone(), holders_task),
        ];
        if let (Subscriber::Fred(subscriber), Some(task)) = (&subscriber, subscriber_task) {
            // Resubscribe by itself after every reconnect of the subscriber
            // (a connection task started again by its keeper counts too).
            let _resubscriber = subscriber.manage_subscriptions();
            keepers.push(keep_connected(
                "subscriber connection",
                subscriber.clone(),
                task,
            ));
        }
        let clustered = commands.is_clustered();
        Ok(Self {
            resp3,
            clustered,
            commands,
            holders,
            subscriber,
            command_timeout: config.command_timeout,
            windows: config
                .max_in_flight
                .filter(|_| !clustered)
                .map(|calls| [Semaphore::new(calls), Semaphore::new(calls)]),
            keepers: Mutex::new(keepers),
            closing: AtomicBool::new(false),
            reconnects,
            sockets,
            moved_primary,
            stalled_primary,
        })
    }

    /// The connection of `lane`.
    fn lane(&self, lane: Lane) -> &Client {
        match lane {
            Lane::Waiters => &self.commands,
            Lane::Holders => &self.holders,
        }
    }

    /// Whether keys of different slots must go in different script calls.
    pub(crate) fn is_clustered(&self) -> bool {
        self.clustered
    }

    /// The primary serving `slot` in fred's slot map, `host:port`.
    pub(crate) fn node_of_slot(&self, slot: u16) -> Option<String> {
        let routing = self.commands.cached_cluster_state()?;
        routing.get_server(slot).map(address)
    }

    /// The primaries fred's slot map names, `host:port` (none off a
    /// cluster).
    pub(crate) fn cluster_primaries(&self) -> Vec<String> {
        self.commands
            .cached_cluster_state()
            .map(|routing| routing.unique_primary_nodes().iter().map(address).collect())
            .unwrap_or_default()
    }

    /// Reads the cluster's slot map again (`CLUSTER SLOTS`), within the
    /// command timeout: fred refreshes it only on a `MOVED` or a reconnect.
    pub(crate) async fn refresh_slot_map(&self) -> Result<()> {
        self.bounded("CLUSTER SLOTS", Box::pin(self.commands.sync_cluster()))
            .await
    }

    /// Where fairlock's own grant connection is to connect, when it carries
    /// the subscription instead of fred's subscriber.
    pub(crate) fn grant_endpoint(&self) -> Option<&GrantEndpoint> {
        match &self.subscriber {
            Subscriber::Own(endpoint) => Some(endpoint),
            Subscriber::Fred(_) => None,
        }
    }

    /// The first pair of script sockets (the only one off a cluster).
    #[cfg(test)]
    fn first_pair(&self) -> Option<std::sync::Arc<sockets::Pair>> {
        let (_, pair) = self.sockets.as_ref()?.all().into_iter().next()?;
        Some(pair)
    }

    /// Whether each lane's script socket, `[waiters, holders]`, is
    /// connected now (both false without sockets).
    #[cfg(test)]
    pub(crate) fn sockets_connected(&self) -> [bool; 2] {
        self.first_pair()
            .map_or([false; 2], |pair| pair.each_ref().map(|s| s.is_connected()))
    }

    /// How many calls each lane's script socket, `[waiters, holders]`,
    /// has taken (0 without sockets).
    #[cfg(test)]
    pub(crate) fn socket_calls(&self) -> [u64; 2] {
        self.first_pair()
            .map_or([0; 2], |pair| pair.each_ref().map(|s| s.calls_taken()))
    }

    /// Where each lane's script socket, `[waiters, holders]`, is
    /// connected now (`None` while not connected, and without sockets).
    #[cfg(test)]
    pub(crate) fn sockets_at(&self) -> [Option<String>; 2] {
        self.first_pair().map_or([None, None], |pair| {
            pair.each_ref().map(|s| s.connected_to())
        })
    }

    /// On a cluster, each node's pair of script sockets and where each
    /// is connected now, in the order the nodes were first called.
    #[cfg(test)]
    pub(crate) fn node_sockets_at(&self) -> Vec<(String, [Option<String>; 2])> {
        self.sockets.as_ref().map_or_else(Vec::new, |sockets| {
            sockets
                .all()
                .into_iter()
                .filter_map(|(node, pair)| Some((node?, pair.each_ref().map(|s| s.connected_to()))))
                .collect()
        })
    }

    /// Calls written behind the waiters' script socket's owed replies
    /// (0 without sockets).
    #[cfg(test)]
    pub(crate) fn written_after_socket(&self) -> usize {
        self.first_pair().map_or(0, |pair| pair[0].written_after())
    }

    /// Script calls of `lane` in flight now, with a window (0 without).
    #[cfg(test)]
    pub(crate) fn in_flight(&self, lane: Lane, limit: usize) -> usize {
        self.windows
            .as_ref()
            .map_or(0, |w| limit - w[lane.index()].available_permits())
    }

    /// Where the command connections' reconnects stand now; take it
    /// before a write whose replication [`RedisConnection::wait_replicas`]
    /// is to confirm. [`ReconnectMark::NONE`] without replica
    /// acknowledgement.
    pub(crate) fn reconnect_mark(&self) -> ReconnectMark {
        self.reconnects
            .as_ref()
            .map_or(ReconnectMark::NONE, ReconnectCount::mark)
    }

    /// Whether the command connection is up right now (fred reconnects in
    /// the background; a call sent while it is down waits for the command
    /// timeout).
    pub(crate) fn is_connected(&self) -> bool {
        self.commands.is_connected()
    }

    /// Closes every connection.
    pub(crate) async fn quit(&self) {
        self.closing.store(true, Ordering::SeqCst);
        // The keepers and a reconnect under way first, so none connects
        // again what is being closed.
        if let Some(stalled) = &self.stalled_primary {
            stalled.stop().await;
        }
        let keepers = std::mem::take(&mut *self.keepers.lock().unwrap_or_else(|p| p.into_inner()));
        for mut keeper in keepers {
            keeper.shutdown().await;
        }
        if let Some(sockets) = &self.sockets {
            for (_, pair) in sockets.all() {
                for socket in pair.iter() {
                    socket.close(self.command_timeout).await;
                }
            }
        }
        if let Some(subscriber) = self.fred_subscriber() {
            let _ = tokio::time::timeout(self.command_timeout, subscriber.quit()).await;
        }
        let _ = tokio::time::timeout(self.command_timeout, self.commands.quit()).await;
        let _ = tokio::time::timeout(self.command_timeout, self.holders.quit()).await;
    }
}

/// Messages the subscriber connection buffers for the grant router.
const GRANT_BUFFER: usize = 4_096;
/// Events a command connection buffers for listeners it never has.
const COMMAND_EVENT_BUFFER: usize = 32;
