//! One Rust type per script call. Fields mirror the script's ARGV header;
//! `decode` turns the script's reply into a typed answer.

use crate::keys::LockKeys;
use crate::reply::{Fields, ProtocolError, Reply};
use crate::script::{Script, ACQUIRE, CANCEL, FORCE_RELEASE, HEARTBEAT, INSPECT, RELEASE, RENEW};
use crate::timings::Timings;

/// A call of one script: which script, its ARGV, and how to read its reply.
///
/// Every lock script takes the five keys of [`crate::LockKeys`];
/// `renew.lua` takes owner keys of several locks and is run through
/// [`RenewBatch`] instead.
pub trait ScriptCall {
    /// The script this call runs.
    const SCRIPT: &'static Script;
    /// The typed reply.
    type Output;
    /// ARGV, in the order of the script's header.
    fn args(&self) -> Vec<String>;
    /// Reads the script's reply.
    fn decode(reply: Reply) -> Result<Self::Output, ProtocolError>;
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
    /// The caller, with its lease inside.
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

/// Dead waiters an operation removed, and whether more are left at the head
/// of the queue (the client then goes on with [`Heartbeat::purge`] calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Purged {
    /// Dead waiters removed by this call.
    pub dropped: u64,
    /// Whether dead waiters are left to purge before a live one is found.
    pub more: bool,
}

impl Purged {
    /// The purge fields a reply carries only when it purged: an
    /// uncontended grant is `{1, token}`, so the hot path sends no more,
    /// and a refused release is `{0}` unless it handed a free lock on.
    pub(crate) fn read_if_sent(f: &mut Fields) -> Self {
        f.optional(Self::read).unwrap_or_default()
    }

    pub(crate) fn read(f: &mut Fields) -> Result<Self, ProtocolError> {
        Ok(Self {
            dropped: f.uint()?,
            more: f.int()? == 1,
        })
    }
}

/// What [`Acquire`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// The caller owns the lock.
    Granted {
        /// Fencing token of this grant.
        token: u64,
        /// Dead waiters this call removed before granting the caller (it
        /// headed the queue behind them), and whether more are left: for
        /// a permit set, waiters that would fit a permit still free may
        /// wait behind them.
        purged: Purged,
    },
    /// The caller waits in the queue.
    Queued {
        /// The caller's ticket; grants follow ticket order.
        ticket: u64,
        /// Waiters ahead of the caller when it joined.
        position: u64,
        /// Dead waiters removed on the way.
        purged: Purged,
    },
    /// The lock is held or someone is queued (try mode only).
    Busy {
        /// Dead waiters removed on the way.
        purged: Purged,
    },
}

impl AcquireReply {
    /// Reads the reply of `acquire.lua` or `permit_acquire.lua`, which
    /// answer alike.
    pub(crate) fn read(mut f: Fields) -> Result<Self, ProtocolError> {
        match f.int()? {
            1 => Ok(Self::Granted {
                token: f.uint()?,
                purged: Purged::read_if_sent(&mut f),
            }),
            2 => Ok(Self::Queued {
                ticket: f.uint()?,
                position: f.uint()?,
                purged: Purged::read(&mut f)?,
            }),
            3 => Ok(Self::Busy {
                purged: Purged::read(&mut f)?,
            }),
            other => Err(f.unknown_status(other)),
        }
    }
}

/// The ARGV of `acquire.lua` and `permit_acquire.lua`, which take the same.
pub(crate) fn acquire_args(
    owner_id: &str,
    mode: AcquireMode,
    timings: &Timings,
    channel_prefix: &str,
    rejoin: Option<u64>,
) -> Vec<String> {
    let mode = match mode {
        AcquireMode::Wait => "wait",
        AcquireMode::Try => "try",
    };
    let mut args = vec![
        owner_id.to_owned(),
        mode.to_owned(),
        timings.waiter_ttl_ms().to_string(),
        timings.queue_ttl_ms().to_string(),
        timings.idle_ms().to_string(),
        channel_prefix.to_owned(),
    ];
    if let Some(ticket) = rejoin {
        args.push(ticket.to_string());
    }
    args
}

