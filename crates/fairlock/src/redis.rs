//! The only module that talks to fred.
//!
//! Everything else in the client speaks in fairlock-core's terms (script
//! calls, [`Reply`]) so the Redis client can be swapped by rewriting this
//! file alone. Three connections per process: two command lanes and one
//! subscriber that carries the process's single pub/sub channel. On a
//! single server, on a Sentinel-managed primary and on a cluster's nodes,
//! over plain TCP or TLS, that subscriber is not fred's but fairlock's own
//! grant connection (`grant_connection.rs`, one per node in
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

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fairlock_core::{
    HeartbeatBatch, HeartbeatReply, LockKeys, ProtocolError, RenewBatch, RenewStatus, Reply,
    ScriptCall, ScriptSource,
};
use fred::clients::SubscriberClient;
use fred::prelude::{
    Builder, Client, ClientLike, ClusterInterface, Config, Error as FredError, ErrorKind,
    EventInterface, Key, LuaInterface, PubsubInterface, ReconnectPolicy, Server, Value,
};
use fred::types::config::ServerConfig;
use fred::types::{ClusterHash, ConnectHandle, CustomCommand};
use tokio::sync::{broadcast, Semaphore};
use tracing::Instrument;

use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::grant_stream::TlsSettings;
use crate::task::{BackgroundTask, ShutdownSignal};
use crate::telemetry;

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

/// Where fairlock's own grant connection connects, with the URL's
/// credentials (those of the data nodes, not of the sentinels). No
/// `Debug`: it holds the password.
pub(crate) struct GrantEndpoint {
    target: GrantTarget,
    /// For `rediss://`: the TLS settings fred's command connections use.
    tls: Option<TlsSettings>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

/// Which server the grant connection subscribes on.
enum GrantTarget {
    /// The URL's single server, `host:port` as fred connects to it.
    Fixed(String),
    /// Behind Sentinel: the primary the waiters' command connection was
    /// last connected to. fred announces every (re)connect of that
    /// connection, the first one included, with the server it reached;
    /// the announcements are read when the address is asked for.
    Primary(Mutex<FollowPrimary>),
    /// On a cluster: the primary of each slot this process waits in, as
    /// fred's slot map names it (`sharded_grants.rs`).
    ClusterNodes,
}

/// The reconnect announcements of fred's waiters' command connection and
/// the last server they named.
struct FollowPrimary {
    reconnects: broadcast::Receiver<Server>,
    latest: Option<String>,
}

/// Which kind of grant endpoint a fred config allows, before any
/// connection exists.
#[derive(Debug, PartialEq, Eq)]
enum GrantPlace {
    Fixed(String),
    SentinelPrimary,
    ClusterNodes,
}

impl GrantPlace {
    /// Where fairlock's own grant connections can go for `config`: a single
    /// server, a Sentinel-managed primary or the nodes of a cluster, over
    /// plain TCP or TLS. `None` if fred's TLS connector is not the rustls
    /// one [`grant_tls`] takes (not with fairlock's `tls` feature; a TLS URL
    /// without it is refused by [`check_tls_scheme`]).
    fn of(config: &Config, tls: Option<&TlsSettings>) -> Option<Self> {
        if config.uses_tls() != tls.is_some() {
            return None;
        }
        match &config.server {
            ServerConfig::Centralized { server } => Some(Self::Fixed(address(server))),
            ServerConfig::Sentinel { .. } => Some(Self::SentinelPrimary),
            ServerConfig::Clustered { .. } => Some(Self::ClusterNodes),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

/// The TLS settings of fairlock's own grant connections: fred's rustls
/// connector (with the roots fred trusts). `None` without TLS.
#[cfg(feature = "tls")]
fn grant_tls(config: &Config) -> Option<TlsSettings> {
    use fred::types::config::TlsConnector;
    match &config.tls.as_ref()?.connector {
        TlsConnector::Rustls(connector) => Some(TlsSettings {
            connector: connector.clone(),
        }),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

#[cfg(not(feature = "tls"))]
fn grant_tls(_: &Config) -> Option<TlsSettings> {
    None
}

/// A TLS URL (`rediss://`, `rediss-cluster://`, `rediss-sentinel://`, or
/// Valkey's `valkeys` spellings) needs the `tls` feature: without it fred
/// would speak plain TCP to a TLS port and the connect would fail with
/// nothing that says why.
fn check_tls_scheme(url: &str, redacted: &str) -> Result<()> {
    let scheme = url
        .split("://")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let tls = scheme.starts_with("rediss") || scheme.starts_with("valkeys");
    if tls && !cfg!(feature = "tls") {
        return Err(Error::InvalidOptions(format!(
            "Redis URL {redacted} asks for TLS, and this build of fairlock has no TLS: \
             enable its `tls` feature"
        )));
    }
    Ok(())
}

/// `reason`, with what to do when it is a server certificate this process
/// does not trust (a private certificate authority, as self-hosted TLS
/// setups use).
fn with_certificate_hint(reason: &str) -> String {
    if reason.contains("UnknownIssuer") || reason.contains("InvalidCertificate") {
        format!(
            "{reason} (the server's TLS certificate is not trusted: add its certificate \
             authority to the system's store, or name its PEM file in SSL_CERT_FILE)"
        )
    } else {
        reason.to_owned()
    }
}

/// `host:port` of `server` as `TcpStream::connect` takes it: an IPv6 host
/// in brackets (a URL keeps them in the host, a sentinel names the bare
/// address).
fn address(server: &Server) -> String {
    let host: &str = &server.host;
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{}", server.port)
    } else {
        format!("{host}:{}", server.port)
    }
}

impl GrantEndpoint {
    /// How to wrap the connection in TLS, for `rediss://`.
    pub(crate) fn tls(&self) -> Option<&TlsSettings> {
        self.tls.as_ref()
    }

    /// Whether the grants come on one connection per cluster node (then
    /// [`GrantEndpoint::address`] is `None`; see
    /// [`RedisConnection::node_of_slot`]).
    pub(crate) fn is_sharded(&self) -> bool {
        matches!(self.target, GrantTarget::ClusterNodes)
    }

    /// The address to connect to now. `None` behind Sentinel before fred
    /// has reached a primary, and on a cluster.
    pub(crate) fn address(&self) -> Option<String> {
        match &self.target {
            GrantTarget::Fixed(address) => Some(address.clone()),
            GrantTarget::ClusterNodes => None,
            GrantTarget::Primary(follow) => {
                let mut follow = follow.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    match follow.reconnects.try_recv() {
                        Ok(server) => follow.latest = Some(address(&server)),
                        // Missed announcements: the next ones are newer.
                        Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                        Err(_) => break,
                    }
                }
                follow.latest.clone()
            }
        }
    }
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
}

impl RedisConnection {
    /// Connects the command connections and, unless fairlock's own grant
    /// connection is to carry the subscription (`pubsub`), fred's
    /// subscriber, all within the connect timeout.
    pub(crate) async fn connect(config: &ClientConfig, pubsub: PubSub) -> Result<Self> {
        let url = redact(&config.url);
        let fred_config = Config::from_url(&config.url).map_err(|e| {
            Error::InvalidOptions(format!(
                "Redis URL {url} is not valid: {}; expected redis://[user:password@]host:port[/db]",
                e.details()
            ))
        })?;
        check_tls_scheme(&config.url, &url)?;
        let resp3 = fred_config.version == fred::types::RespVersion::RESP3;
        let tls = grant_tls(&fred_config);
        let grant_place = match pubsub {
            PubSub::OwnWherePossible => GrantPlace::of(&fred_config, tls.as_ref()),
            PubSub::Fred => None,
        };
        let (username, password) = (fred_config.username.clone(), fred_config.password.clone());
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
            Some(place) => Subscriber::Own(GrantEndpoint {
                target: match place {
                    GrantPlace::Fixed(address) => GrantTarget::Fixed(address),
                    GrantPlace::ClusterNodes => GrantTarget::ClusterNodes,
                    // Listening before `init`: its first connect is
                    // announced too.
                    GrantPlace::SentinelPrimary => {
                        GrantTarget::Primary(Mutex::new(FollowPrimary {
                            reconnects: commands.reconnect_rx(),
                            latest: None,
                        }))
                    }
                },
                tls,
                username,
                password,
            }),
            None => Subscriber::Fred(
                builder
                    .build_subscriber_client()
                    .map_err(|e| redis_error("building the subscriber connection", e))?,
            ),
        };

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
        })
    }

