//! The locks under test, behind one small trait pair.
//!
//! A [`LockImpl`] is a lock implementation with its settings; [`LockImpl::connect`]
//! gives one simulated client process ([`LockConn`]), which the harness
//! clones into every contender task of that process. The harness only ever
//! calls `acquire` (wait until held) and `release`, so each implementation is
//! measured exactly as a user would call it.
//!
//! Every implementation declares which Redis commands it sends itself
//! ([`LockImpl::top_level_commands`]). Redis 7 counts the commands a Lua
//! script runs in `INFO commandstats` as well, under their own names; the
//! report splits "top-level calls" (round trips) from "total" (everything
//! Redis executed) with that list.

pub mod fairlock;
pub mod rslock;
pub mod spin;

use std::future::Future;
use std::time::Duration;

use fred::prelude::{Builder, ClientLike, Config, Pool};

/// The benchmark's error type: anything printable that can cross tasks.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;
/// Result with [`BenchError`].
pub type Result<T> = std::result::Result<T, BenchError>;

/// Connect timeout and per-command timeout of every fred connection the
/// harness opens: no Redis call can hang a run.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// A lock implementation with its settings.
pub trait LockImpl: Send + Sync + 'static {
    /// One simulated client process.
    type Conn: LockConn;

    /// Opens one client process's connections.
    fn connect(&self, url: &str) -> impl Future<Output = Result<Self::Conn>> + Send;

    /// Commands this implementation sends itself, besides script calls
    /// (`eval*`, `evalsha*`, `fcall*`, `script|*`, always top-level).
    fn top_level_commands(&self) -> &'static [&'static str];
}

/// One simulated client process, cloned into its contender tasks.
pub trait LockConn: Clone + Send + Sync + 'static {
    /// Proof of holding the lock, given back to `release`.
    type Held: Send + 'static;

    /// Waits until lock `name` is held.
    fn acquire(&self, name: &str) -> impl Future<Output = Result<Self::Held>> + Send;

    /// Releases a held lock.
    fn release(&self, held: Self::Held) -> impl Future<Output = Result<()>> + Send;

    /// The server-assigned queue ticket of a grant, for locks that have one.
    fn ticket(held: &Self::Held) -> Option<u64> {
        let _ = held;
        None
    }

    /// Closes the process's connections.
    fn close(&self) -> impl Future<Output = ()> + Send;
}

/// The implementations compared, with their settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Implementation {
    /// `fairlock::LockClient::lock`, watchdog lease.
    Fairlock,
    /// fairlock with `direct_calls(false)`: every call through fred, none
    /// on the script sockets (for an A/B in one run; only on request).
    FairlockFred,
    /// `SET NX PX 30000`, sleep 10 ms on failure.
    Spin10,
    /// `SET NX PX 30000`, sleep 100 ms on failure.
    Spin100,
    /// rslock with its defaults (3 tries, random 0-200 ms between tries).
    Rslock,
    /// rslock with a 10 ms retry delay (3 tries, random 0-10 ms).
    Rslock10,
}

impl Implementation {
    /// Every implementation, in report order.
    pub const ALL: [Implementation; 5] = [
        Implementation::Fairlock,
        Implementation::Spin10,
        Implementation::Spin100,
        Implementation::Rslock,
        Implementation::Rslock10,
    ];

    /// Implementations run only when named with `--impl`.
    pub const ON_REQUEST: [Implementation; 1] = [Implementation::FairlockFred];

    /// The name used in reports and on the command line.
    pub fn label(self) -> &'static str {
        match self {
            Implementation::Fairlock => "fairlock",
            Implementation::FairlockFred => "fairlock-fred",
            Implementation::Spin10 => "spin-10ms",
            Implementation::Spin100 => "spin-100ms",
            Implementation::Rslock => "rslock",
            Implementation::Rslock10 => "rslock-10ms",
        }
    }

    /// Parses a [`Implementation::label`].
    pub fn from_label(label: &str) -> Option<Implementation> {
        Implementation::ALL
            .into_iter()
            .chain(Implementation::ON_REQUEST)
            .find(|imp| imp.label() == label)
    }
}

/// Runs `$body` with `$imp` bound to the [`LockImpl`] value of an
/// [`Implementation`]: the harness is generic, this is the one dispatch.
#[macro_export]
macro_rules! with_impl {
    ($which:expr, $imp:ident => $body:expr) => {
        match $which {
            $crate::impls::Implementation::Fairlock => {
                let $imp = $crate::impls::fairlock::FairlockImpl;
                $body
            }
            $crate::impls::Implementation::FairlockFred => {
                let $imp = $crate::impls::fairlock::FairlockFredImpl;
                $body
            }
            $crate::impls::Implementation::Spin10 => {
                let $imp = $crate::impls::spin::SpinImpl::new(std::time::Duration::from_millis(10));
                $body
            }
            $crate::impls::Implementation::Spin100 => {
                let $imp =
                    $crate::impls::spin::SpinImpl::new(std::time::Duration::from_millis(100));
                $body
            }
            $crate::impls::Implementation::Rslock => {
                let $imp = $crate::impls::rslock::RslockImpl::new(None);
                $body
            }
            $crate::impls::Implementation::Rslock10 => {
                let $imp = $crate::impls::rslock::RslockImpl::new(Some(
                    std::time::Duration::from_millis(10),
                ));
                $body
            }
        }
    };
}

/// A fred builder for `url` with bounded connect and command timeouts.
fn fred_builder(url: &str) -> Result<Builder> {
    let mut builder = Builder::from_config(Config::from_url(url)?);
    builder
        .with_connection_config(|c| {
            c.connection_timeout = COMMAND_TIMEOUT;
            c.internal_command_timeout = COMMAND_TIMEOUT;
        })
        .with_performance_config(|p| p.default_command_timeout = COMMAND_TIMEOUT);
    Ok(builder)
}

/// A fred connection pool of `size` connections to `url`, connected, with
/// bounded connect and command timeouts.
pub async fn fred_pool(url: &str, size: usize) -> Result<Pool> {
    let pool = fred_builder(url)?.build_pool(size)?;
    tokio::time::timeout(COMMAND_TIMEOUT, pool.init())
        .await
        .map_err(|_| format!("no connection to {url} within {COMMAND_TIMEOUT:?}"))??;
    Ok(pool)
}

/// A single fred client connection to `url`, set up like fairlock's command
/// connection (for the PING round trip).
pub async fn fred_client(url: &str) -> Result<fred::prelude::Client> {
    let client = fred_builder(url)?.build()?;
    tokio::time::timeout(COMMAND_TIMEOUT, client.init())
        .await
        .map_err(|_| format!("no connection to {url} within {COMMAND_TIMEOUT:?}"))??;
    Ok(client)
}
