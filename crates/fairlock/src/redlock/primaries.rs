//! The N independent primaries: one command connection and one subscriber
//! connection to each, and the one way RedLock calls them.
//!
//! Every call to a primary goes through [`call`], which bounds it
//! by the call timeout and turns any failure into a [`PrimaryFailure`]: for
//! RedLock a primary that fails is simply one vote fewer, never an error of
//! the whole operation. A primary whose connection is known to be down is
//! counted as failed at once instead of waiting out the timeout, so a dead
//! minority does not slow every attempt down.
//!
//! A primary counts only once the server behind it is known: a connection
//! is opened ([`Primary::open`]), the server's `run_id` is read, and only
//! then is the connection installed. Two URLs can name one server (a host
//! name and its address, two db numbers), and that server would count
//! twice towards a majority; the caller compares the `run_id`s first
//! ([`Primaries::same_server_as`]).

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fairlock_core::{Reply, ScriptCall, ScriptSource};
use tokio::task::JoinSet;

use crate::config::ClientConfig;
use crate::error::{Error, PrimaryFailure, PrimaryFailureKind};
use crate::redis::{redact, Lane, PubSub, RedisConnection};

use super::config::RedLockConfig;

/// One primary: its place in the list, its URL, and its connections once
/// they exist (set once: a primary unreachable at start is connected later
/// by the reconnect task, after which fred keeps it connected).
pub(crate) struct Primary {
    pub(crate) index: usize,
    url: String,
    redacted: String,
    connection: OnceLock<Arc<RedisConnection>>,
    /// Set when this primary, unreachable at start, turned out when it
    /// first answered to be the same server as another primary (its index
    /// and redacted URL): it is never connected nor counted.
    same_as: OnceLock<(usize, String)>,
}

/// A connection opened to a primary, not counted yet, and the `run_id` of
/// the server that answered on it.
pub(crate) struct Opened {
    pub(crate) connection: RedisConnection,
    pub(crate) run_id: String,
}

/// Reads the server's `run_id` (random per server process) from `INFO
/// server`: what tells two URLs of one server apart from two servers.
const RUN_ID: ScriptSource<'static> = ScriptSource {
    name: "redlock server identity",
    source:
        "local info = redis.call('INFO', 'server')\nreturn string.match(info, 'run_id:(%x+)') or ''",
    // The SHA1 of `source` (`printf '%s' "$source" | sha1sum`); a wrong one
    // fails every RedLock connect with a missing-script error.
    sha1: "40ace9a445e4c509c9ff327b85be0158d4ea5737",
};

impl Primary {
    /// The connections, if established.
    pub(crate) fn connection(&self) -> Option<&Arc<RedisConnection>> {
        self.connection.get()
    }

    /// A failure of this primary.
    pub(crate) fn failure(&self, kind: PrimaryFailureKind) -> PrimaryFailure {
        PrimaryFailure {
            index: self.index,
            url: self.redacted.clone(),
            kind,
        }
    }

    /// The URL, its password redacted.
    pub(crate) fn redacted_url(&self) -> &str {
        &self.redacted
    }

    /// Whether this primary turned out to be another one's server, so it
    /// is not connected again.
    pub(crate) fn is_refused(&self) -> bool {
        self.same_as.get().is_some()
    }

    /// Opens a connection, within the connect timeout, and asks the server
    /// for its `run_id` (within the call timeout); nothing is counted until
    /// [`Primary::install`].
    pub(crate) async fn open(&self, config: &RedLockConfig) -> Result<Opened, PrimaryFailure> {
        let mut client_config = ClientConfig::new(self.url.clone());
        client_config.connect_timeout = config.connect_timeout;
        client_config.command_timeout = config.call_timeout;
        let connection = RedisConnection::connect(&client_config, PubSub::Fred)
            .await
            .map_err(|error| self.failure(classify(error)))?;
        match self.run_id_on(&connection).await {
            Ok(run_id) => Ok(Opened { connection, run_id }),
            Err(failure) => {
                connection.quit().await;
                Err(failure)
            }
        }
    }

    /// Makes `connection` this primary's: from now on it votes.
    pub(crate) async fn install(&self, connection: RedisConnection) {
        if let Err(extra) = self.connection.set(Arc::new(connection)) {
            // Lost a race with another connect: keep the first.
            extra.quit().await;
        }
    }

    /// Refuses `opened` for good: this primary is the same server as
    /// `other`.
    pub(crate) async fn refuse(&self, other: &Primary, opened: Opened) {
        let _ = self.same_as.set((other.index, other.redacted.clone()));
        opened.connection.quit().await;
    }

    /// The `run_id` of the server on the installed connection now.
    pub(crate) async fn run_id(&self) -> Result<String, PrimaryFailure> {
        let Some(connection) = self.connection() else {
            return Err(self.failure(PrimaryFailureKind::Disconnected));
        };
        self.run_id_on(connection).await
    }

    async fn run_id_on(&self, connection: &RedisConnection) -> Result<String, PrimaryFailure> {
        let reply = connection
            .eval(Lane::Waiters, RUN_ID, &[], Vec::new())
            .await
            .map_err(|error| self.failure(classify(error)))?;
        match reply {
            Reply::Str(run_id) if !run_id.is_empty() => Ok(run_id),
            other => Err(self.failure(PrimaryFailureKind::Failed(format!(
                "INFO server reported no run_id ({other:?}), so this server cannot be told apart from the other primaries; it is not counted"
            )))),
        }
    }
}