    /// The connection of `lane`.
    fn lane(&self, lane: Lane) -> &Client {
        match lane {
            Lane::Waiters => &self.commands,
            Lane::Holders => &self.holders,
        }
    }

    /// Runs one lock script call with EVALSHA on `lane` and decodes its
    /// reply.
    pub(crate) async fn run<C: ScriptCall>(
        &self,
        lane: Lane,
        keys: &LockKeys,
        call: &C,
    ) -> Result<C::Output> {
        let keys: Vec<&str> = keys.all().iter().map(String::as_str).collect();
        let args = call.args().into_iter().map(String::into_bytes).collect();
        let reply = match self.eval(lane, C::SCRIPT.as_source(), &keys, args).await {
            Ok(reply) => reply,
            // Boxed: a rare path, kept out of every call's future.
            Err(Error::WrongType(detail)) => {
                return Err(Box::pin(self.name_wrong_keys(&keys, detail)).await)
            }
            Err(error) => return Err(error),
        };
        Ok(C::decode(reply)?)
    }

    /// A WRONGTYPE error that Redis raised inside a script names no key;
    /// one `TYPE` per lock key (on this error path only, never on the hot
    /// path) finds the keys that hold another type, so the error names them.
    async fn name_wrong_keys(&self, keys: &[&str], detail: String) -> Error {
        if keys.iter().any(|key| detail.contains(key)) {
            return Error::WrongType(detail);
        }
        let mut foreign = Vec::new();
        for (key, expected) in keys.iter().zip(KEY_TYPES) {
            let command = CustomCommand::new_static("TYPE", ClusterHash::FirstKey, false);
            let call = self
                .commands
                .custom::<Value, _>(command, vec![(*key).to_owned()]);
            if let Ok(Value::String(found)) = self.bounded("TYPE", Box::pin(call)).await {
                if &*found != "none" && &*found != expected {
                    foreign.push(format!("{key} is a {found}, not a {expected}"));
                }
            }
        }
        if foreign.is_empty() {
            return Error::WrongType(detail);
        }
        Error::WrongType(format!(
            "WRONGTYPE fairlock key {} ({detail})",
            foreign.join(", ")
        ))
    }

