//! One Rust type per permit script call (the fair semaphore and the fair
//! read-write lock). Fields mirror each script's ARGV header; replies reuse
//! the lock's reply types where the shapes agree.
//!
//! Every permit script takes the five keys of [`LockKeys::permits`];
//! `permit_renew.lua` takes two keys per permit of several sets and is run
//! through [`PermitRenewBatch`].

use crate::calls::{
    handoff_args, AcquireMode, AcquireReply, CancelReply, Handoff, ProbeFlags, Purged, RenewStatus,
};
use crate::keys::LockKeys;
use crate::reply::{Fields, ProtocolError, Reply};
use crate::script::{
    Script, PERMIT_ACQUIRE, PERMIT_CANCEL, PERMIT_HEARTBEAT, PERMIT_RELEASE, PERMIT_RENEW,
};
use crate::timings::Timings;

/// The most permits a set may have. It is also the readers' share of a
/// read-write lock, which makes readers in effect unlimited.
pub const MAX_PERMITS: u32 = 1_000_000;

/// What a permit request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PermitRequest {
    /// One permit, shared with at most this many holders in all (1 to
    /// [`MAX_PERMITS`]): a semaphore permit, or a reader.
    Shared(u32),
    /// The whole set, alone: a writer.
    Exclusive,
}

impl PermitRequest {
    fn count(self) -> u32 {
        match self {
            PermitRequest::Shared(permits) => permits,
            PermitRequest::Exclusive => 0,
        }
    }
}

/// A permit holder's or waiter's identity as stored in Redis:
/// `<nonce, 32 hex>.<client tag, 16 hex>.<lease ms>.<permits>`, permits
/// 0 for an exclusive request. Like a lock's [`crate::OwnerId`] with the
/// request added, so [`crate::OwnerId::tag_of`] and
/// [`crate::OwnerId::nonce_of`] read it too.
///
/// ```
/// use fairlock_core::{OwnerId, PermitOwnerId, PermitRequest};
/// let owner_id = PermitOwnerId::new("0123456789abcdef0123456789abcdef", "00000000000000ff", 30_000, PermitRequest::Shared(3)).expect("a share of 3");
/// assert_eq!(owner_id.as_str(), "0123456789abcdef0123456789abcdef.00000000000000ff.30000.3");
/// assert_eq!(OwnerId::tag_of(owner_id.as_str()), Some("00000000000000ff"));
/// // No share of zero permits: it would read as a writer's request.
/// assert!(PermitOwnerId::new("0123456789abcdef0123456789abcdef", "00000000000000ff", 30_000, PermitRequest::Shared(0)).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PermitOwnerId(String);

impl PermitOwnerId {
    /// Builds an owner id from its parts. A [`PermitRequest::Shared`] of 0
    /// or over [`MAX_PERMITS`] is refused: the owner id of a share of 0
    /// would read as a writer's (0 stands for [`PermitRequest::Exclusive`]).
    pub fn new(
        nonce: &str,
        tag: &str,
        lease_ms: u64,
        request: PermitRequest,
    ) -> Result<Self, InvalidPermitRequest> {
        if let PermitRequest::Shared(permits) = request {
            if permits == 0 || permits > MAX_PERMITS {
                return Err(InvalidPermitRequest { permits });
            }
        }
        Ok(Self(format!(
            "{nonce}.{tag}.{lease_ms}.{}",
            request.count()
        )))
    }

    /// The owner id as stored in Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A [`PermitRequest::Shared`] count [`PermitOwnerId::new`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidPermitRequest {
    /// The count asked for.
    pub permits: u32,
}

impl std::fmt::Display for InvalidPermitRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a share of {} permits is out of range: give 1 to {MAX_PERMITS}",
            self.permits
        )
    }
}

impl std::error::Error for InvalidPermitRequest {}

/// `permit_acquire.lua`.
#[derive(Debug, Clone)]
pub struct PermitAcquire<'a> {
    /// The caller ([`PermitOwnerId`]), with its lease and request inside.
    pub owner_id: &'a str,
    /// Wait in the queue or not.
    pub mode: AcquireMode,
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
    /// The ticket this caller was given when it queued before, if it did:
    /// if its entry was lost meanwhile it joins again in its old place.
    pub rejoin: Option<u64>,
}

impl crate::ScriptCall for PermitAcquire<'_> {
    const SCRIPT: &'static Script = &PERMIT_ACQUIRE;
    type Output = AcquireReply;

    fn args(&self) -> Vec<String> {
        crate::calls::acquire_args(
            self.owner_id,
            self.mode,
            self.timings,
            self.channel_prefix,
            self.rejoin,
        )
    }

    fn decode(reply: Reply) -> Result<AcquireReply, ProtocolError> {
        AcquireReply::read(Fields::new(PERMIT_ACQUIRE.name(), reply)?)
    }
}

