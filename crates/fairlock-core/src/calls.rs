//! One Rust type per script call. Fields mirror the script's ARGV header;
//! `decode` turns the script's reply into a typed answer.

use crate::reply::{Fields, ProtocolError, Reply};
use crate::script::{Script, ACQUIRE, CANCEL, FORCE_RELEASE, HEARTBEAT, INSPECT, RELEASE, RENEW};

/// A call of one script: which script, its ARGV, and how to read its reply.
///
/// Every lock script takes the four keys of [`crate::LockKeys`] except
/// `renew.lua`, which takes the owner key only; see [`ScriptCall::KEYS`].
pub trait ScriptCall {
    /// The script this call runs.
    const SCRIPT: &'static Script;
    /// How many of the lock's keys, in [`crate::LockKeys`] order, it takes.
    const KEYS: usize = 4;
    /// The typed reply.
    type Output;
    /// ARGV, in the order of the script's header.
    fn args(&self) -> Vec<String>;
    /// Reads the script's reply.
    fn decode(reply: Reply) -> Result<Self::Output, ProtocolError>;
}

/// Protocol timings every process touching a lock should agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long a waiter stays alive in the queue without a heartbeat.
    pub waiter_ttl_ms: u64,
    /// TTL of the queue keys; every enqueue and heartbeat refreshes it.
    pub queue_ttl_ms: u64,
    /// Lease of a lock handed to a waiter, until that waiter confirms it
    /// with its own lease. A dead waiter blocks the lock at most this long.
    pub grant_lease_ms: u64,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            waiter_ttl_ms: 5_000,
            queue_ttl_ms: 60_000,
            grant_lease_ms: 5_000,
        }
    }
}

/// Whether [`Acquire`] may join the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireMode {
    /// Join the queue when the lock is busy.
    Wait,
    /// Never join the queue: `try_lock`.
    Try,
}

/// `acquire.lua`.
#[derive(Debug, Clone)]
pub struct Acquire<'a> {
    /// The caller's member: owner id and client tag.
    pub member: &'a str,
    /// The lease if granted now.
    pub lease_ms: u64,
    /// Wait in the queue or not.
    pub mode: AcquireMode,
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
}

/// What [`Acquire`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// The caller owns the lock.
    Granted {
        /// Fencing token of this grant.
        token: u64,
        /// Dead waiters dropped on the way.
        evicted: u64,
    },
    /// The caller waits in the queue.
    Queued {
        /// The caller's ticket; grants follow ticket order.
        ticket: u64,
        /// Waiters ahead of the caller.
        position: u64,
        /// The holder's remaining lease in ms, or negative if none.
        owner_pttl_ms: i64,
        /// Dead waiters dropped on the way.
        evicted: u64,
    },
    /// The lock is held or someone is queued (try mode only).
    Busy {
        /// The holder's remaining lease in ms, or negative if none.
        owner_pttl_ms: i64,
        /// Dead waiters dropped on the way.
        evicted: u64,
    },
}

impl ScriptCall for Acquire<'_> {
    const SCRIPT: &'static Script = &ACQUIRE;
    type Output = AcquireReply;

    fn args(&self) -> Vec<String> {
        let mode = match self.mode {
            AcquireMode::Wait => "wait",
            AcquireMode::Try => "try",
        };
        vec![
            self.member.to_owned(),
            self.lease_ms.to_string(),
            mode.to_owned(),
            self.timings.waiter_ttl_ms.to_string(),
            self.timings.queue_ttl_ms.to_string(),
            self.timings.grant_lease_ms.to_string(),
            self.channel_prefix.to_owned(),
        ]
    }

    fn decode(reply: Reply) -> Result<AcquireReply, ProtocolError> {
        let mut f = Fields::new(ACQUIRE.name(), reply)?;
        match f.int()? {
            1 => Ok(AcquireReply::Granted {
                token: f.uint()?,
                evicted: f.uint()?,
            }),
            2 => Ok(AcquireReply::Queued {
                ticket: f.uint()?,
                position: f.uint()?,
                owner_pttl_ms: f.int()?,
                evicted: f.uint()?,
            }),
            3 => Ok(AcquireReply::Busy {
                owner_pttl_ms: f.int()?,
                evicted: f.uint()?,
            }),
            other => Err(f.unknown_status(other)),
        }
    }
}

/// `release.lua`.
#[derive(Debug, Clone)]
pub struct Release<'a> {
    /// The releasing owner.
    pub member: &'a str,
    /// Shared protocol timings (the grant lease of the handoff).
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
}

/// What [`Release`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseReply {
    /// The lock was freed (or had been freed by this member already).
    Released {
        /// The waiter that now owns the lock and its fencing token, if any.
        handed_to: Option<(String, u64)>,
        /// Dead waiters dropped on the way.
        evicted: u64,
    },
    /// The caller does not own the lock; nothing changed.
    NotOwner,
}

