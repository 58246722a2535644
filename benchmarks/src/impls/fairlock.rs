//! fairlock as a user calls it: one `LockClient` per process, `lock(name)`
//! (watchdog-kept lease), `guard.release().await`.

use std::time::Duration;

use fairlock::{ClientConfig, LockClient, LockGuard};

use super::{LockConn, LockImpl, Result};

/// fairlock with default settings.
pub struct FairlockImpl;

/// One fairlock client process: a command connection and one pub/sub
/// connection, whatever the number of contender tasks.
#[derive(Clone)]
pub struct FairlockConn {
    client: LockClient,
}

impl LockImpl for FairlockImpl {
    type Conn = FairlockConn;

    async fn connect(&self, url: &str) -> Result<FairlockConn> {
        Ok(FairlockConn {
            client: LockClient::connect(url).await?,
        })
    }

    fn top_level_commands(&self) -> &'static [&'static str] {
        // Everything else runs inside fairlock's scripts.
        &["subscribe", "ssubscribe", "unsubscribe"]
    }
}

/// fairlock with its script sockets off (`direct_calls(false)`): every
/// call through fred's connections, as before the sockets.
pub struct FairlockFredImpl;

impl LockImpl for FairlockFredImpl {
    type Conn = FairlockConn;

    async fn connect(&self, url: &str) -> Result<FairlockConn> {
        let config = ClientConfig::builder(url).direct_calls(false).build()?;
        Ok(FairlockConn {
            client: LockClient::with_config(config).await?,
        })
    }

    fn top_level_commands(&self) -> &'static [&'static str] {
        FairlockImpl.top_level_commands()
    }
}

/// fairlock with replica acknowledgement: every grant, handoff, release
/// and renewal waits for `WAIT replicas` (behind Sentinel).
pub struct FairlockAcksImpl {
    /// Replicas that must acknowledge.
    pub replicas: u32,
}

impl LockImpl for FairlockAcksImpl {
    type Conn = FairlockConn;

    async fn connect(&self, url: &str) -> Result<FairlockConn> {
        let config = ClientConfig::builder(url)
            .replica_acks(self.replicas, Duration::from_millis(500))
            .build()?;
        Ok(FairlockConn {
            client: LockClient::with_config(config).await?,
        })
    }

    fn top_level_commands(&self) -> &'static [&'static str] {
        &["subscribe", "ssubscribe", "unsubscribe", "wait"]
    }
}

impl LockConn for FairlockConn {
    type Held = LockGuard;

    async fn acquire(&self, name: &str) -> Result<LockGuard> {
        Ok(self.client.lock(name).await?)
    }

    async fn release(&self, held: LockGuard) -> Result<()> {
        Ok(held.release().await?)
    }

    fn ticket(held: &LockGuard) -> Option<u64> {
        held.ticket()
    }

    async fn close(&self) {
        self.client.shutdown().await;
    }
}

impl FairlockConn {
    /// The underlying client (for the 10,000-waiter probe).
    pub fn client(&self) -> &LockClient {
        &self.client
    }
}