    /// Whether keys of different slots must go in different script calls.
    pub(crate) fn is_clustered(&self) -> bool {
        self.clustered
    }

    /// Runs one batched renewal (on a cluster, all keys in one slot).
    pub(crate) async fn renew(&self, batch: &RenewBatch<'_>) -> Result<Vec<RenewStatus>> {
        let reply = self
            .eval(
                Lane::Holders,
                RenewBatch::script().as_source(),
                &batch.keys(),
                batch.args().into_iter().map(String::into_bytes).collect(),
            )
            .await?;
        Ok(RenewBatch::decode(reply)?)
    }

    /// `WAIT replicas timeout` on both command lanes: how many replicas
    /// acknowledged every write either lane sent before (the fewer of the
    /// two answers; WAIT only covers its own connection's writes).
    pub(crate) async fn wait_replicas(&self, replicas: u32, timeout: Duration) -> Result<u32> {
        let (waiters, holders) = tokio::join!(
            self.wait_replicas_on(&self.commands, replicas, timeout),
            self.wait_replicas_on(&self.holders, replicas, timeout),
        );
        Ok(waiters?.min(holders?))
    }

    async fn wait_replicas_on(
        &self,
        connection: &Client,
        replicas: u32,
        timeout: Duration,
    ) -> Result<u32> {
        let command = CustomCommand::new_static("WAIT", ClusterHash::Random, true);
        let call = connection.custom::<Value, _>(
            command,
            vec![replicas.to_string(), timeout.as_millis().to_string()],
        );
        let wait = tokio::time::timeout(timeout + self.command_timeout, Box::pin(call));
        match wait.await {
            Ok(Ok(value)) => match to_reply(value) {
                Reply::Int(n) => Ok(u32::try_from(n).unwrap_or(0)),
                other => Err(Error::Protocol(ProtocolError {
                    script: "WAIT",
                    detail: format!("expected the number of replicas, got {other:?}"),
                })),
            },
            Ok(Err(e)) => Err(classify(&e, "WAIT", self.command_timeout)),
            Err(_) => Err(Error::Timeout {
                operation: "WAIT".to_owned(),
                timeout: timeout + self.command_timeout,
            }),
        }
    }

    /// Reads one server setting with `CONFIG GET`; `None` if the server
    /// does not know it.
    pub(crate) async fn config_get(&self, name: &str) -> Result<Option<String>> {
        let command = CustomCommand::new_static("CONFIG", ClusterHash::Random, false);
        let call = self
            .commands
            .custom::<Value, _>(command, vec!["GET".to_owned(), name.to_owned()]);
        let reply = self.bounded("CONFIG GET", Box::pin(call)).await?;
        Ok(match to_reply(reply) {
            Reply::Array(items) => match items.into_iter().nth(1) {
                Some(Reply::Str(value)) => Some(value),
                _ => None,
            },
            _ => None,
        })
    }

    /// Runs any script with EVALSHA; on NOSCRIPT (after `SCRIPT FLUSH` or a
    /// restart) loads it and retries once, transparently. Arguments are
    /// bytes, passed to Redis unchanged.
    ///
    /// A call that fred cancelled because its connection task stopped
    /// under it (see [`keep_connected`]), not because of [`Self::quit`],
    /// or that fred could not route (a slot in migration answering `ASK`,
    /// a cluster changing its slots), is sent again every 50 ms within the
    /// command timeout: every fairlock script is safe to run twice, and a
    /// routing failure means it did not run.
    pub(crate) async fn eval(
        &self,
        lane: Lane,
        script: ScriptSource<'_>,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<Reply> {
        let span = telemetry::script_span(script.name);
        let keys: Vec<Key> = keys.iter().map(|k| Key::from(*k)).collect();
        let args: Vec<Value> = args
            .into_iter()
            .map(|arg| Value::Bytes(arg.into()))
            .collect();
        let started = Instant::now();
        // A place in the lane's window, for the whole call (resends
        // included), waited for at most the command timeout.
        let _place = match &self.windows {
            Some(windows) => {
                let window = &windows[lane.index()];
                match tokio::time::timeout(self.command_timeout, window.acquire()).await {
                    Ok(Ok(place)) => Some(place),
                    // Never closed; a timeout is a Redis that does not answer.
                    _ => {
                        return Err(Error::Timeout {
                            operation: format!(
                                "script {} (waiting for a place in flight)",
                                script.name
                            ),
                            timeout: self.command_timeout,
                        })
                    }
                }
            }
            None => None,
        };
        let result = loop {
            let result = self
                .eval_once_loaded(self.lane(lane), script, &keys, &args)
                .instrument(span.clone())
                .await;
            match result {
                Err(ref error)
                    if resendable(error)
                        && !self.closing.load(Ordering::SeqCst)
                        && started.elapsed() + RESTART_PAUSE < self.command_timeout =>
                {
                    tokio::time::sleep(RESTART_PAUSE).await;
                }
                result => break result,
            }
        };
        if let Err(error) = &result {
            span.in_scope(|| telemetry::span_failed(error));
        }
        result
    }

