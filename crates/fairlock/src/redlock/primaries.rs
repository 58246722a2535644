//! The N independent primaries: one command connection and one subscriber
//! connection to each, and the one way RedLock calls them.
//!
//! Every call to a primary goes through [`call`], which bounds it
//! by the call timeout and turns any failure into a [`PrimaryFailure`]: for
//! RedLock a primary that fails is simply one vote fewer, never an error of
//! the whole operation. A primary whose connection is known to be down is
//! counted as failed at once instead of waiting out the timeout, so a dead
//! minority does not slow every attempt down.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fairlock_core::ScriptCall;
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
}

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

    /// Tries to connect, within the connect timeout (done at once if
    /// already connected).
    pub(crate) async fn connect(&self, config: &RedLockConfig) -> Result<(), PrimaryFailure> {
        if self.connection.get().is_some() {
            return Ok(());
        }
        let mut client_config = ClientConfig::new(self.url.clone());
        client_config.connect_timeout = config.connect_timeout;
        client_config.command_timeout = config.call_timeout;
        match RedisConnection::connect(&client_config, PubSub::Fred).await {
            Ok(connection) => {
                if let Err(extra) = self.connection.set(Arc::new(connection)) {
                    // Lost a race with another connect: keep the first.
                    extra.quit().await;
                }
                Ok(())
            }
            Err(error) => Err(self.failure(classify(error))),
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