impl ScriptCall for Acquire<'_> {
    const SCRIPT: &'static Script = &ACQUIRE;
    type Output = AcquireReply;

    fn args(&self) -> Vec<String> {
        acquire_args(
            self.owner_id,
            self.mode,
            self.timings,
            self.channel_prefix,
            self.rejoin,
        )
    }

    fn decode(reply: Reply) -> Result<AcquireReply, ProtocolError> {
        AcquireReply::read(Fields::new(ACQUIRE.name(), reply)?)
    }
}

/// `release.lua`.
#[derive(Debug, Clone)]
pub struct Release<'a> {
    /// The releasing owner.
    pub owner_id: &'a str,
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
    /// The client tag of the process that receives the reply, or "". A
    /// waiter of that process that gets the lock is sent no message: the
    /// caller must wake it from [`ReleaseReply::Released`] (or hand the
    /// grant back if nobody waits for it any more).
    pub reply_to: &'a str,
}

/// A [`Release`] sent again after its first send was answered
/// [`ReleaseReply::Released`] on a connection since replaced (with replica
/// acknowledgement on, the `WAIT` that followed it counts nothing of a new
/// connection). The release ran where it was answered; sent again, it
/// releases the grant if the server now written to still has it, and
/// otherwise answers released (not [`ReleaseReply::NotOwner`]: 8 or more
/// later releases may have pushed this one out of the lock's record)
/// after a write that changes no value (the lock's counter gets its idle
/// TTL again), so a `WAIT` after it covers this server's state. Use it
/// only for a release already answered released: for any other it would
/// hide a lease that ran out.
#[derive(Debug, Clone)]
pub struct ReleaseAgain<'a>(pub Release<'a>);

impl ScriptCall for ReleaseAgain<'_> {
    const SCRIPT: &'static Script = &RELEASE;
    type Output = ReleaseReply;

    fn args(&self) -> Vec<String> {
        let mut args = self.0.args();
        args.push("again".to_owned());
        args
    }

    fn decode(reply: Reply) -> Result<ReleaseReply, ProtocolError> {
        Release::decode(reply)
    }
}

/// A grant a release made: the waiter that now holds, its fencing token,
/// and whether its grant message reached nobody.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    /// The waiter that now holds.
    pub owner_id: String,
    /// Its fencing token.
    pub token: u64,
    /// The grant's message reached nobody, so the script cut the new
    /// holder's lease to the waiter TTL: whoever wakes the holder by other
    /// means (a release in its own process) must set its lease.
    pub unheard: bool,
}

impl Handoff {
    /// Reads one grant of a release's reply: owner id, token, unheard.
    pub(crate) fn read(f: &mut Fields) -> Result<Self, ProtocolError> {
        Ok(Self {
            owner_id: f.string()?,
            token: f.uint()?,
            unheard: f.int()? == 1,
        })
    }
}

/// The ARGV a script that may hand a lock or permits on starts with (a
/// release or a cancel, of a lock or a permit): the caller, the idle TTL,
/// the channel prefix and the waiter TTL, with room for the one argument
/// a release adds (a release is half of every cycle: no regrowth).
pub(crate) fn handoff_args(owner_id: &str, timings: &Timings, channel_prefix: &str) -> Vec<String> {
    let mut args = Vec::with_capacity(5);
    args.extend([
        owner_id.to_owned(),
        timings.idle_ms().to_string(),
        channel_prefix.to_owned(),
        timings.waiter_ttl_ms().to_string(),
    ]);
    args
}

/// What [`Release`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseReply {
    /// The lock was freed (or had been freed by this owner id already).
    Released {
        /// The waiter that now owns the lock, if any.
        handed_to: Option<Handoff>,
        /// Dead waiters removed on the way.
        purged: Purged,
    },
    /// The caller does not own the lock. Nothing of the caller's changed;
    /// a lock nobody owns (the caller's lease ran out) went to its oldest
    /// live waiter, as at a heartbeat, if one was found within the
    /// script's scan bound (else `purged.more` is set and purge calls go
    /// on).
    NotOwner {
        /// Dead waiters removed while looking for that waiter.
        purged: Purged,
    },
}