impl ScriptCall for Release<'_> {
    const SCRIPT: &'static Script = &RELEASE;
    type Output = ReleaseReply;

    fn args(&self) -> Vec<String> {
        vec![
            self.member.to_owned(),
            self.timings.grant_lease_ms.to_string(),
            self.channel_prefix.to_owned(),
        ]
    }

    fn decode(reply: Reply) -> Result<ReleaseReply, ProtocolError> {
        let mut f = Fields::new(RELEASE.name(), reply)?;
        match f.int()? {
            1 => {
                let handed_on = f.int()? == 1;
                let evicted = f.uint()?;
                let handed_to = if handed_on {
                    Some((f.string()?, f.uint()?))
                } else {
                    None
                };
                Ok(ReleaseReply::Released { handed_to, evicted })
            }
            0 => Ok(ReleaseReply::NotOwner),
            other => Err(f.unknown_status(other)),
        }
    }
}

/// `renew.lua`. Takes the owner key only.
#[derive(Debug, Clone)]
pub struct Renew<'a> {
    /// The owner.
    pub member: &'a str,
    /// The new lease, from now.
    pub lease_ms: u64,
}

/// What [`Renew`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewReply {
    /// The lease was set; the owner's fencing token.
    Renewed {
        /// Fencing token of the current grant.
        token: u64,
    },
    /// The lock is gone or owned by someone else: the lease was lost.
    NotOwner,
}

impl ScriptCall for Renew<'_> {
    const SCRIPT: &'static Script = &RENEW;
    const KEYS: usize = 1;
    type Output = RenewReply;

    fn args(&self) -> Vec<String> {
        vec![self.member.to_owned(), self.lease_ms.to_string()]
    }

    fn decode(reply: Reply) -> Result<RenewReply, ProtocolError> {
        let mut f = Fields::new(RENEW.name(), reply)?;
        match f.int()? {
            1 => Ok(RenewReply::Renewed { token: f.uint()? }),
            0 => Ok(RenewReply::NotOwner),
            other => Err(f.unknown_status(other)),
        }
    }
}

/// `heartbeat.lua`: one call for all of a process's waiters on one lock.
#[derive(Debug, Clone)]
pub struct Heartbeat<'a> {
    /// The waiters' members.
    pub members: &'a [String],
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
}

/// Where one waiter stands, as [`Heartbeat`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaiterStatus {
    /// Not in the queue and not the owner: it must enqueue again.
    Missing,
    /// Waiting in the queue; its deadline moved forward.
    Queued,
    /// It owns the lock (perhaps its wake-up message was lost).
    Granted {
        /// Fencing token of the grant.
        token: u64,
    },
}

/// What [`Heartbeat`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatReply {
    /// Dead waiters dropped.
    pub evicted: u64,
    /// The holder's remaining lease in ms, negative when free.
    pub owner_pttl_ms: i64,
    /// One status per member, in the order given.
    pub statuses: Vec<WaiterStatus>,
}

impl ScriptCall for Heartbeat<'_> {
    const SCRIPT: &'static Script = &HEARTBEAT;
    type Output = HeartbeatReply;

    fn args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(4 + self.members.len());
        args.push(self.timings.waiter_ttl_ms.to_string());
        args.push(self.timings.queue_ttl_ms.to_string());
        args.push(self.timings.grant_lease_ms.to_string());
        args.push(self.channel_prefix.to_owned());
        args.extend(self.members.iter().cloned());
        args
    }

    fn decode(reply: Reply) -> Result<HeartbeatReply, ProtocolError> {
        let mut f = Fields::new(HEARTBEAT.name(), reply)?;
        let evicted = f.uint()?;
        let owner_pttl_ms = f.int()?;
        let mut statuses = Vec::with_capacity(f.remaining() / 2);
        while f.remaining() > 0 {
            let status = f.int()?;
            let token = f.uint()?;
            statuses.push(match status {
                0 => WaiterStatus::Missing,
                1 => WaiterStatus::Queued,
                2 => WaiterStatus::Granted { token },
                other => return Err(f.unknown_status(other)),
            });
        }
        Ok(HeartbeatReply {
            evicted,
            owner_pttl_ms,
            statuses,
        })
    }
}

/// `cancel.lua`.
#[derive(Debug, Clone)]
pub struct Cancel<'a> {
    /// The waiter giving up.
    pub member: &'a str,
    /// Shared protocol timings (the grant lease of a handoff).
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
}

/// What [`Cancel`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelReply {
    /// The waiter was still queued and left the queue.
    pub was_queued: bool,
    /// A grant had raced the cancellation; the lock was passed on.
    pub was_owner: bool,
    /// Dead waiters dropped on the way.
    pub evicted: u64,
}