    async fn eval_once_loaded(
        &self,
        connection: &Client,
        script: ScriptSource<'_>,
        keys: &[Key],
        args: &[Value],
    ) -> Result<Reply> {
        match self
            .evalsha(connection, script.sha1, keys, args, script.name)
            .await
        {
            Err(EvalError::NoScript) if self.clustered => {
                // On a cluster, SCRIPT LOAD would reach one node, not the
                // one that owns the keys: EVAL is routed by key and caches
                // the script on that node for the next EVALSHA.
                let call = connection.eval::<Value, _, _, _>(
                    script.source.to_owned(),
                    keys.to_vec(),
                    args.to_vec(),
                );
                let value = self.bounded(script.name, Box::pin(call)).await?;
                Ok(to_reply(value))
            }
            Err(EvalError::NoScript) => {
                let load = connection.script_load::<String, _>(script.source.to_owned());
                self.bounded("SCRIPT LOAD", Box::pin(load)).await?;
                match self
                    .evalsha(connection, script.sha1, keys, args, script.name)
                    .await
                {
                    Ok(reply) => Ok(reply),
                    Err(EvalError::Other(error)) => Err(error),
                    Err(EvalError::NoScript) => Err(Error::ScriptMissing(script.name.to_owned())),
                }
            }
            Ok(reply) => Ok(reply),
            Err(EvalError::Other(error)) => Err(error),
        }
    }

    async fn evalsha(
        &self,
        connection: &Client,
        sha: &str,
        keys: &[Key],
        args: &[Value],
        name: &str,
    ) -> std::result::Result<Reply, EvalError> {
        // Boxed, as in [`Self::bounded`].
        let call: FredCall<'_, Value> =
            Box::pin(connection.evalsha(sha, keys.to_vec(), args.to_vec()));
        match tokio::time::timeout(self.command_timeout + SLACK, call).await {
            Ok(Ok(value)) => Ok(to_reply(value)),
            Ok(Err(e)) if e.details().starts_with("NOSCRIPT") => Err(EvalError::NoScript),
            Ok(Err(e)) => Err(EvalError::Other(classify(&e, name, self.command_timeout))),
            Err(_) => Err(EvalError::Other(Error::Timeout {
                operation: format!("script {name}"),
                timeout: self.command_timeout,
            })),
        }
    }

    /// One fred call within the command timeout. The call comes boxed:
    /// a fred call's future is about 5 KB, and every wrapper that held it
    /// inline would be as large again (see [`FredCall`]).
    async fn bounded<T>(&self, operation: &str, call: FredCall<'_, T>) -> Result<T> {
        match tokio::time::timeout(self.command_timeout + SLACK, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(&e, operation, self.command_timeout)),
            Err(_) => Err(Error::Timeout {
                operation: operation.to_owned(),
                timeout: self.command_timeout,
            }),
        }
    }

    /// The primary serving `slot` in fred's slot map, `host:port`.
    pub(crate) fn node_of_slot(&self, slot: u16) -> Option<String> {
        let routing = self.commands.cached_cluster_state()?;
        routing.get_server(slot).map(address)
    }

    /// Where fairlock's own grant connection is to connect, when it carries
    /// the subscription instead of fred's subscriber.
    pub(crate) fn grant_endpoint(&self) -> Option<&GrantEndpoint> {
        match &self.subscriber {
            Subscriber::Own(endpoint) => Some(endpoint),
            Subscriber::Fred(_) => None,
        }
    }

    /// fred's subscriber, if it carries the subscription.
    fn fred_subscriber(&self) -> Option<&SubscriberClient> {
        match &self.subscriber {
            Subscriber::Fred(subscriber) => Some(subscriber),
            Subscriber::Own(_) => None,
        }
    }

    /// fred's subscriber, for `operation`: missing only when fairlock's own
    /// grant connection carries the subscription, where nothing asks for it.
    fn subscriber(&self, operation: &str) -> Result<&SubscriberClient> {
        self.fred_subscriber().ok_or_else(|| Error::InvalidOptions(format!(
            "{operation}: this client's pub/sub goes over fairlock's own grant connection, not fred's subscriber"
        )))
    }

