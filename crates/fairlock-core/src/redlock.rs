//! The RedLock scripts and their calls: one primary's part of a lock held
//! over N independent primaries.
//!
//! Each primary keeps two keys per lock, named like the fair lock's
//! (`<prefix>{<name>}:owner` and `:seq`, see [`LockKeys`]) under the RedLock
//! key prefix, and a release channel `<prefix>{<name>}:released`. The
//! client runs [`RedlockAcquire`] on every primary and holds the lock when
//! a majority voted for it in time; the quorum arithmetic lives in the
//! client, each script only answers for its own primary.

use crate::keys::{KeyPrefix, LockKeys, LockName};
use crate::reply::{Fields, ProtocolError, Reply};
use crate::script::{assembled, Script};
use crate::ScriptCall;

/// `redlock_acquire.lua`: one primary's vote.
pub static REDLOCK_ACQUIRE: Script =
    assembled!("redlock_acquire": "includes/redlock_common.lua", "redlock_acquire.lua");
/// `redlock_fence.lua`: raise one primary's fencing counter.
pub static REDLOCK_FENCE: Script =
    assembled!("redlock_fence": "includes/redlock_common.lua", "redlock_fence.lua");
/// `redlock_release.lua`: give back one primary's vote.
pub static REDLOCK_RELEASE: Script =
    assembled!("redlock_release": "includes/redlock_common.lua", "redlock_release.lua");
/// `redlock_renew.lua`: renew one primary's vote.
pub static REDLOCK_RENEW: Script =
    assembled!("redlock_renew": "includes/redlock_common.lua", "redlock_renew.lua");

/// Every RedLock script.
pub static REDLOCK_SCRIPTS: [&Script; 4] = [
    &REDLOCK_ACQUIRE,
    &REDLOCK_FENCE,
    &REDLOCK_RELEASE,
    &REDLOCK_RENEW,
];

/// The keys and the release channel of one lock on every primary.
///
/// ```
/// use fairlock_core::{KeyPrefix, LockName, RedLockKeys};
///
/// let keys = RedLockKeys::new(&KeyPrefix::new("fairlock:redlock:")?, &LockName::new("jobs")?);
/// assert_eq!(keys.owner(), "fairlock:redlock:{jobs}:owner");
/// assert_eq!(keys.seq(), "fairlock:redlock:{jobs}:seq");
/// assert_eq!(keys.channel(), "fairlock:redlock:{jobs}:released");
/// # Ok::<(), fairlock_core::NameError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedLockKeys {
    owner: String,
    seq: String,
    channel: String,
}

impl RedLockKeys {
    /// The keys of lock `name` under `prefix` (the same escaping and hash
    /// tag as [`LockKeys`]).
    pub fn new(prefix: &KeyPrefix, name: &LockName) -> Self {
        let keys = LockKeys::new(prefix, name);
        let base = keys
            .owner()
            .strip_suffix(":owner")
            .unwrap_or(keys.owner())
            .to_owned();
        Self {
            owner: keys.owner().to_owned(),
            seq: keys.seq().to_owned(),
            channel: format!("{base}:released"),
        }
    }

    /// The owner key: the owner id this primary voted for; its TTL is the lease.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The fencing counter of this primary.
    pub fn seq(&self) -> &str {
        &self.seq
    }

    /// The pub/sub channel on which a release is announced.
    pub fn channel(&self) -> &str {
        &self.channel
    }
}

/// `redlock_acquire.lua`; KEYS: owner, seq.
#[derive(Debug, Clone)]
pub struct RedlockAcquire<'a> {
    /// The caller's owner id.
    pub owner_id: &'a str,
    /// The lease asked for, in ms.
    pub lease_ms: u64,
    /// A primary up for less than this does not vote (the delayed-restart
    /// rule), in ms.
    pub min_uptime_ms: u64,
}

/// One primary's answer to [`RedlockAcquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vote {
    /// The primary voted for the caller.
    Granted {
        /// The least token this primary lets the grant take:
        /// max(its counter, its clock in µs).
        floor: u64,
    },
    /// Another owner id holds the key on this primary.
    Held {
        /// Its lease left in ms; negative if the key has no TTL.
        pttl_ms: i64,
        /// The owner id holding it.
        holder: String,
    },
    /// The primary started too recently to vote.
    TooYoung {
        /// Its uptime, in ms (whole seconds).
        uptime_ms: u64,
    },
}