impl ScriptCall for Release<'_> {
    const SCRIPT: &'static Script = &RELEASE;
    type Output = ReleaseReply;

    fn args(&self) -> Vec<String> {
        let mut args = handoff_args(self.owner_id, self.timings, self.channel_prefix);
        args.push(self.reply_to.to_owned());
        args
    }

    fn decode(reply: Reply) -> Result<ReleaseReply, ProtocolError> {
        let mut f = Fields::new(RELEASE.name(), reply)?;
        match f.int()? {
            1 => {
                let purged = Purged::read(&mut f)?;
                let handoff = Handoff::read(&mut f)?;
                Ok(ReleaseReply::Released {
                    handed_to: (!handoff.owner_id.is_empty()).then_some(handoff),
                    purged,
                })
            }
            0 => Ok(ReleaseReply::NotOwner {
                purged: Purged::read_if_sent(&mut f),
            }),
            other => Err(f.unknown_status(other)),
        }
    }
}

/// One lock of a [`RenewBatch`]: its owner key, the holder, and the new
/// lease (0 to only check that the holder still owns it).
#[derive(Debug, Clone)]
pub struct RenewItem<'a> {
    /// The lock's owner key ([`crate::LockKeys::owner`]).
    pub owner_key: &'a str,
    /// The holder.
    pub owner_id: &'a str,
    /// The new lease from now in ms, or 0 to check only.
    pub lease_ms: u64,
    /// The grant that must be the one held, by its fencing token (a
    /// waiter confirming the grant it took: the owner id may hold a later
    /// grant by then); `None` for any grant of the owner id.
    pub token: Option<u64>,
}

/// `renew.lua` over several locks of one slot: one call per client per
/// interval, not one per lock.
#[derive(Debug, Clone, Default)]
pub struct RenewBatch<'a> {
    /// The locks, in reply order.
    pub items: Vec<RenewItem<'a>>,
}

/// What [`RenewBatch`] found for one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewStatus {
    /// Still held (and renewed, if a lease was given).
    Held,
    /// Gone or owned by another: the lease is lost.
    Lost,
    /// The owner key holds a value of another type; nothing changed.
    WrongType,
}

impl RenewStatus {
    /// Reads the reply of `renew.lua` or `permit_renew.lua`: one status
    /// per item, in the order sent.
    pub(crate) fn read_all(mut f: Fields) -> Result<Vec<Self>, ProtocolError> {
        let mut statuses = Vec::with_capacity(f.remaining());
        while f.remaining() > 0 {
            statuses.push(match f.int()? {
                1 => Self::Held,
                0 => Self::Lost,
                -1 => Self::WrongType,
                other => return Err(f.unknown_status(other)),
            });
        }
        Ok(statuses)
    }
}

/// One item of `renew.lua`'s or `permit_renew.lua`'s ARGV.
pub(crate) fn renewal_arg(owner_id: &str, lease_ms: u64, token: Option<u64>) -> String {
    match token {
        Some(token) => format!("{owner_id} {lease_ms} {token}"),
        None => format!("{owner_id} {lease_ms}"),
    }
}

impl RenewBatch<'_> {
    /// The script it runs.
    pub fn script() -> &'static Script {
        &RENEW
    }

    /// KEYS: the owner keys.
    pub fn keys(&self) -> Vec<&str> {
        self.items.iter().map(|item| item.owner_key).collect()
    }

    /// ARGV, one `"<owner id> <lease_ms>"` per key, or
    /// `"<owner id> <lease_ms> <token>"` for an item with a token.
    pub fn args(&self) -> Vec<String> {
        self.items
            .iter()
            .map(|item| renewal_arg(item.owner_id, item.lease_ms, item.token))
            .collect()
    }

    /// Reads the reply: one status per item.
    pub fn decode(reply: Reply) -> Result<Vec<RenewStatus>, ProtocolError> {
        RenewStatus::read_all(Fields::new(RENEW.name(), reply)?)
    }
}

/// The most probes one lock or permit set takes in one heartbeat
/// (`heartbeat.lua`, `permit_heartbeat.lua`): the reply answers each in
/// one bit of an integer.
pub const MAX_PROBES: usize = 32;