/// `permit_release.lua`.
#[derive(Debug, Clone)]
pub struct PermitRelease<'a> {
    /// The releasing holder.
    pub owner_id: &'a str,
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
    /// How long the set remembers this release (in its `alive` key), so
    /// that the same release sent again is answered
    /// [`PermitReleaseReply::Released`] and changes nothing. It must cover
    /// the time in which a resend can still arrive (the client gives a few
    /// command timeouts); each release in that time costs an entry.
    pub remember_ms: u64,
}

/// What [`PermitRelease`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermitReleaseReply {
    /// The permit was given back, by this call or (a resend) by the same
    /// release run before; a resend hands nothing on.
    Released {
        /// The waiters that hold a permit by this release.
        granted: Vec<Handoff>,
        /// Dead waiters removed on the way.
        purged: Purged,
    },
    /// The caller held no live permit and has no release remembered (its
    /// lease ran out, or it never held). Nothing of the caller's changed;
    /// permits that ran out went to the live waiters that now fit, as at a
    /// heartbeat.
    NotHolder {
        /// Dead waiters removed while looking for those waiters (with
        /// `more` set when the scan bound stopped the search: purge calls
        /// go on).
        purged: Purged,
    },
}

impl crate::ScriptCall for PermitRelease<'_> {
    const SCRIPT: &'static Script = &PERMIT_RELEASE;
    type Output = PermitReleaseReply;

    fn args(&self) -> Vec<String> {
        let mut args = handoff_args(self.owner_id, self.timings, self.channel_prefix);
        args.push(self.remember_ms.to_string());
        args
    }

    fn decode(reply: Reply) -> Result<PermitReleaseReply, ProtocolError> {
        let mut f = Fields::new(PERMIT_RELEASE.name(), reply)?;
        match f.int()? {
            1 => {
                let purged = Purged::read(&mut f)?;
                let mut granted = Vec::with_capacity(f.remaining() / 3);
                while f.remaining() >= 3 {
                    granted.push(Handoff::read(&mut f)?);
                }
                Ok(PermitReleaseReply::Released { granted, purged })
            }
            0 => Ok(PermitReleaseReply::NotHolder {
                purged: Purged::read_if_sent(&mut f),
            }),
            other => Err(f.unknown_status(other)),
        }
    }
}

/// `permit_cancel.lua`.
#[derive(Debug, Clone)]
pub struct PermitCancel<'a> {
    /// The waiter giving up.
    pub owner_id: &'a str,
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
}

impl crate::ScriptCall for PermitCancel<'_> {
    const SCRIPT: &'static Script = &PERMIT_CANCEL;
    type Output = CancelReply;

    fn args(&self) -> Vec<String> {
        handoff_args(self.owner_id, self.timings, self.channel_prefix)
    }

    fn decode(reply: Reply) -> Result<CancelReply, ProtocolError> {
        CancelReply::read(Fields::new(PERMIT_CANCEL.name(), reply)?)
    }
}

/// `permit_heartbeat.lua`: one call per permit set per interval for one
/// process.
#[derive(Debug, Clone)]
pub struct PermitHeartbeat<'a> {
    /// The calling process's client tag.
    pub tag: &'a str,
    /// Waiters of the process on this set whose places the call checks
    /// (at most [`crate::MAX_PROBES`], the oldest first), or none to only
    /// hand free permits on.
    pub probes: &'a [&'a str],
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
}

/// What [`PermitHeartbeat`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PermitHeartbeatReply {
    /// Which probes are queued. A probe that is neither queued nor
    /// holding has lost its place, if its task still waits, and runs
    /// [`PermitAcquire`] again.
    pub queued: ProbeFlags,
    /// Dead waiters removed on the way.
    pub purged: Purged,
    /// Which probes are not queued but hold a permit (granted while the
    /// call was on its way); one whose task still waits runs
    /// [`PermitAcquire`] again.
    pub holds: ProbeFlags,
    /// Which of the holding probes have a lease that ends within the
    /// waiter TTL: a grant whose message reached nobody has its lease cut
    /// to it, so the other grants of the same release may have gone
    /// unheard too (or the lease asked for is that short).
    pub unheard: ProbeFlags,
}

