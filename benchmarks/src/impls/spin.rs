//! The classic spin-poll lock most services write by hand:
//! `SET key token NX PX 30000`; on failure sleep a fixed delay and retry;
//! release with a Lua compare-and-delete so only the holder deletes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::{ClientLike, Expiration, KeysInterface, LuaInterface, Pool, SetOptions, Value};

use super::{fred_pool, LockConn, LockImpl, Result};

/// The lease every acquisition sets, as in the usual recipe.
const LEASE_MS: i64 = 30_000;
/// Connections per simulated client process: a small shared pool, not one
/// connection per task.
const POOL_SIZE: usize = 4;
/// The longest one acquire may poll before it gives up (bounds the loop;
/// the harness stops waiting long before).
const MAX_WAIT: Duration = Duration::from_secs(120);

const COMPARE_AND_DELETE: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
"#;

/// The spin-poll lock with a fixed retry delay.
pub struct SpinImpl {
    retry: Duration,
}

impl SpinImpl {
    /// A spin-poll lock that sleeps `retry` between attempts.
    pub fn new(retry: Duration) -> Self {
        Self { retry }
    }
}

/// One client process: a fred pool shared by its tasks.
#[derive(Clone)]
pub struct SpinConn {
    pool: Pool,
    retry: Duration,
    release_sha: Arc<str>,
}

/// A held spin lock: the key and this holder's random token.
pub struct SpinHeld {
    key: String,
    token: String,
}

impl LockImpl for SpinImpl {
    type Conn = SpinConn;

    async fn connect(&self, url: &str) -> Result<SpinConn> {
        let pool = fred_pool(url, POOL_SIZE).await?;
        let sha: String = pool.next().script_load(COMPARE_AND_DELETE).await?;
        Ok(SpinConn {
            pool,
            retry: self.retry,
            release_sha: sha.into(),
        })
    }

    fn top_level_commands(&self) -> &'static [&'static str] {
        &["set"]
    }
}

impl LockConn for SpinConn {
    type Held = SpinHeld;

    async fn acquire(&self, name: &str) -> Result<SpinHeld> {
        let key = format!("spin:{name}");
        let token = uuid::Uuid::new_v4().simple().to_string();
        let started = Instant::now();
        loop {
            let reply: Option<String> = self
                .pool
                .set(
                    key.as_str(),
                    token.as_str(),
                    Some(Expiration::PX(LEASE_MS)),
                    Some(SetOptions::NX),
                    false,
                )
                .await?;
            if reply.is_some() {
                return Ok(SpinHeld { key, token });
            }
            if started.elapsed() >= MAX_WAIT {
                return Err(format!("spin lock {name}: not acquired within {MAX_WAIT:?}").into());
            }
            tokio::time::sleep(self.retry).await;
        }
    }

    async fn release(&self, held: SpinHeld) -> Result<()> {
        let client = self.pool.next();
        let keys = vec![held.key.clone()];
        let args = vec![held.token.clone()];
        let deleted: i64 = match client
            .evalsha::<Value, _, _, _>(self.release_sha.as_ref(), keys.clone(), args.clone())
            .await
        {
            // Not loaded on the node serving the key (a cluster node other
            // than the one `connect` loaded it on, or a restarted server):
            // EVAL sends the text, which also caches it there. A reload
            // with SCRIPT LOAD could land on another node of a cluster.
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                client.eval(COMPARE_AND_DELETE, keys, args).await?
            }
            other => other?.convert()?,
        };
        if deleted == 1 {
            Ok(())
        } else {
            Err(format!("spin lock {}: released after the lease ran out", held.key).into())
        }
    }

    async fn close(&self) {
        let _ = tokio::time::timeout(super::COMMAND_TIMEOUT, self.pool.quit()).await;
    }
}