/// One flag per probe of a heartbeat, in the order the probes were sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeFlags(u32);

impl ProbeFlags {
    /// Flags from their bits: bit `i` is probe `i`'s.
    pub fn from_bits(bits: u32) -> Self {
        Self(bits)
    }

    /// Whether probe `i` (0 = the first sent) is flagged.
    pub fn get(self, i: usize) -> bool {
        i < MAX_PROBES && self.0 & (1 << i) != 0
    }

    /// Reads one reply field: an integer whose bit `i` is probe `i`'s.
    pub(crate) fn read(f: &mut Fields) -> Result<Self, ProtocolError> {
        let bits = f.int()?;
        u32::try_from(bits)
            .map(Self)
            .map_err(|_| f.error(format!("probe flags {bits} do not fit {MAX_PROBES} probes")))
    }
}

/// `heartbeat.lua` for one lock: a batch of one (see [`HeartbeatBatch`]),
/// what a client runs to go on purging dead waiters.
#[derive(Debug, Clone)]
pub struct Heartbeat<'a> {
    /// The calling process's client tag.
    pub tag: &'a str,
    /// Waiters of the process on this lock whose places the call checks
    /// (at most [`MAX_PROBES`], the oldest first), or none to only hand a
    /// free lock on.
    pub probes: &'a [&'a str],
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
}

impl<'a> Heartbeat<'a> {
    /// A call that only hands a free lock on, purging dead waiters: what a
    /// client runs while a release or acquire reported [`Purged::more`].
    pub fn purge(tag: &'a str, timings: &'a Timings, channel_prefix: &'a str) -> Self {
        Self {
            tag,
            probes: &[],
            timings,
            channel_prefix,
        }
    }
}

/// What [`Heartbeat`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatReply {
    /// The holder after the call and its token, if the lock is held.
    ///
    /// The script returns an owner value another program wrote as it
    /// finds it, and the reply takes it without failing, so that one such
    /// lock cannot spoil the reply of a whole [`HeartbeatBatch`]: a holder
    /// that is not UTF-8 comes lossily, a token past 2^63 (which Redis
    /// sends as -2^63) as 0. Neither is an owner value fairlock wrote
    /// (owner ids are ASCII, tokens far below 2^63): the lock is held by
    /// somebody who is no waiter of this process.
    pub holder: Option<(String, u64)>,
    /// Which probes are queued. A probe that is neither queued nor the
    /// holder has lost its place, if its task still waits.
    pub queued: ProbeFlags,
    /// Dead waiters removed on the way.
    pub purged: Purged,
}

impl ScriptCall for Heartbeat<'_> {
    const SCRIPT: &'static Script = &HEARTBEAT;
    type Output = HeartbeatReply;

    fn args(&self) -> Vec<String> {
        let mut args = heartbeat_args(self.tag, self.timings, self.channel_prefix);
        push_probes(&mut args, self.probes);
        args
    }

    fn decode(reply: Reply) -> Result<HeartbeatReply, ProtocolError> {
        HeartbeatReply::read(&mut Fields::new(HEARTBEAT.name(), reply)?)
    }
}

impl HeartbeatReply {
    /// One lock's five fields of a heartbeat reply; a foreign owner value
    /// is read as [`HeartbeatReply::holder`] says.
    fn read(f: &mut Fields) -> Result<Self, ProtocolError> {
        let holder = f.lossy_string()?;
        // Lua reads a token of more digits than fit as a float, which
        // Redis sends as -2^63: only a foreign value has one.
        let token = u64::try_from(f.int()?).unwrap_or(0);
        Ok(Self {
            holder: (!holder.is_empty()).then_some((holder, token)),
            queued: ProbeFlags::read(f)?,
            purged: Purged::read(f)?,
        })
    }
}

/// The arguments every heartbeat call starts with, before the probes.
fn heartbeat_args(tag: &str, timings: &Timings, channel_prefix: &str) -> Vec<String> {
    vec![
        tag.to_owned(),
        timings.waiter_ttl_ms().to_string(),
        timings.queue_ttl_ms().to_string(),
        timings.idle_ms().to_string(),
        channel_prefix.to_owned(),
    ]
}