/// All primaries, in configured order.
pub(crate) struct Primaries {
    list: Vec<Arc<Primary>>,
    call_timeout: Duration,
}

impl Primaries {
    /// The primaries of `config`, none connected yet.
    pub(crate) fn new(config: &RedLockConfig) -> Self {
        let list = config
            .urls
            .iter()
            .enumerate()
            .map(|(index, url)| {
                Arc::new(Primary {
                    index,
                    url: url.clone(),
                    redacted: redact(url),
                    connection: OnceLock::new(),
                    same_as: OnceLock::new(),
                })
            })
            .collect();
        Self {
            list,
            call_timeout: config.call_timeout,
        }
    }

    /// Every primary.
    pub(crate) fn all(&self) -> &[Arc<Primary>] {
        &self.list
    }

    /// How many primaries there are.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// The first other connected primary whose server answers with
    /// `run_id` now (each asked at once, within the call timeout; one that
    /// does not answer is not compared).
    pub(crate) async fn same_server_as(&self, index: usize, run_id: &str) -> Option<usize> {
        let others = self
            .list
            .iter()
            .filter(|p| p.index != index && p.connection().is_some())
            .map(|p| p.index);
        self.on(others, |primary| async move { primary.run_id().await })
            .await
            .into_iter()
            .find_map(|(other, answer)| (answer.ok()? == run_id).then_some(other))
    }

    /// Runs `job` on every primary at once and collects each answer, in
    /// configured order. Each job is bounded by the call timeout, so this
    /// returns within about that long whatever the primaries do.
    pub(crate) async fn on_all<T, F, Fut>(&self, job: F) -> Vec<(usize, Result<T, PrimaryFailure>)>
    where
        T: Send + 'static,
        F: Fn(Arc<Primary>) -> Fut,
        Fut: Future<Output = Result<T, PrimaryFailure>> + Send + 'static,
    {
        self.on(self.list.iter().map(|p| p.index), job).await
    }

    /// As [`Primaries::on_all`], on the primaries at `indexes` only.
    pub(crate) async fn on<T, F, Fut>(
        &self,
        indexes: impl IntoIterator<Item = usize>,
        job: F,
    ) -> Vec<(usize, Result<T, PrimaryFailure>)>
    where
        T: Send + 'static,
        F: Fn(Arc<Primary>) -> Fut,
        Fut: Future<Output = Result<T, PrimaryFailure>> + Send + 'static,
    {
        let mut tasks = JoinSet::new();
        let mut started = Vec::new();
        for index in indexes {
            let Some(primary) = self.list.get(index) else {
                continue;
            };
            let timeout = self.call_timeout;
            let failure = primary.failure(PrimaryFailureKind::Timeout);
            let job = job(Arc::clone(primary));
            started.push(index);
            tasks.spawn(async move {
                // The backstop over the connection's own timeout (which
                // allows a script reload after NOSCRIPT): no job outlives
                // twice the call timeout.
                let answer = match tokio::time::timeout(timeout * 2, job).await {
                    Ok(answer) => answer,
                    Err(_) => Err(failure),
                };
                (index, answer)
            });
        }
        let mut answers = Vec::with_capacity(started.len());
        while let Some(joined) = tasks.join_next().await {
            if let Ok(answer) = joined {
                answers.push(answer);
            }
        }
        // A job that panicked (a bug) or was cancelled (the runtime is
        // shutting down) counts as a failed primary.
        for index in started {
            if !answers.iter().any(|(i, _)| *i == index) {
                if let Some(primary) = self.list.get(index) {
                    answers.push((
                        index,
                        Err(primary.failure(PrimaryFailureKind::Failed(
                            "the call's task was cancelled or panicked".to_owned(),
                        ))),
                    ));
                }
            }
        }
        answers.sort_by_key(|(index, _)| *index);
        answers
    }
}

/// Runs one RedLock script call on `primary` with `keys`.
pub(crate) async fn call<C: ScriptCall>(
    primary: &Primary,
    keys: &[&str],
    call: &C,
) -> Result<C::Output, PrimaryFailure> {
    if let Some((other, url)) = primary.same_as.get() {
        return Err(primary.failure(PrimaryFailureKind::Failed(format!(
            "the same server as primary {other} ({url}), found by its run_id: not counted, so that server does not vote twice"
        ))));
    }
    let Some(connection) = primary.connection() else {
        return Err(primary.failure(PrimaryFailureKind::Disconnected));
    };
    if !connection.is_connected() {
        return Err(primary.failure(PrimaryFailureKind::Disconnected));
    }
    let args = call.args().into_iter().map(String::into_bytes).collect();
    let reply = connection
        .eval(Lane::Waiters, C::SCRIPT.as_source(), keys, args)
        .await
        .map_err(|error| primary.failure(classify(error)))?;
    C::decode(reply).map_err(|error| primary.failure(PrimaryFailureKind::Failed(error.to_string())))
}

/// A vote from a primary that started too recently is a failure of it.
pub(crate) fn restarted_recently(uptime_ms: u64) -> PrimaryFailureKind {
    PrimaryFailureKind::RestartedRecently {
        uptime: Duration::from_millis(uptime_ms),
    }
}

fn classify(error: Error) -> PrimaryFailureKind {
    match error {
        Error::Timeout { .. } => PrimaryFailureKind::Timeout,
        Error::Unreachable { .. } | Error::Closed => PrimaryFailureKind::Disconnected,
        other => PrimaryFailureKind::Failed(other.to_string()),
    }
}
