//! The calls the command lanes send: lock scripts by `EVALSHA` (loaded
//! again after `NOSCRIPT`, sent again after fred could not route them or a
//! cluster node answered `TRYAGAIN` or `CLUSTERDOWN`),
//! batched renewals and heartbeats, `WAIT` and `CONFIG GET`. Every call
//! ends within the command timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fairlock_core::{
    HeartbeatBatch, HeartbeatReply, LockKeys, ProtocolError, RenewBatch, RenewStatus, Reply,
    ScriptCall, ScriptSource,
};
use fred::prelude::{
    Client, ClientLike, ClusterInterface, Error as FredError, ErrorKind, Key, LuaInterface, Value,
};
use fred::types::{ClusterHash, CustomCommand};
use tracing::Instrument;

use super::errors::classify;
use super::keeper::RESTART_PAUSE;
use super::script_socket::{EvalSha, Order, Outcome, SocketTarget};
use super::sockets;
use super::{Lane, ReconnectMark, RedisConnection, Via};
use crate::error::{Error, Result};
use crate::telemetry;

impl RedisConnection {
    /// Runs one lock script call with EVALSHA on `lane` and decodes its
    /// reply.
    pub(crate) async fn run<C: ScriptCall>(
        &self,
        lane: Lane,
        keys: &LockKeys,
        call: &C,
    ) -> Result<C::Output> {
        self.run_via(lane, Via::Fred, keys, call).await
    }