/// One lock's probes, as `heartbeat.lua` takes them: their count, then
/// each. More than [`MAX_PROBES`] is a bug of the caller, and the script
/// refuses the call.
fn push_probes(args: &mut Vec<String>, probes: &[&str]) {
    debug_assert!(probes.len() <= MAX_PROBES, "{} probes", probes.len());
    args.push(probes.len().to_string());
    args.extend(probes.iter().map(|probe| (*probe).to_owned()));
}

/// `heartbeat.lua` over several locks of one slot: one call per process per
/// interval for a batch of locks, not one per lock, so the cost of a
/// round trip and a script run is shared by the batch.
#[derive(Debug, Clone)]
pub struct HeartbeatBatch<'a> {
    /// The calling process's client tag.
    pub tag: &'a str,
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken (the same for every lock of one slot).
    pub channel_prefix: &'a str,
    /// The locks, in reply order.
    pub items: Vec<HeartbeatItem<'a>>,
}

/// One lock of a [`HeartbeatBatch`].
#[derive(Debug, Clone, Copy)]
pub struct HeartbeatItem<'a> {
    /// The lock's keys.
    pub keys: &'a LockKeys,
    /// Waiters of the process on it whose places the call checks (at most
    /// [`MAX_PROBES`], the oldest first), or none to only hand a free lock
    /// on.
    pub probes: &'a [&'a str],
}

impl HeartbeatBatch<'_> {
    /// The script it runs.
    pub fn script() -> &'static Script {
        &HEARTBEAT
    }

    /// KEYS: each lock's five keys, lock after lock.
    pub fn keys(&self) -> Vec<&str> {
        self.items
            .iter()
            .flat_map(|item| item.keys.all().iter().map(String::as_str))
            .collect()
    }

    /// ARGV: the shared arguments, then per lock the number of its probes
    /// and the probes.
    pub fn args(&self) -> Vec<String> {
        let mut args = heartbeat_args(self.tag, self.timings, self.channel_prefix);
        for item in &self.items {
            push_probes(&mut args, item.probes);
        }
        args
    }

    /// Reads the reply: one [`HeartbeatReply`] per lock, in order. A reply
    /// for another number of locks than the batch's is a protocol error.
    pub fn decode(&self, reply: Reply) -> Result<Vec<HeartbeatReply>, ProtocolError> {
        let mut f = Fields::new(HEARTBEAT.name(), reply)?;
        if f.remaining() != 5 * self.items.len() {
            return Err(ProtocolError {
                script: HEARTBEAT.name(),
                detail: format!(
                    "{} fields for {} locks, expected five per lock",
                    f.remaining(),
                    self.items.len()
                ),
            });
        }
        self.items
            .iter()
            .map(|_| HeartbeatReply::read(&mut f))
            .collect()
    }
}

/// `cancel.lua`.
#[derive(Debug, Clone)]
pub struct Cancel<'a> {
    /// The waiter giving up.
    pub owner_id: &'a str,
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
}

/// What [`Cancel`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelReply {
    /// The waiter was in the queue and left it.
    pub was_queued: bool,
    /// The waiter had been granted the lock; it was passed on.
    pub was_owner: bool,
    /// Dead waiters removed on the way.
    pub purged: Purged,
}

impl CancelReply {
    /// Reads the reply of `cancel.lua` or `permit_cancel.lua`, which
    /// answer alike.
    pub(crate) fn read(mut f: Fields) -> Result<Self, ProtocolError> {
        Ok(Self {
            was_queued: f.int()? == 1,
            was_owner: f.int()? == 1,
            purged: Purged::read(&mut f)?,
        })
    }
}

impl ScriptCall for Cancel<'_> {
    const SCRIPT: &'static Script = &CANCEL;
    type Output = CancelReply;

    fn args(&self) -> Vec<String> {
        handoff_args(self.owner_id, self.timings, self.channel_prefix)
    }

    fn decode(reply: Reply) -> Result<CancelReply, ProtocolError> {
        CancelReply::read(Fields::new(CANCEL.name(), reply)?)
    }
}

