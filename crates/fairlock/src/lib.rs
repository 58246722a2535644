//! fairlock: a fair, notified, fenced distributed lock on Redis.
//!
//! * **Fair.** Waiters queue first come, first served, ordered by a ticket
//!   that Redis assigns. A newcomer never overtakes a waiter, not even
//!   through [`LockClient::try_lock`].
//! * **Notified.** A release hands the lock to the next live waiter inside
//!   the same script and wakes it through the waiter's process's one pub/sub
//!   channel; the woken task already owns the lock. Nobody polls.
//! * **Leased and fenced.** Every grant has a lease (kept by a watchdog
//!   unless fixed) and a [`FencingToken`] that increases strictly per lock.
//! * **Beyond one holder.** A fair [`Semaphore`] (at most N holders, each
//!   permit with its own lease) and a fair [`RwLock`] (readers share, a
//!   waiting writer blocks later readers) use the same queue, handoff,
//!   heartbeat and watchdog.
//!
//! ```no_run
//! use std::time::Duration;
//! use fairlock::{LockClient, LockOptions};
//!
//! # async fn demo() -> fairlock::Result<()> {
//! let client = LockClient::connect("redis://127.0.0.1:6379").await?;
//! let guard = client
//!     .lock_with("inventory:sku-42", LockOptions::new().wait_timeout(Duration::from_secs(2)))
//!     .await?;
//! // ... the critical section; pass guard.token() to the resource ...
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! For a lock over N independent primaries instead of one (no FIFO order,
//! timing assumptions stated), see the [`redlock`] module.
//!
//! The protocol itself (keys, scripts, replies) is in the `fairlock-core`
//! crate; its `scripts/` folder reads as the specification.
#![deny(missing_docs)]

mod acquire;
mod admission;
mod client;
mod config;
mod error;
mod grant_connection;
mod grant_stream;
mod grants;
mod guard;
mod handle;
mod heartbeat;
mod held;
mod key_cache;
mod lanes;
mod owner;
mod permit;
mod permit_state;
mod redis;
pub mod redlock;
mod release;
mod resp2;
mod rwlock;
mod semaphore;
mod sharded_grants;
mod state;
mod task;
mod telemetry;
#[cfg(test)]
mod test_waits;
mod waiters;
mod watchdog;

pub use client::{ClientStats, LockClient, MAX_INSPECT_WAITERS};
pub use config::{
    ClientConfig, ClientConfigBuilder, EvictionCheck, Lease, LockOptions, ReplicaAcks, MAX_DURATION,
};
pub use error::{Error, PrimaryFailure, PrimaryFailureKind, RedisError, RedisErrorKind, Result};
pub use fairlock_core::MAX_PERMITS;
pub use fairlock_core::{
    FencedOp, FencedScript, KeyPrefix, LockName, LockState, NameError, ProtocolError, QueuedWaiter,
    Reply, MAX_NAME_BYTES,
};
pub use guard::{FencingToken, LockGuard};
pub use handle::{Held, Lock};
pub use owner::LockOwner;
pub use permit::Permit;
pub use rwlock::RwLock;
pub use semaphore::Semaphore;
pub use telemetry::MetricsLockLabel;