    /// Subscribes the process's one subscriber connection to `channel`.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<()> {
        let subscriber = self.subscriber("SUBSCRIBE")?;
        self.bounded("SUBSCRIBE", Box::pin(subscriber.subscribe(channel)))
            .await?;
        // fred reports SUBSCRIBE done without reading Redis's answer, so a
        // refusal (NOPERM for the command or the channel) arrives as the
        // reply to the next command on that connection, or is dropped if
        // none is pending yet. Without this check a process whose
        // subscription was refused would connect, and its waiters would be
        // passed over by every handoff (nobody hears their grants). Redis
        // answers the PING after the SUBSCRIBE: with the refusal, or on a
        // RESP2 connection in subscribed mode with ["pong", ""] instead of
        // PONG. (On a cluster the PING may reach another node's
        // connection, and RESP3 answers PONG either way: only a refusal
        // that reaches the PING is seen there.)
        let pong = self
            .bounded("SUBSCRIBE", Box::pin(subscriber.ping::<Value>(None)))
            .await?;
        if self.clustered || self.resp3 || matches!(pong, Value::Array(_)) {
            return Ok(());
        }
        Err(Error::NoPermission(format!(
            "SUBSCRIBE {channel} was refused (the connection is not subscribed after it; \
             PING answered {pong:?}): the ACL user most likely lacks +subscribe or the channel"
        )))
    }

    /// Runs one batched waiter heartbeat (on a cluster, all locks in one
    /// slot).
    pub(crate) async fn heartbeat(
        &self,
        batch: &HeartbeatBatch<'_>,
    ) -> Result<Vec<HeartbeatReply>> {
        let reply = self
            .eval(
                Lane::Waiters,
                HeartbeatBatch::script().as_source(),
                &batch.keys(),
                batch.args().into_iter().map(String::into_bytes).collect(),
            )
            .await?;
        Ok(batch.decode(reply)?)
    }

    /// Unsubscribes the subscriber connection from `channel`.
    pub(crate) async fn unsubscribe(&self, channel: &str) -> Result<()> {
        self.bounded(
            "UNSUBSCRIBE",
            Box::pin(self.subscriber("UNSUBSCRIBE")?.unsubscribe(channel)),
        )
        .await
    }

    /// Script calls of `lane` in flight now, with a window (0 without).
    #[cfg(test)]
    pub(crate) fn in_flight(&self, lane: Lane, limit: usize) -> usize {
        self.windows
            .as_ref()
            .map_or(0, |w| limit - w[lane.index()].available_permits())
    }

    /// Whether the command connection is up right now (fred reconnects in
    /// the background; a call sent while it is down waits for the command
    /// timeout).
    pub(crate) fn is_connected(&self) -> bool {
        self.commands.is_connected()
    }

    /// Subscribes a sharded channel (`SSUBSCRIBE`, routed by fred to the
    /// node that owns the channel's slot).
    pub(crate) async fn ssubscribe(&self, channel: &str) -> Result<()> {
        let subscriber = self.subscriber("SSUBSCRIBE")?;
        self.bounded("SSUBSCRIBE", Box::pin(subscriber.ssubscribe(channel)))
            .await
    }

    /// Messages arriving on fred's subscriber connection (`None` without
    /// one: see [`RedisConnection::grant_endpoint`]).
    pub(crate) fn messages(&self) -> Option<Messages> {
        self.fred_subscriber().map(|subscriber| Messages {
            rx: subscriber.message_rx(),
        })
    }

    /// Fires once per reconnect of fred's subscriber connection (`None`
    /// without one).
    pub(crate) fn subscriber_reconnects(&self) -> Option<Reconnects> {
        self.fred_subscriber().map(|subscriber| Reconnects {
            rx: subscriber.reconnect_rx(),
        })
    }

    /// Closes every connection.
    pub(crate) async fn quit(&self) {
        self.closing.store(true, Ordering::SeqCst);
        // The keepers first, so none connects again what is being closed.
        let keepers = std::mem::take(&mut *self.keepers.lock().unwrap_or_else(|p| p.into_inner()));
        for mut keeper in keepers {
            keeper.shutdown().await;
        }
        if let Some(subscriber) = self.fred_subscriber() {
            let _ = tokio::time::timeout(self.command_timeout, subscriber.quit()).await;
        }
        let _ = tokio::time::timeout(self.command_timeout, self.commands.quit()).await;
        let _ = tokio::time::timeout(self.command_timeout, self.holders.quit()).await;
    }
}

/// A script call worth sending again: fred cancelled it (its connection
/// task stopped under it) or could not route it (fred 10.1 gives up on a
/// key whose slot is in migration, see [`keep_connected`]: with a routing
/// error when its router ends, or, when the router lives on, with
/// [`WRITE_ATTEMPTS_USED`] once every write attempt met an `ASK`). Either
/// way the script did not run, or ran and is safe to run again.
fn resendable(error: &Error) -> bool {
    match error {
        Error::Closed => true,
        Error::Redis { source, .. } => match source.kind() {
            ErrorKind::Routing => true,
            ErrorKind::Unknown => source.details() == WRITE_ATTEMPTS_USED,
            _ => false,
        },
        _ => false,
    }
}

/// fred 10.1's answer to a command whose write attempts (3 by default) are
/// used up, each on a lost connection or a redirect (`ASK`).
const WRITE_ATTEMPTS_USED: &str = "Too many failed write attempts.";

/// How long a keeper waits before starting a connection task again, so a
/// task that fails at once does not spin (fred's reconnect policy paces the
/// connection attempts themselves).
const RESTART_PAUSE: Duration = Duration::from_millis(50);