/// `force_release.lua`: ADMIN.
#[derive(Debug, Clone)]
pub struct ForceRelease<'a> {
    /// The holder the caller saw (from [`Inspect`]), or "" to only hand a
    /// free lock on.
    pub expected: &'a str,
    /// Shared protocol timings.
    pub timings: &'a Timings,
    /// Where waiters are woken.
    pub channel_prefix: &'a str,
}

/// What [`ForceRelease`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForceReleaseReply {
    /// Whether the expected holder was released.
    pub released: bool,
    /// The holder now (after the call), or the expected one if released.
    pub holder: Option<String>,
    /// Dead waiters removed on the way.
    pub purged: Purged,
}

impl ScriptCall for ForceRelease<'_> {
    const SCRIPT: &'static Script = &FORCE_RELEASE;
    type Output = ForceReleaseReply;

    fn args(&self) -> Vec<String> {
        vec![
            self.expected.to_owned(),
            self.timings.idle_ms().to_string(),
            self.channel_prefix.to_owned(),
            self.timings.waiter_ttl_ms().to_string(),
        ]
    }

    fn decode(reply: Reply) -> Result<ForceReleaseReply, ProtocolError> {
        let mut f = Fields::new(FORCE_RELEASE.name(), reply)?;
        let released = f.int()? == 1;
        let holder = f.string()?;
        Ok(ForceReleaseReply {
            released,
            holder: (!holder.is_empty()).then_some(holder),
            purged: Purged::read(&mut f)?,
        })
    }
}

/// `inspect.lua`: a read-only snapshot, listing up to `waiters` waiters
/// from the head of the queue.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inspect {
    /// How many waiters from the head to list.
    pub waiters: u64,
}

/// One queued waiter in a [`LockState`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedWaiter {
    /// The waiter's owner id.
    pub owner_id: String,
    /// Its ticket.
    pub ticket: u64,
    /// Its process's heartbeat deadline (server ms), `None` if the process
    /// is not alive on this lock.
    pub deadline_ms: Option<u64>,
}

/// A snapshot of one lock, from [`Inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockState {
    /// The holder's owner id, if the lock is held.
    pub owner: Option<String>,
    /// The holder's fencing token (0 when free).
    pub token: u64,
    /// The holder's remaining lease in ms (negative when free).
    pub owner_pttl_ms: i64,
    /// Entries in the queue, live or not yet purged.
    pub queue_len: u64,
    /// The last token or ticket issued (0 once the idle counter expired;
    /// the next one is still above every earlier one).
    pub last_seq: u64,
    /// Server time of the snapshot, ms.
    pub now_ms: u64,
    /// The first waiters, oldest first.
    pub waiters: Vec<QueuedWaiter>,
}

impl ScriptCall for Inspect {
    const SCRIPT: &'static Script = &INSPECT;
    type Output = LockState;

    fn args(&self) -> Vec<String> {
        vec![self.waiters.to_string()]
    }

