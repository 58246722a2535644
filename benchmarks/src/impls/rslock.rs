//! rslock (crates.io), a Redlock implementation, on one Redis server as a
//! user sets it up: one `LockManager` per process, `acquire(resource, ttl)`
//! (which retries until it gets the lock), `guard.release().await`.
//!
//! rslock brings its own Redis client (redis-rs, one multiplexed
//! connection per `LockManager`). Its defaults: 3 tries per `lock` call with
//! a random 0-200 ms pause between tries; `acquire` calls `lock` again at
//! once after 3 failed tries. Every failed try also runs its unlock script.

use std::time::Duration;

use rslock::{LockGuard, LockManager};

use super::{LockConn, LockImpl, Result};

/// The lease (TTL) of every acquisition, as for the spin lock.
const TTL: Duration = Duration::from_secs(30);
/// rslock's default try count, kept when only the delay is changed.
const RETRY_COUNT: u32 = 3;

/// rslock with its default retry settings, or with a given retry delay.
pub struct RslockImpl {
    retry_delay: Option<Duration>,
}

impl RslockImpl {
    /// `None`: rslock's defaults; `Some(d)`: 3 tries, random 0..d between.
    pub fn new(retry_delay: Option<Duration>) -> Self {
        Self { retry_delay }
    }
}

/// One client process: one `LockManager`.
#[derive(Clone)]
pub struct RslockConn {
    manager: LockManager,
}

impl LockImpl for RslockImpl {
    type Conn = RslockConn;

    async fn connect(&self, url: &str) -> Result<RslockConn> {
        let client = redis::Client::open(url)?;
        let mut manager = LockManager::from_clients(vec![client]);
        if let Some(delay) = self.retry_delay {
            manager.set_retry(RETRY_COUNT, delay);
        }
        // rslock connects lazily: open the connection now, outside the
        // measured window.
        tokio::time::timeout(
            super::COMMAND_TIMEOUT,
            manager.query_redis_for_key_value(b"rslock:connect-probe"),
        )
        .await
        .map_err(|_| format!("rslock: no connection to {url}"))??;
        Ok(RslockConn { manager })
    }

    fn top_level_commands(&self) -> &'static [&'static str] {
        &["set"]
    }
}

impl LockConn for RslockConn {
    type Held = LockGuard;

    async fn acquire(&self, name: &str) -> Result<LockGuard> {
        let resource = format!("rslock:{name}");
        Ok(self.manager.acquire(resource.as_bytes(), TTL).await?)
    }

    async fn release(&self, held: LockGuard) -> Result<()> {
        // rslock's release reports nothing; a lost lease would show up as a
        // counter violation.
        held.release().await;
        Ok(())
    }

    async fn close(&self) {}
}