impl ScriptCall for RedlockAcquire<'_> {
    const SCRIPT: &'static Script = &REDLOCK_ACQUIRE;
    type Output = Vote;

    fn args(&self) -> Vec<String> {
        vec![
            self.owner_id.to_owned(),
            self.lease_ms.to_string(),
            self.min_uptime_ms.to_string(),
        ]
    }

    fn decode(reply: Reply) -> Result<Vote, ProtocolError> {
        let mut f = Fields::new(REDLOCK_ACQUIRE.name(), reply)?;
        match f.int()? {
            1 => Ok(Vote::Granted { floor: f.uint()? }),
            2 => Ok(Vote::Held {
                pttl_ms: f.int()?,
                holder: f.string()?,
            }),
            3 => Ok(Vote::TooYoung {
                uptime_ms: f.uint()?,
            }),
            other => Err(f.unknown_status(other)),
        }
    }
}

/// `redlock_fence.lua`; KEYS: seq. Replies the counter after the call.
#[derive(Debug, Clone)]
pub struct RedlockFence {
    /// The grant's token.
    pub token: u64,
    /// TTL of the counter, in ms.
    pub idle_ms: u64,
}

impl ScriptCall for RedlockFence {
    const SCRIPT: &'static Script = &REDLOCK_FENCE;
    type Output = u64;

    fn args(&self) -> Vec<String> {
        vec![self.token.to_string(), self.idle_ms.to_string()]
    }

    fn decode(reply: Reply) -> Result<u64, ProtocolError> {
        single_uint(REDLOCK_FENCE.name(), reply)
    }
}

/// `redlock_release.lua`; KEYS: owner. Replies whether the key was the
/// owner id's (and is now deleted).
#[derive(Debug, Clone)]
pub struct RedlockRelease<'a> {
    /// The releasing owner id.
    pub owner_id: &'a str,
    /// The release channel, or `""` to tell nobody.
    pub channel: &'a str,
}

impl ScriptCall for RedlockRelease<'_> {
    const SCRIPT: &'static Script = &REDLOCK_RELEASE;
    type Output = bool;

    fn args(&self) -> Vec<String> {
        vec![self.owner_id.to_owned(), self.channel.to_owned()]
    }

    fn decode(reply: Reply) -> Result<bool, ProtocolError> {
        Ok(single_uint(REDLOCK_RELEASE.name(), reply)? == 1)
    }
}

/// `redlock_renew.lua`; KEYS: owner. Replies whether the key is now the
/// owner id's with the new lease (taken again if it was missing); `false` if
/// another owner id holds it.
#[derive(Debug, Clone)]
pub struct RedlockRenew<'a> {
    /// The holder's owner id.
    pub owner_id: &'a str,
    /// The new lease, in ms.
    pub lease_ms: u64,
}

impl ScriptCall for RedlockRenew<'_> {
    const SCRIPT: &'static Script = &REDLOCK_RENEW;
    type Output = bool;

    fn args(&self) -> Vec<String> {
        vec![self.owner_id.to_owned(), self.lease_ms.to_string()]
    }

    fn decode(reply: Reply) -> Result<bool, ProtocolError> {
        Ok(single_uint(REDLOCK_RENEW.name(), reply)? == 1)
    }
}

fn single_uint(script: &'static str, reply: Reply) -> Result<u64, ProtocolError> {
    let value = match reply {
        Reply::Int(n) => u64::try_from(n).ok(),
        Reply::Str(ref text) => text.parse().ok(),
        _ => None,
    };
    value.ok_or_else(|| ProtocolError {
        script,
        detail: format!("expected a non-negative integer, got {reply:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_have_headers_and_replies_decode() {
        for script in REDLOCK_SCRIPTS {
            assert!(script
                .source()
                .contains(&format!("-- {}.lua:", script.name())));
        }
        assert_eq!(
            RedlockAcquire::decode(Reply::Array(vec![Reply::Int(1), Reply::Str("9".into())])),
            Ok(Vote::Granted { floor: 9 })
        );
        assert_eq!(
            RedlockAcquire::decode(Reply::Array(vec![
                Reply::Int(2),
                Reply::Int(-1),
                Reply::Str("x".into())
            ])),
            Ok(Vote::Held {
                pttl_ms: -1,
                holder: "x".into()
            })
        );
        assert!(RedlockAcquire::decode(Reply::Array(vec![Reply::Int(7)])).is_err());
        assert!(RedlockRelease::decode(Reply::Nil).is_err());
        assert_eq!(RedlockFence::decode(Reply::Str("12".into())), Ok(12));
    }
}