impl ScriptCall for Cancel<'_> {
    const SCRIPT: &'static Script = &CANCEL;
    type Output = CancelReply;

    fn args(&self) -> Vec<String> {
        vec![
            self.member.to_owned(),
            self.timings.grant_lease_ms.to_string(),
            self.channel_prefix.to_owned(),
        ]
    }

    fn decode(reply: Reply) -> Result<CancelReply, ProtocolError> {
        let mut f = Fields::new(CANCEL.name(), reply)?;
        Ok(CancelReply {
            was_queued: f.int()? == 1,
            was_owner: f.int()? == 1,
            evicted: f.uint()?,
        })
    }
}

/// `force_release.lua`: admin only.
#[derive(Debug, Clone)]
pub struct ForceRelease<'a> {
    /// Shared protocol timings (the grant lease of a handoff).
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
}

/// What [`ForceRelease`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForceReleaseReply {
    /// Someone held the lock and was evicted.
    pub had_owner: bool,
    /// A waiter now owns the lock.
    pub handed_on: bool,
    /// Dead waiters dropped on the way.
    pub evicted: u64,
}

impl ScriptCall for ForceRelease<'_> {
    const SCRIPT: &'static Script = &FORCE_RELEASE;
    type Output = ForceReleaseReply;

    fn args(&self) -> Vec<String> {
        vec![
            self.timings.grant_lease_ms.to_string(),
            self.channel_prefix.to_owned(),
        ]
    }

    fn decode(reply: Reply) -> Result<ForceReleaseReply, ProtocolError> {
        let mut f = Fields::new(FORCE_RELEASE.name(), reply)?;
        Ok(ForceReleaseReply {
            had_owner: f.int()? == 1,
            handed_on: f.int()? == 1,
            evicted: f.uint()?,
        })
    }
}

/// `inspect.lua`: a read-only snapshot.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inspect;

/// A snapshot of one lock, from [`Inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockState {
    /// The holder's member, if the lock is held.
    pub owner: Option<String>,
    /// The holder's fencing token (0 when free).
    pub token: u64,
    /// The holder's remaining lease in ms (negative when free).
    pub owner_pttl_ms: i64,
    /// Entries in the queue, live or not yet purged.
    pub queue_len: u64,
    /// The last fencing token ever issued for this name.
    pub last_token: u64,
    /// The last ticket ever issued for this name.
    pub last_ticket: u64,
}

impl ScriptCall for Inspect {
    const SCRIPT: &'static Script = &INSPECT;
    type Output = LockState;

    fn args(&self) -> Vec<String> {
        Vec::new()
    }

    fn decode(reply: Reply) -> Result<LockState, ProtocolError> {
        let mut f = Fields::new(INSPECT.name(), reply)?;
        let owner = f.string()?;
        Ok(LockState {
            owner: (!owner.is_empty()).then_some(owner),
            token: f.uint()?,
            owner_pttl_ms: f.int()?,
            queue_len: f.uint()?,
            last_token: f.uint()?,
            last_ticket: f.uint()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(items: &[i64]) -> Reply {
        Reply::Array(items.iter().map(|&i| Reply::Int(i)).collect())
    }

    #[test]
    fn acquire_replies_decode() {
        assert_eq!(
            Acquire::decode(array(&[2, 10, 3, 2500, 1])),
            Ok(AcquireReply::Queued {
                ticket: 10,
                position: 3,
                owner_pttl_ms: 2500,
                evicted: 1
            })
        );
        assert_eq!(
            Acquire::decode(array(&[3, -2, 0])),
            Ok(AcquireReply::Busy {
                owner_pttl_ms: -2,
                evicted: 0
            })
        );
        assert!(Acquire::decode(array(&[9])).is_err());
        assert!(Acquire::decode(Reply::Int(1)).is_err());
        assert!(
            Acquire::decode(array(&[1])).is_err(),
            "a short reply is an error"
        );
    }

    #[test]
    fn heartbeat_reply_decodes_one_status_per_member() {
        let reply = Heartbeat::decode(array(&[2, 900, 1, 0, 2, 41, 0, 0])).unwrap();
        assert_eq!(reply.evicted, 2);
        assert_eq!(
            reply.statuses,
            vec![
                WaiterStatus::Queued,
                WaiterStatus::Granted { token: 41 },
                WaiterStatus::Missing
            ]
        );
    }

    #[test]
    fn args_follow_the_script_headers() {
        let timings = Timings::default();
        let members = vec!["a.1".to_owned(), "b.2".to_owned()];
        let args = Heartbeat {
            members: &members,
            timings: &timings,
            channel_prefix: "p:notify:",
        }
        .args();
        assert_eq!(args, ["5000", "60000", "5000", "p:notify:", "a.1", "b.2"]);
        let args = Release {
            member: "m.1",
            timings: &timings,
            channel_prefix: "c:",
        }
        .args();
        assert_eq!(args, ["m.1", "5000", "c:"]);
    }
}
