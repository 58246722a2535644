//! The protected resource: a counter per lock, on a Redis server the
//! faults never touch, written only through fairlock's fence.
//!
//! The critical section is a non-atomic read-modify-write on purpose: a
//! fenced read, a pause, a fenced write of the value read + 1. Only mutual
//! exclusion plus fencing keeps it from losing updates. The write also
//! appends `(token, holder, read, written)` to the resource's log list in
//! the same script, so the checker can replay the order Redis applied the
//! writes in.
//!
//! This is the one module that calls the fenced-write API; if that API
//! changes (e.g. it starts taking the holder's identity as well as the
//! token), only [`FencedCounter::read`] and [`FencedCounter::write`] change.

use fairlock::{
    ClientConfig, Error, FencedOp, FencedScript, LockClient, LockGuard, ProtocolError, Reply,
};

use crate::events::AppliedWrite;

/// The keys of resource `index`, all under one hash tag: the fence key
/// (the newest token that used the resource), the counter and the log.
pub struct ResourceKeys {
    /// The fence key.
    pub fence: String,
    /// The counter.
    pub counter: String,
    /// The log list of applied writes.
    pub log: String,
}

impl ResourceKeys {
    /// The keys of resource `index`.
    pub fn of(index: usize) -> Self {
        Self {
            fence: format!("{{chaos:res:{index}}}:fence"),
            counter: format!("{{chaos:res:{index}}}:counter"),
            log: format!("{{chaos:res:{index}}}:log"),
        }
    }
}

/// Sets the counter and appends the log entry, both or neither.
const WRITE_AND_LOG: &str =
    "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('RPUSH', KEYS[2], ARGV[2])";

/// A client for the resource server that runs the fenced read and write.
pub struct FencedCounter {
    client: LockClient,
    write_and_log: FencedScript,
}

impl FencedCounter {
    /// Connects to the resource server.
    pub async fn connect(config: ClientConfig) -> Result<Self, Error> {
        Ok(Self {
            client: LockClient::with_config(config).await?,
            write_and_log: FencedScript::new(WRITE_AND_LOG),
        })
    }

    /// The fenced read of counter `index` (0 when it does not exist yet).
    pub async fn read(&self, index: usize, guard: &LockGuard) -> Result<i64, Error> {
        let keys = ResourceKeys::of(index);
        let reply = self
            .client
            .fenced_write(&keys.fence, &keys.counter, guard.token(), FencedOp::Get)
            .await?;
        let not_a_count = |read: &dyn std::fmt::Debug| {
            Error::Protocol(ProtocolError {
                script: "fenced write",
                detail: format!("counter {} holds {read:?}, not a number", keys.counter),
            })
        };
        match reply {
            Reply::Nil => Ok(0),
            Reply::Str(s) => s.parse().map_err(|_| not_a_count(&s)),
            Reply::Int(n) => Ok(n),
            other => Err(not_a_count(&other)),
        }
    }

    /// The fenced write of `read + 1` to counter `index`, logged in the
    /// same script. Returns the value written.
    pub async fn write(&self, index: usize, guard: &LockGuard, read: i64) -> Result<i64, Error> {
        let keys = ResourceKeys::of(index);
        let entry = AppliedWrite {
            token: guard.token().value(),
            holder: guard.owner_id().to_owned(),
            read,
            written: read + 1,
            at_us: crate::events::now_us(),
        };
        // A struct of numbers and a string always serializes.
        let entry = serde_json::to_string(&entry).unwrap_or_default();
        let written = (read + 1).to_string();
        self.client
            .fenced_eval(
                &self.write_and_log,
                &keys.fence,
                &[&keys.counter, &keys.log],
                guard.token(),
                &[&written, &entry],
            )
            .await?;
        Ok(read + 1)
    }

    /// Closes the connections.
    pub async fn shutdown(&self) {
        self.client.shutdown().await;
    }
}