    fn decode(reply: Reply) -> Result<LockState, ProtocolError> {
        let mut f = Fields::new(INSPECT.name(), reply)?;
        let owner = f.string()?;
        let mut state = LockState {
            owner: (!owner.is_empty()).then_some(owner),
            token: f.uint()?,
            owner_pttl_ms: f.int()?,
            queue_len: f.uint()?,
            last_seq: f.uint()?,
            now_ms: f.uint()?,
            waiters: Vec::new(),
        };
        while f.remaining() >= 3 {
            let owner_id = f.string()?;
            let ticket = f.uint()?;
            let deadline = f.int()?;
            state.waiters.push(QueuedWaiter {
                owner_id,
                ticket,
                deadline_ms: u64::try_from(deadline).ok(),
            });
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(items: &[i64]) -> Reply {
        Reply::Array(items.iter().map(|&i| Reply::Int(i)).collect())
    }

    /// A refused release carries the purge fields only when it handed a
    /// free lock on past dead waiters.
    #[test]
    fn refused_release_replies_decode() {
        assert_eq!(
            Release::decode(array(&[0])),
            Ok(ReleaseReply::NotOwner {
                purged: Purged::default()
            })
        );
        assert_eq!(
            Release::decode(array(&[0, 128, 1])),
            Ok(ReleaseReply::NotOwner {
                purged: Purged {
                    dropped: 128,
                    more: true
                }
            })
        );
    }

    #[test]
    fn acquire_replies_decode() {
        assert_eq!(
            Acquire::decode(array(&[2, 10, 3, 1, 0])),
            Ok(AcquireReply::Queued {
                ticket: 10,
                position: 3,
                purged: Purged {
                    dropped: 1,
                    more: false
                }
            })
        );
        assert_eq!(
            Acquire::decode(array(&[3, 0, 1])),
            Ok(AcquireReply::Busy {
                purged: Purged {
                    dropped: 0,
                    more: true
                }
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
    fn renew_batch_reads_one_status_per_lock() {
        assert_eq!(
            RenewBatch::decode(array(&[1, 0, -1])),
            Ok(vec![
                RenewStatus::Held,
                RenewStatus::Lost,
                RenewStatus::WrongType
            ])
        );
        let batch = RenewBatch {
            items: vec![RenewItem {
                owner_key: "k",
                owner_id: "m.t.5",
                lease_ms: 30,
                token: None,
            }],
        };
        assert_eq!(batch.args(), ["m.t.5 30"]);
        assert_eq!(batch.keys(), ["k"]);
    }

    /// One lock's holder that another program wrote (not UTF-8, or with a
    /// token past 2^63, which Lua hands Redis as -2^63) does not spoil
    /// the reply for the batch: it reads as a holder that is nobody's,
    /// and the other locks' entries as they are.
    #[test]
    fn a_foreign_holder_does_not_spoil_a_heartbeat_batch() {
        use crate::keys::{KeyPrefix, LockName};
        let names = ["binary", "huge", "ours"]
            .map(|name| LockKeys::new(&KeyPrefix::default(), &LockName::new(name).unwrap()));
        let timings = Timings::default();
        let batch = HeartbeatBatch {
            tag: "ff",
            timings: &timings,
            channel_prefix: "p:",
            items: names
                .iter()
                .map(|keys| HeartbeatItem { keys, probes: &[] })
                .collect(),
        };
        let reply = Reply::Array(vec![
            Reply::Bytes(vec![0xff]),
            Reply::Int(1),
            Reply::Int(0),
            Reply::Int(0),
            Reply::Int(0),
            Reply::Str("x".into()),
            Reply::Int(i64::MIN),
            Reply::Int(1),
            Reply::Int(2),
            Reply::Int(1),
            Reply::Str("a.ff.5".into()),
            Reply::Int(7),
            Reply::Int(1),
            Reply::Int(0),
            Reply::Int(0),
        ]);
        let replies = batch.decode(reply).expect("the batch's reply");
        let holders: Vec<_> = replies.iter().map(|r| r.holder.clone()).collect();
        assert_eq!(
            holders,
            [
                Some(("\u{fffd}".to_owned(), 1)),
                Some(("x".to_owned(), 0)),
                Some(("a.ff.5".to_owned(), 7)),
            ]
        );
        assert!(replies[1].queued.get(0));
        assert_eq!(
            replies[1].purged,
            Purged {
                dropped: 2,
                more: true
            }
        );
        assert!(replies[2].queued.get(0));
        // The reply's shape is still checked.
        let short = Reply::Array(vec![Reply::Int(0); 10]);
        assert!(batch.decode(short).is_err());
    }

    #[test]
    fn args_follow_the_script_headers() {
        let timings = Timings::default();
        let args = Heartbeat {
            tag: "ff",
            probes: &["a.ff.5", "b.ff.5"],
            timings: &timings,
            channel_prefix: "p:notify:",
        }
        .args();
        assert_eq!(
            args,
            [
                "ff",
                "5000",
                "20000",
                "600000",
                "p:notify:",
                "2",
                "a.ff.5",
                "b.ff.5"
            ]
        );
        let args = Release {
            owner_id: "m.1.5",
            timings: &timings,
            channel_prefix: "c:",
            reply_to: "1",
        }
        .args();
        assert_eq!(args, ["m.1.5", "600000", "c:", "5000", "1"]);
    }
}