impl crate::ScriptCall for PermitHeartbeat<'_> {
    const SCRIPT: &'static Script = &PERMIT_HEARTBEAT;
    type Output = PermitHeartbeatReply;

    /// The probes come last, as many as there are.
    fn args(&self) -> Vec<String> {
        debug_assert!(self.probes.len() <= crate::MAX_PROBES);
        let mut args = vec![
            self.tag.to_owned(),
            self.timings.waiter_ttl_ms().to_string(),
            self.timings.queue_ttl_ms().to_string(),
            self.timings.idle_ms().to_string(),
            self.channel_prefix.to_owned(),
        ];
        args.extend(self.probes.iter().map(|probe| (*probe).to_owned()));
        args
    }

    fn decode(reply: Reply) -> Result<PermitHeartbeatReply, ProtocolError> {
        let mut f = Fields::new(PERMIT_HEARTBEAT.name(), reply)?;
        Ok(PermitHeartbeatReply {
            queued: ProbeFlags::read(&mut f)?,
            purged: Purged::read(&mut f)?,
            holds: ProbeFlags::read(&mut f)?,
            unheard: ProbeFlags::read(&mut f)?,
        })
    }
}

/// One permit of a [`PermitRenewBatch`].
#[derive(Debug, Clone)]
pub struct PermitRenewItem<'a> {
    /// The keys of the permit's set ([`LockKeys::permits`]).
    pub keys: &'a LockKeys,
    /// The holder.
    pub owner_id: &'a str,
    /// The new lease from now in ms, or 0 to check only.
    pub lease_ms: u64,
    /// The grant that must be the one held, by its fencing token (see
    /// [`RenewItem::token`](crate::RenewItem::token)); `None` for any.
    pub token: Option<u64>,
}

/// `permit_renew.lua` over permits of several sets in one slot.
#[derive(Debug, Clone, Default)]
pub struct PermitRenewBatch<'a> {
    /// The permits, in reply order.
    pub items: Vec<PermitRenewItem<'a>>,
}

impl PermitRenewBatch<'_> {
    /// The script it runs.
    pub fn script() -> &'static Script {
        &PERMIT_RENEW
    }

    /// KEYS: the holders and grants key of each permit's set.
    pub fn keys(&self) -> Vec<&str> {
        self.items
            .iter()
            .flat_map(|item| [item.keys.owner(), item.keys.all()[4].as_str()])
            .collect()
    }

    /// ARGV, one `"<owner id> <lease_ms>"` per permit, or
    /// `"<owner id> <lease_ms> <token>"` for an item with a token.
    pub fn args(&self) -> Vec<String> {
        self.items
            .iter()
            .map(|item| crate::calls::renewal_arg(item.owner_id, item.lease_ms, item.token))
            .collect()
    }

    /// Reads the reply: one status per permit.
    pub fn decode(reply: Reply) -> Result<Vec<RenewStatus>, ProtocolError> {
        RenewStatus::read_all(Fields::new(PERMIT_RENEW.name(), reply)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ScriptCall;

    #[test]
    fn release_replies_list_the_grants() {
        let reply = Reply::Array(vec![
            Reply::Int(1),
            Reply::Int(2),
            Reply::Int(0),
            Reply::Str("a.b.5.3".into()),
            Reply::Int(7),
            Reply::Int(0),
            Reply::Str("c.d.5.3".into()),
            Reply::Int(8),
            Reply::Int(1),
        ]);
        assert_eq!(
            PermitRelease::decode(reply),
            Ok(PermitReleaseReply::Released {
                granted: vec![
                    Handoff {
                        owner_id: "a.b.5.3".into(),
                        token: 7,
                        unheard: false
                    },
                    Handoff {
                        owner_id: "c.d.5.3".into(),
                        token: 8,
                        unheard: true
                    }
                ],
                purged: Purged {
                    dropped: 2,
                    more: false
                }
            })
        );
        assert_eq!(
            PermitRelease::decode(Reply::Array(vec![Reply::Int(0)])),
            Ok(PermitReleaseReply::NotHolder {
                purged: Purged::default()
            })
        );
        assert_eq!(
            PermitRelease::decode(Reply::Array(vec![
                Reply::Int(0),
                Reply::Int(3),
                Reply::Int(1)
            ])),
            Ok(PermitReleaseReply::NotHolder {
                purged: Purged {
                    dropped: 3,
                    more: true
                }
            })
        );
    }

    #[test]
    fn owner_ids_carry_the_request() {
        let writer = PermitOwnerId::new("ab", "cd", 7, PermitRequest::Exclusive).expect("a writer");
        assert_eq!(writer.as_str(), "ab.cd.7.0");
        assert_eq!(crate::OwnerId::nonce_of(writer.as_str()), Some("ab"));
    }
}