/// Keeps `client`'s fred connection task (`task`, then each one started in
/// its place) running until [`RedisConnection::quit`].
///
/// fred's task runs until `QUIT` with an unlimited reconnect policy, except
/// when its router fails: then it ends with the error, for good, and every
/// later call on that client waits out its timeout, the waiter heartbeat's
/// included, so the client's waiters are evicted as dead and never
/// granted. fred 10.1 does this on an `ASK` redirect: it sends `ASKING` to
/// the node the redirect names but the command itself back to the slot's
/// owner, which answers `ASK` again, and the third `ASK`, after the
/// command's last write attempt, ends the router. Every command that
/// reaches a slot in migration after its keys left the source does so
/// (one heartbeat or renewal in that window was enough). The command
/// fails with a routing error, and [`RedisConnection::eval`] sends it
/// again until the migration is done; the keeper starts the task again, which reconnects every node and
/// tells the subscriber's listeners, so its channels are subscribed again
/// and a heartbeat re-checks every waiter.
fn keep_connected<C>(connection: &'static str, client: C, mut task: ConnectHandle) -> BackgroundTask
where
    C: ClientLike + Clone + Send + Sync + 'static,
{
    BackgroundTask::spawn(
        "Redis connection keeper",
        move |mut shutdown: ShutdownSignal| async move {
            loop {
                let ended = tokio::select! {
                    _ = shutdown.requested() => return,
                    ended = &mut task => ended,
                };
                match ended {
                    // Closed by QUIT.
                    Ok(Ok(())) => return,
                    Ok(Err(error)) => tracing::warn!(
                        connection,
                        %error,
                        "fairlock's Redis connection stopped after an error; connecting it again"
                    ),
                    Err(join) if join.is_cancelled() => return,
                    Err(join) => tracing::warn!(
                        connection,
                        error = %join,
                        "fairlock's Redis connection task panicked; connecting it again"
                    ),
                }
                tokio::select! {
                    _ = shutdown.requested() => return,
                    _ = tokio::time::sleep(RESTART_PAUSE) => {}
                }
                task = client.connect();
            }
        },
    )
}

/// The Redis type of each lock key, in script order (see
/// [`LockKeys`]): owner, queue, alive, seq, freed.
const KEY_TYPES: [&str; 5] = ["string", "zset", "zset", "string", "string"];

/// Messages the subscriber connection buffers for the grant router.
const GRANT_BUFFER: usize = 4_096;
/// Events a command connection buffers for listeners it never has.
const COMMAND_EVENT_BUFFER: usize = 32;

/// A fred call, boxed. fred's request futures are about 5 KB each; held
/// inline, they made every wrapper here as large again (the script call's
/// future came to 11 KB, and its evaluation loop to 22 KB), so each call in
/// flight cost 11 KB of short-lived memory, copied and freed per call: a
/// burst of enqueues left the allocator's arenas fragmented, and the
/// process kept about 1 KB of RSS per waiter for it (the waiter probe of
/// `benchmarks/`). Boxed at the call site, a call in flight costs the fred
/// future alone.
type FredCall<'a, T> = Pin<Box<dyn Future<Output = Result<T, FredError>> + Send + 'a>>;

/// Extra time over fred's own command timeout before fairlock gives up on a
/// call itself: fred's timeout should fire first; this one is the backstop
/// that guarantees no call hangs.
const SLACK: Duration = Duration::from_millis(250);

enum EvalError {
    NoScript,
    Other(Error),
}

/// Pub/sub messages, each read where fred's reader left it.
pub(crate) struct Messages {
    rx: broadcast::Receiver<fred::types::Message>,
}

/// One pub/sub message. Its channel and payload are read in place: a
/// grant costs no copy of either.
pub(crate) struct PubSubMessage(fred::types::Message);

impl PubSubMessage {
    /// The channel it came on.
    pub(crate) fn channel(&self) -> &str {
        &self.0.channel
    }

    /// Its payload as text (our scripts publish text; anything else is
    /// rendered for the warning that names it).
    pub(crate) fn payload(&self) -> Cow<'_, str> {
        match &self.0.value {
            Value::String(s) => Cow::Borrowed(s),
            Value::Bytes(b) => String::from_utf8_lossy(b),
            other => Cow::Owned(format!("{other:?}")),
        }
    }
}

