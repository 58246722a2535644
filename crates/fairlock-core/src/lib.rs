//! The fairlock protocol, without any network I/O.
//!
//! fairlock keeps each lock in five Redis keys that share one cluster hash
//! tag (see [`LockKeys`]) and changes them only through the Lua scripts in
//! this crate's `scripts/` folder, one file per operation, each opening with
//! a header that lists its KEYS, its ARGV and its replies. This crate holds:
//!
//! * the scripts themselves ([`Script`]), with their SHA1 for `EVALSHA`;
//! * a Rust type per script call (e.g. [`Acquire`], [`Release`]) whose fields
//!   mirror the script's ARGV and whose `decode` turns the raw reply into a
//!   typed answer;
//! * the key layout and the rules for valid lock names ([`LockName`],
//!   [`KeyPrefix`]).
//!
//! The async client in the `fairlock` crate runs these calls over a Redis
//! connection; anything that can be checked without Redis is checked here.
//!
//! ```
//! use fairlock_core::{
//!     Acquire, AcquireMode, AcquireReply, KeyPrefix, LockKeys, LockName, OwnerId, Purged, Reply,
//!     ScriptCall, Timings,
//! };
//!
//! let keys = LockKeys::new(&KeyPrefix::default(), &LockName::new("orders:42")?);
//! assert_eq!(keys.owner(), "fairlock:{orders:42}:owner");
//!
//! let owner_id = OwnerId::new("0123456789abcdef0123456789abcdef", "00000000000000ff", 30_000);
//! let call = Acquire {
//!     owner_id: owner_id.as_str(),
//!     mode: AcquireMode::Wait,
//!     timings: &Timings::default(),
//!     channel_prefix: "fairlock:notify:",
//!     rejoin: None,
//! };
//! assert_eq!(call.args()[0], owner_id.as_str());
//! let granted = Acquire::decode(Reply::Array(vec![Reply::Int(1), Reply::Int(7)]))?;
//! assert_eq!(
//!     granted,
//!     AcquireReply::Granted { token: 7, purged: Purged::default() }
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod acl;
mod calls;
mod fenced;
mod keys;
mod owner_id;
mod permit_calls;
mod permit_keys;
mod redlock;
mod reply;
mod script;
mod timings;

pub use acl::{PublishCheck, PublishCommand, PUBLISH_CHECK};
pub use calls::*;
pub use fenced::{decode_fenced, FencedOp, FencedReply, FencedScript, FencedWrite};
pub use keys::{
    key_slot, KeyPrefix, LockKeys, LockName, NameError, MAX_NAME_BYTES, MAX_PREFIX_BYTES,
};
pub use owner_id::{OwnerId, MAX_OWNER_ID_BYTES};
pub use permit_calls::{
    InvalidPermitRequest, PermitAcquire, PermitCancel, PermitHeartbeat, PermitHeartbeatReply,
    PermitOwnerId, PermitRelease, PermitReleaseReply, PermitRenewBatch, PermitRenewItem,
    PermitRequest, MAX_PERMITS,
};
pub use permit_keys::PermitFamily;
pub use redlock::{
    RedLockKeys, RedlockAcquire, RedlockFence, RedlockRelease, RedlockRenew, Vote, REDLOCK_ACQUIRE,
    REDLOCK_FENCE, REDLOCK_RELEASE, REDLOCK_RENEW, REDLOCK_SCRIPTS,
};
pub use reply::{ProtocolError, Reply};
pub use script::{Script, ScriptSource, ALL_SCRIPTS, PERMIT_SCRIPTS};
pub use timings::{InvalidTimings, Timings, MAX_TIMING_MS};