    /// [`Self::run`], on the lane's script socket where `via` says so.
    pub(crate) async fn run_via<C: ScriptCall>(
        &self,
        lane: Lane,
        via: Via<'_>,
        keys: &LockKeys,
        call: &C,
    ) -> Result<C::Output> {
        let keys: Vec<&str> = keys.all().iter().map(String::as_str).collect();
        let args = call.args().into_iter().map(String::into_bytes).collect();
        let reply = match self
            .eval_resending(lane, via, C::SCRIPT.as_source(), &keys, args, true)
            .await
        {
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
    /// acknowledged every write either lane sent since `since` (the fewer
    /// of the two answers; WAIT only covers its own connection's writes).
    /// `None` if either connection was replaced since: the answer may then
    /// come from a new connection, or another server, that never made
    /// those writes (`reconnect_count.rs`).
    pub(crate) async fn wait_replicas(
        &self,
        since: ReconnectMark,
        replicas: u32,
        timeout: Duration,
    ) -> Result<Option<u32>> {
        let (waiters, holders) = tokio::join!(
            self.wait_replicas_on(&self.commands, replicas, timeout),
            self.wait_replicas_on(&self.holders, replicas, timeout),
        );
        let acked = waiters?.min(holders?);
        Ok((self.reconnect_mark() == since).then_some(acked))
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
            // The server ended the WAIT (a primary demoted under it, or
            // CLIENT UNBLOCK): no replica is known to have anything.
            Ok(Err(e)) if e.details().starts_with("UNBLOCKED") => Ok(0),
            Ok(Err(e)) => Err(classify(&e, "WAIT", self.command_timeout)),
            Err(_) => Err(Error::Timeout {
                operation: "WAIT".to_owned(),
                timeout: timeout + self.command_timeout,
            }),
        }
    }

    /// Reads one server setting with `CONFIG GET` from every server that
    /// holds lock keys: the server, or on a cluster each primary of fred's
    /// slot map (a `CONFIG GET` without a key goes to one arbitrary node).
    /// Each with the primary's address (empty off a cluster); `None` if
    /// the server does not know it.
    pub(crate) async fn config_get_each(
        &self,
        name: &str,
    ) -> Result<Vec<(String, Option<String>)>> {
        let primaries = self
            .commands
            .cached_cluster_state()
            .map(|routing| routing.unique_primary_nodes())
            .unwrap_or_default();
        if primaries.is_empty() {
            return Ok(vec![(
                String::new(),
                self.config_get_via(&self.commands, name).await?,
            )]);
        }
        let mut each = Vec::with_capacity(primaries.len());
        for primary in primaries {
            let shown = super::grant_endpoint::address(&primary);
            let node = self.commands.with_cluster_node(primary);
            each.push((shown, self.config_get_via(&node, name).await?));
        }
        Ok(each)
    }

    /// `CONFIG GET name` through `client` (a node-bound one on a cluster).
    async fn config_get_via<C: ClientLike>(
        &self,
        client: &C,
        name: &str,
    ) -> Result<Option<String>> {
        let command = CustomCommand::new_static("CONFIG", ClusterHash::Random, false);
        let call = client.custom::<Value, _>(command, vec!["GET".to_owned(), name.to_owned()]);
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
    /// under it (see [`keep_connected`](super::keeper::keep_connected)),
    /// not because of [`Self::quit`], or that fred could not route (a slot
    /// in migration answering `ASK`, a cluster changing its slots), is sent
    /// again every 50 ms within the command timeout. Only for fairlock's
    /// own scripts, every one safe to run twice: those answers can also
    /// follow a call that ran (fred puts a call written but unanswered when
    /// its connection closes back in line, and its last write attempt then
    /// fails), so a user's script goes through [`Self::eval_user`].
    pub(crate) async fn eval(
        &self,
        lane: Lane,
        script: ScriptSource<'_>,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<Reply> {
        self.eval_resending(lane, Via::Fred, script, keys, args, true)
            .await
    }

    /// A user's script (a fenced write or fenced script), which may not be
    /// safe to run twice: sent as [`Self::eval`] sends, but never sent
    /// again by fairlock after an error (fred itself resends a call after a
    /// reconnect, up to its write attempts, as the fenced calls' docs say).
    pub(crate) async fn eval_user(
        &self,
        lane: Lane,
        script: ScriptSource<'_>,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<Reply> {
        self.eval_resending(lane, Via::Fred, script, keys, args, false)
            .await
    }

    async fn eval_resending(
        &self,
        lane: Lane,
        via: Via<'_>,
        script: ScriptSource<'_>,
        keys: &[&str],
        args: Vec<Vec<u8>>,
        resend: bool,
    ) -> Result<Reply> {
        let span = telemetry::script_span(script.name);
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
        // One deadline for the call in Redis, whatever it takes: a script
        // load (three round trips) and resends included. Each step once had
        // the whole command timeout: a call needing its script loaded
        // behind slow replies took three times it.
        let in_redis = Instant::now();
        let deadline = in_redis + self.command_timeout + SLACK;
        // Sent again at most once after a `READONLY` answer, on the
        // connections opened again (`moved_primary.rs`).
        let mut followed = false;
        if let Some(answer) = self
            .on_socket(lane, via, script, keys, &args)
            .instrument(span.clone())
            .await
        {
            followed = matches!(answer, Err(Error::ReadOnly(_)))
                && self.follow_moved_primary(in_redis, deadline).await;
            if !followed {
                if let Err(error) = &answer {
                    span.in_scope(|| telemetry::span_failed(error));
                }
                return answer;
            }
        }
        let keys: Vec<Key> = keys.iter().map(|k| Key::from(*k)).collect();
        let args: Vec<Value> = args
            .into_iter()
            .map(|arg| Value::Bytes(arg.into()))
            .collect();
        let result = loop {
            let result = self
                .eval_once_loaded(self.lane(lane), script, &keys, &args, deadline)
                .instrument(span.clone())
                .await;
            match result {
                Err(Error::ReadOnly(_)) if !followed && !self.closing.load(Ordering::SeqCst) => {
                    // Moved where the URL leads now, and sent again there
                    // if it is fairlock's own script; a user's script
                    // fails, the connections moved for the next call.
                    followed = self.follow_moved_primary(in_redis, deadline).await;
                    if !(followed && resend) {
                        break result;
                    }
                }
                Err(ref error)
                    if resend
                        && resendable(error)
                        && !self.closing.load(Ordering::SeqCst)
                        && in_redis.elapsed() + RESTART_PAUSE < self.command_timeout =>
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

    /// The call on the lane's script socket, if `via` asks for it and the
    /// socket takes it (`script_socket/`): its answer, or `None` for the
    /// call to go through fred (not sent there; or sent, and the socket
    /// failed before the reply, which a resend through fred answers; or
    /// Redis lacks the script, which fred's path loads).
    async fn on_socket(
        &self,
        lane: Lane,
        via: Via<'_>,
        script: ScriptSource<'_>,
        keys: &[&str],
        args: &[Vec<u8>],
    ) -> Option<Result<Reply>> {
        let (Via::Socket(order, unanswered), Some(sockets), Some(endpoint)) =
            (via, &self.sockets, self.grant_endpoint())
        else {
            return None;
        };
        // On a cluster, the node fred's slot map names for the call's
        // slot (all of a call's keys share it).
        let node = match sockets.per_node_of_slot() {
            true => Some(self.node_of_slot(fairlock_core::key_slot(keys.first()?.as_bytes()))?),
            false => None,
        };
        let pair = sockets.pair(node.as_deref(), || self.cluster_primaries())?;
        let target = SocketTarget {
            endpoint,
            node: node.as_deref(),
            database: sockets.database,
            connect_timeout: sockets.connect_timeout.min(self.command_timeout),
        };
        let call = EvalSha {
            sha: script.sha1,
            keys,
            args,
        };
        let deadline = Instant::now() + self.command_timeout;
        let socket = &pair[lane.index()];
        // Boxed, as fred's calls are (see [`FredCall`]): kept out of every
        // call's future, the ones through fred included.
        match Box::pin(socket.call(&target, &call, order, deadline, unanswered)).await {
            Outcome::Answered(Ok(reply)) => Some(Ok(reply)),
            Outcome::Answered(Err(error)) if error.starts_with("NOSCRIPT") => None,
            // A redirection, or a cluster not ready: nothing ran there.
            Outcome::Answered(Err(error))
                if node.is_some() && sockets::elsewhere_in_the_cluster(&error) =>
            {
                None
            }
            // Behind Sentinel, a demoted primary: the socket has closed
            // that connection, and fred follows the sentinels.
            Outcome::Answered(Err(error))
                if error.starts_with("READONLY") && endpoint.follows_primary() =>
            {
                None
            }
            Outcome::Answered(Err(error)) => Some(Err(classify(
                &FredError::new(ErrorKind::Unknown, error),
                script.name,
                self.command_timeout,
            ))),
            Outcome::NotSent | Outcome::Lost => None,
            Outcome::TimedOut => {
                // Behind Sentinel: perhaps a stalled primary.
                self.after_timeout();
                Some(Err(Error::Timeout {
                    operation: format!("script {}", script.name),
                    timeout: self.command_timeout,
                }))
            }
        }
    }

    /// One attempt, its script loaded first if Redis lacks it, every step
    /// within `deadline`.
    async fn eval_once_loaded(
        &self,
        connection: &Client,
        script: ScriptSource<'_>,
        keys: &[Key],
        args: &[Value],
        deadline: Instant,
    ) -> Result<Reply> {
        match self
            .evalsha(connection, script.sha1, keys, args, script.name, deadline)
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
                let value = self
                    .bounded_until(deadline, script.name, Box::pin(call))
                    .await?;
                Ok(to_reply(value))
            }
            Err(EvalError::NoScript) => {
                let load = connection.script_load::<String, _>(script.source.to_owned());
                self.bounded_until(deadline, "SCRIPT LOAD", Box::pin(load))
                    .await?;
                match self
                    .evalsha(connection, script.sha1, keys, args, script.name, deadline)
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
        deadline: Instant,
    ) -> std::result::Result<Reply, EvalError> {
        // Boxed, as in [`Self::bounded`].
        let call: FredCall<'_, Value> =
            Box::pin(connection.evalsha(sha, keys.to_vec(), args.to_vec()));
        let answer = match tokio::time::timeout_at(deadline.into(), call).await {
            Ok(Ok(value)) => Ok(to_reply(value)),
            Ok(Err(e)) if e.details().starts_with("NOSCRIPT") => Err(EvalError::NoScript),
            Ok(Err(e)) => Err(EvalError::Other(classify(&e, name, self.command_timeout))),
            Err(_) => Err(EvalError::Other(Error::Timeout {
                operation: format!("script {name}"),
                timeout: self.command_timeout,
            })),
        };
        if matches!(answer, Err(EvalError::Other(Error::Timeout { .. }))) {
            self.after_timeout();
        }
        answer
    }

    /// One fred call within the command timeout. The call comes boxed:
    /// a fred call's future is about 5 KB, and every wrapper that held it
    /// inline would be as large again (see [`FredCall`]).
    pub(super) async fn bounded<T>(&self, operation: &str, call: FredCall<'_, T>) -> Result<T> {
        let deadline = Instant::now() + self.command_timeout + SLACK;
        self.bounded_until(deadline, operation, call).await
    }

    /// One fred call that ends by `deadline` (the command timeout and its
    /// slack from when the call it is a step of began).
    async fn bounded_until<T>(
        &self,
        deadline: Instant,
        operation: &str,
        call: FredCall<'_, T>,
    ) -> Result<T> {
        let answer = match tokio::time::timeout_at(deadline.into(), call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(&e, operation, self.command_timeout)),
            Err(_) => Err(Error::Timeout {
                operation: operation.to_owned(),
                timeout: self.command_timeout,
            }),
        };
        if matches!(answer, Err(Error::Timeout { .. })) {
            self.after_timeout();
        }
        answer
    }

    /// Runs one batched waiter heartbeat (on a cluster, all locks in one
    /// slot).
    pub(crate) async fn heartbeat(
        &self,
        batch: &HeartbeatBatch<'_>,
    ) -> Result<Vec<HeartbeatReply>> {
        // On the waiters' script socket where it is clear, as an acquire
        // goes: through fred, each call cloned its batch's keys and
        // arguments (160 keys for 32 locks) into fred's own types, a few
        // percent of the client's CPU where a process waits on many locks.
        let via = Via::Socket(Order::IfClear, None);
        let reply = self
            .eval_resending(
                Lane::Waiters,
                via,
                HeartbeatBatch::script().as_source(),
                &batch.keys(),
                batch.args().into_iter().map(String::into_bytes).collect(),
                true,
            )
            .await?;
        Ok(batch.decode(reply)?)
    }
}

/// A script call worth sending again: fred cancelled it (its connection
/// task stopped under it) or could not route it (fred 10.1 gives up on a
/// key whose slot is in migration, see [`keep_connected`](super::keeper::keep_connected): with a routing
/// error when its router ends, or, when the router lives on, with
/// [`WRITE_ATTEMPTS_USED`] once every write attempt met an `ASK`), or the
/// node refused it before running it (see [`NOT_RUN`]). Either way the
/// script did not run, or ran and is safe to run again.
fn resendable(error: &Error) -> bool {
    match error {
        Error::Closed => true,
        Error::Redis { source, .. } => {
            let code = source.details().split_whitespace().next();
            match source.kind() {
                ErrorKind::Routing => true,
                _ if code.is_some_and(|code| NOT_RUN.contains(&code)) => true,
                ErrorKind::Unknown => source.details() == WRITE_ATTEMPTS_USED,
                _ => false,
            }
        }
        _ => false,
    }
}

/// fred 10.1's answer to a command whose write attempts (3 by default) are
/// used up, each on a lost connection or a redirect (`ASK`).
const WRITE_ATTEMPTS_USED: &str = "Too many failed write attempts.";

/// Error codes a cluster node answers instead of running a command, which
/// fred 10.1 hands back as they are: `TRYAGAIN` (since Redis 7.0; kind
/// `Unknown`) for a call whose keys are only partly on the node while their
/// slot migrates, until they have all moved (a lock seldom has all its
/// keys: one held with nobody queued has no queue, so its release,
/// `is_held` and other clients' acquires meet this), and `CLUSTERDOWN`
/// while the cluster is down or the slot unserved (fred reconnects and
/// sends the call again itself, and returns the answer, kind `Cluster`, when
/// its last write attempt meets one too). Redis gives both before the
/// command runs.
const NOT_RUN: [&str; 2] = ["TRYAGAIN", "CLUSTERDOWN"];

/// The Redis type of each lock key, in script order (see
/// [`LockKeys`]): owner, queue, alive, seq, freed.
const KEY_TYPES: [&str; 5] = ["string", "zset", "zset", "string", "string"];

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

#[cfg(test)]
mod tests {
    use fairlock_core::Inspect;
    use fairlock_testkit::RedisServer;

    use super::super::Lane;
    use super::resendable;
    use crate::{Error, LockClient};

    /// The answers fred 10.1 gives a script call that met a slot in
    /// migration are sent again: the router ending (`Routing`), too many
    /// redirections (`Routing`), and a command that used up its write
    /// attempts on `ASK` answers (`Unknown`, which a CI run met: the
    /// call failed in `cluster.rs`'s ASK test instead of being sent again),
    /// and a node's `TRYAGAIN` or `CLUSTERDOWN` answer. Other errors (an
    /// error reply, a timeout) are not.
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
        // Answered in place of running the script: a slot migration with
        // the lock's keys partly moved (as `cluster.rs`'s release test met
        // it), a cluster down.
        assert!(resendable(&from_fred(
            ErrorKind::Unknown,
            "TRYAGAIN Multiple keys request during rehashing of slot"
        )));
        assert!(resendable(&from_fred(
            ErrorKind::Cluster,
            "CLUSTERDOWN The cluster is down"
        )));
        assert!(!resendable(&from_fred(ErrorKind::Unknown, "ERR something")));
        assert!(!resendable(&from_fred(
            ErrorKind::Timeout,
            "Request timed out."
        )));
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
        // Lifted by hand once the window is seen full.
        server
            .cmd_ok(&["CLIENT", "PAUSE", "30000", "WRITE"])
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
        // The window fills up (bounded): before, a 500 ms sleep under a
        // 3 s pause stood for this, and on a loaded machine the window
        // could be read before it filled, or after the pause had ended.
        crate::test_waits::wait_until("the window full of calls in flight", || {
            state.redis.in_flight(Lane::Waiters, WINDOW) == WINDOW
        })
        .await;
        server.cmd_ok(&["CLIENT", "UNPAUSE"]).expect("unpause");
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
}