impl Messages {
    /// The next message, or `None` once the connection is closed for good.
    /// A lagging receiver skips what it missed and calls `on_lag`: a waiter
    /// heartbeat re-delivers every grant that a lost message carried.
    pub(crate) async fn recv(&mut self, mut on_lag: impl FnMut(u64)) -> Option<PubSubMessage> {
        loop {
            match self.rx.recv().await {
                Ok(message) => return Some(PubSubMessage(message)),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        "fairlock pub/sub receiver lagged; re-checking all waiters"
                    );
                    on_lag(missed);
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

/// Reconnect events of the subscriber connection.
pub(crate) struct Reconnects {
    rx: broadcast::Receiver<Server>,
}

impl Reconnects {
    /// Waits for the next reconnect; `false` once closed for good.
    pub(crate) async fn next(&mut self) -> bool {
        !matches!(
            self.rx.recv().await,
            Err(broadcast::error::RecvError::Closed)
        )
    }
}

/// fred's reply in fairlock-core's terms. Binary-safe: a bulk string that
/// is not UTF-8 becomes [`Reply::Bytes`], byte for byte.
fn to_reply(value: Value) -> Reply {
    match value {
        Value::Integer(i) => Reply::Int(i),
        Value::Boolean(b) => Reply::Int(i64::from(b)),
        Value::Double(d) => Reply::Str(d.to_string()),
        Value::String(s) => Reply::Str(s.to_string()),
        Value::Bytes(b) => Reply::from_bulk(b.to_vec()),
        Value::Null => Reply::Nil,
        Value::Array(items) => Reply::Array(items.into_iter().map(to_reply).collect()),
        Value::Map(map) => Reply::Array(
            map.inner()
                .into_iter()
                .flat_map(|(k, v)| [Reply::from_bulk(k.as_bytes().to_vec()), to_reply(v)])
                .collect(),
        ),
        Value::Queued => Reply::Nil,
    }
}

/// Turns a Redis error into fairlock's: each refusal a server can give
/// a lock call (a read-only replica, out of memory, a busy script, a
/// missing ACL permission, a foreign key type) gets its own variant with
/// advice, recognised by the error code Redis puts first, also when the
/// error was raised inside a script. Any other error raised inside a
/// script is [`Error::ScriptFailed`], never a generic [`Error::Redis`].
fn classify(error: &FredError, operation: &str, timeout: Duration) -> Error {
    let details = error.details();
    let code = details.split_whitespace().next().unwrap_or_default();
    match code {
        "WRONGTYPE" => return Error::WrongType(details.to_owned()),
        "READONLY" => return Error::ReadOnly(details.to_owned()),
        "OOM" => return Error::OutOfMemory(details.to_owned()),
        "BUSY" => return Error::Busy(details.to_owned()),
        "NOPERM" => return Error::NoPermission(details.to_owned()),
        _ => {}
    }
    // Redis 7 appends "script: <sha>, on @user_script:<line>." to errors
    // raised inside a script; Redis 6 says "Error running script".
    if details.contains("@user_script") || details.contains("Error running script") {
        return Error::ScriptFailed {
            script: operation.to_owned(),
            detail: details.to_owned(),
        };
    }
    match error.kind() {
        ErrorKind::Timeout => Error::Timeout {
            operation: operation.to_owned(),
            timeout,
        },
        ErrorKind::Canceled => Error::Closed,
        _ => redis_error(operation, error.clone()),
    }
}

fn redis_error(operation: &str, source: FredError) -> Error {
    Error::Redis {
        operation: operation.to_owned(),
        source,
    }
}

/// The URL without its password, for error messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{}:***{}", &url[..scheme + 3], user, &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use fairlock_core::Inspect;
    use fairlock_testkit::RedisServer;

    use fred::prelude::Server;

    use super::{address, resendable, GrantPlace, Lane};
    use crate::{Error, LockClient};

    /// The answers fred 10.1 gives a script call that met a slot in
    /// migration are sent again: the router ending (`Routing`), too many
    /// redirections (`Routing`), and a command that used up its write
    /// attempts on `ASK` answers (`Unknown`, which a CI run met: the
    /// call failed in `cluster.rs`'s ASK test instead of being sent again).
    /// Other errors (an error reply, a timeout) are not.
    #[test]
    fn calls_that_met_a_migrating_slot_are_sent_again() {
        use fred::error::{Error as FredError, ErrorKind};
        let from_fred = |kind: ErrorKind, details: &str| Error::Redis {
            operation: "acquire".to_owned(),
            source: FredError::new(kind, details.to_owned()),
        };
        assert!(resendable(&Error::Closed));
        assert!(resendable(&from_fred(
            ErrorKind::Routing,
            "Too many redirections."
        )));
        assert!(resendable(&from_fred(
            ErrorKind::Unknown,
            "Too many failed write attempts."
        )));
        assert!(!resendable(&from_fred(ErrorKind::Unknown, "ERR something")));
        assert!(!resendable(&from_fred(
            ErrorKind::Timeout,
            "Request timed out."
        )));
    }

    /// fairlock's own grant connection is opened for a single plain-TCP
    /// server at the address fred uses (an IPv6 host in brackets, which
    /// `to_socket_addrs` needs), for a Sentinel-managed primary and for the
    /// nodes of a cluster. A sentinel names an IPv6 primary without
    /// brackets.
    #[test]
    fn the_grant_connection_goes_where_fred_goes() {
        let place = |url: &str| {
            GrantPlace::of(
                &fred::prelude::Config::from_url(url).expect("valid URL"),
                None,
            )
        };
        let fixed = |address: &str| Some(GrantPlace::Fixed(address.to_owned()));
        assert_eq!(
            place("redis://user:pw@127.0.0.1:6380/2"),
            fixed("127.0.0.1:6380")
        );
        assert_eq!(place("redis://[::1]:6379"), fixed("[::1]:6379"));
        assert!("[::1]:6379".parse::<std::net::SocketAddr>().is_ok());
        assert_eq!(
            place("redis-sentinel://127.0.0.1:26379?sentinelServiceName=m"),
            Some(GrantPlace::SentinelPrimary)
        );
        assert_eq!(
            place("redis-cluster://127.0.0.1:7000"),
            Some(GrantPlace::ClusterNodes)
        );
        assert_eq!(address(&Server::new("::1", 6379)), "[::1]:6379");
        assert_eq!(address(&Server::new("10.0.0.2", 6379)), "10.0.0.2:6379");
    }

    /// With TLS, every topology gets fairlock's own grant connections, with
    /// fred's TLS connector.
    #[cfg(feature = "tls")]
    #[test]
    fn tls_grant_connections_go_to_every_topology() {
        let place = |url: &str| {
            let config = fred::prelude::Config::from_url(url).expect("valid URL");
            let tls = super::grant_tls(&config);
            assert!(tls.is_some(), "{url}: TLS settings");
            GrantPlace::of(&config, tls.as_ref())
        };
        assert_eq!(
            place("rediss://127.0.0.1:6380"),
            Some(GrantPlace::Fixed("127.0.0.1:6380".to_owned()))
        );
        assert_eq!(
            place("rediss-sentinel://127.0.0.1:26379?sentinelServiceName=m"),
            Some(GrantPlace::SentinelPrimary)
        );
        assert_eq!(
            place("rediss-cluster://127.0.0.1:7000"),
            Some(GrantPlace::ClusterNodes)
        );
    }

    /// A script call in flight holds fred's request future (about 5 KB)
    /// once, boxed. Held inline by each wrapper (call, evaluation loop,
    /// NOSCRIPT reload, retry) it came to 11 KB per call, allocated,
    /// copied and freed for every call; a burst of enqueues left that much
    /// per call in flight as fragmented, resident memory.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_script_call_holds_one_boxed_fred_future() {
        let server = RedisServer::start().expect("redis-server");
        let client = LockClient::connect(&server.url()).await.expect("client");
        let state = client.state().clone();
        let keys = state.keys("footprint").expect("keys");
        let call = Inspect { waiters: 0 };
        let run = state.redis.run(Lane::Waiters, &keys, &call);
        let size = std::mem::size_of_val(&run);
        let reply = run.await.expect("inspect");
        assert_eq!(reply.queue_len, 0);
        assert!(size <= 2048, "a script call's future is {size} B");
        client.shutdown().await;
    }

    /// A burst of callers keeps at most `max_in_flight` script calls in
    /// flight on the waiters' connection; the rest wait their turn in the
    /// process and are all queued once Redis answers. Redis is paused for
    /// writes, so every call sent stays in flight.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_keeps_at_most_the_window_in_flight() {
        const WINDOW: usize = 8;
        const CALLERS: usize = 100;
        let server = RedisServer::start().expect("redis-server");
        let config = crate::ClientConfig::builder(server.url())
            .max_in_flight(WINDOW)
            .build()
            .expect("config");
        let client = LockClient::with_config(config).await.expect("client");
        let state = client.state().clone();
        let holder = client.lock("window").await.expect("holder");
        server
            .cmd_ok(&["CLIENT", "PAUSE", "3000", "WRITE"])
            .expect("pause writes");
        let callers: Vec<_> = (0..CALLERS)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move {
                    let guard = client.lock("window").await?;
                    guard.release().await
                })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let in_flight = state.redis.in_flight(Lane::Waiters, WINDOW);
        server.cmd_ok(&["CLIENT", "UNPAUSE"]).expect("unpause");
        assert_eq!(in_flight, WINDOW, "script calls in flight during the burst");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let queued = client.inspect("window").await.expect("inspect").queue_len;
            if queued == CALLERS as u64 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{queued} of {CALLERS} callers queued"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        holder.release().await.expect("release");
        for caller in callers {
            caller.await.expect("task").expect("each caller is granted");
        }
        assert_eq!(state.redis.in_flight(Lane::Waiters, WINDOW), 0);
        client.shutdown().await;
    }

    /// A TLS URL is refused with a clear error in a build without TLS, and
    /// taken with it; a plain URL is taken either way.
    #[test]
    fn a_tls_url_needs_the_tls_feature() {
        for url in [
            "rediss://127.0.0.1:6380",
            "REDISS-CLUSTER://127.0.0.1:7000",
            "rediss-sentinel://127.0.0.1:26379?sentinelServiceName=m",
            "valkeys://127.0.0.1:6380",
        ] {
            let checked = super::check_tls_scheme(url, url);
            if cfg!(feature = "tls") {
                assert!(checked.is_ok(), "{url}: {checked:?}");
            } else {
                assert!(
                    matches!(&checked, Err(crate::Error::InvalidOptions(why)) if why.contains("`tls` feature")),
                    "{url}: {checked:?}"
                );
            }
        }
        for url in [
            "redis://127.0.0.1:6379",
            "redis-cluster://h:1",
            "valkey://h:1",
        ] {
            assert!(super::check_tls_scheme(url, url).is_ok(), "{url}");
        }
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            super::redact("redis://u:secret@h:1/0"),
            "redis://u:***@h:1/0"
        );
        assert_eq!(
            super::redact("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }
}
