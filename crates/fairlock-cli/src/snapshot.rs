//! One lock's state as `inspect` and `watch` show it, for people and as
//! JSON. Both commands render through here, so they never disagree.
//!
//! Everything is computed from one `inspect` script call and its server
//! clock (`now_ms`), never from the local clock: deadlines and leases are
//! server time, and the machine running the CLI may be skewed.

use std::fmt::Write as _;

use fairlock::LockState;
use serde::Serialize;

use crate::duration::human_millis;
use crate::name::{hex_if_binary, shown};

/// A lock snapshot, ready to print.
#[derive(Debug, Serialize)]
pub struct LockView {
    /// The lock name if UTF-8, else escaped as `b"..."` (see
    /// [`crate::name`]).
    pub name: String,
    /// The exact bytes of a name that is not UTF-8, as hex; `None` when
    /// `name` is exact.
    pub name_hex: Option<String>,
    /// The holder's owner id (`<nonce>.<client tag>.<lease ms>`), the id
    /// `release --force --holder` takes; `None` when free.
    pub holder: Option<String>,
    /// The holder's nonce (the first part of its owner id).
    pub nonce: Option<String>,
    /// The holder's fencing token, `None` when free.
    pub token: Option<u64>,
    /// The holder's remaining lease, ms; `None` when free.
    pub lease_left_ms: Option<u64>,
    /// Queue entries, live or not yet purged.
    pub queue_len: u64,
    /// The last token or ticket issued.
    pub last_seq: u64,
    /// Server time of the snapshot, ms since the epoch.
    pub now_ms: u64,
    /// The first waiters, oldest first.
    pub waiters: Vec<WaiterView>,
}

/// One queued waiter.
#[derive(Debug, Serialize)]
pub struct WaiterView {
    /// 1 for the next in line.
    pub position: u64,
    /// The waiter's owner id.
    pub owner_id: String,
    /// Its ticket: grants follow ticket order.
    pub ticket: u64,
    /// How long it has waited, estimated: a ticket is never below the
    /// server clock in microseconds when it was drawn, so this is
    /// `now_ms - ticket / 1000`, at most the true wait.
    pub age_ms_estimate: u64,
    /// Its process's heartbeat deadline (server ms), `None` if that
    /// process has no heartbeat on this lock.
    pub deadline_ms: Option<u64>,
    /// Whether the deadline is still ahead: a dead waiter is skipped and
    /// purged by the next grant.
    pub alive: bool,
}

impl LockView {
    /// The view of `state`, the snapshot of lock `name`.
    pub fn new(name: &[u8], state: LockState) -> Self {
        let now_ms = state.now_ms;
        let waiters = state
            .waiters
            .into_iter()
            .zip(1..)
            .map(|(waiter, position)| WaiterView {
                position,
                age_ms_estimate: now_ms.saturating_sub(waiter.ticket / 1_000),
                alive: waiter.deadline_ms.is_some_and(|deadline| deadline > now_ms),
                owner_id: waiter.owner_id,
                ticket: waiter.ticket,
                deadline_ms: waiter.deadline_ms,
            })
            .collect();
        let held = state.owner.is_some();
        Self {
            name: shown(name),
            name_hex: hex_if_binary(name),
            nonce: state.owner.as_deref().map(nonce_of),
            holder: state.owner,
            token: held.then_some(state.token),
            // PTTL -1 (no TTL) cannot happen for a fairlock owner key; show
            // it as "no lease left to report" rather than a huge number.
            lease_left_ms: held
                .then(|| u64::try_from(state.owner_pttl_ms).ok())
                .flatten(),
            queue_len: state.queue_len,
            last_seq: state.last_seq,
            now_ms,
            waiters,
        }
    }

    /// The snapshot for people.
    pub fn human(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "lock        {}", self.name);
        match (&self.holder, self.token) {
            (Some(holder), Some(token)) => {
                let _ = writeln!(out, "holder      {holder}");
                let _ = writeln!(out, "token       {token}");
                let lease = self
                    .lease_left_ms
                    .map_or_else(|| "unknown".to_owned(), human_millis);
                let _ = writeln!(out, "lease left  {lease}");
            }
            _ => {
                let _ = writeln!(out, "holder      (free)");
            }
        }
        let _ = writeln!(out, "queue       {} waiting", self.queue_len);
        if !self.waiters.is_empty() {
            let _ = writeln!(
                out,
                "  {:>3}  {:<18}  {:>8}  {:<22}  owner id",
                "pos", "ticket", "age(est)", "liveness"
            );
            for waiter in &self.waiters {
                let _ = writeln!(
                    out,
                    "  {:>3}  {:<18}  {:>8}  {:<22}  {}",
                    waiter.position,
                    waiter.ticket,
                    format!("~{}", human_millis(waiter.age_ms_estimate)),
                    self.liveness(waiter),
                    waiter.owner_id
                );
            }
            let listed = self.waiters.len() as u64;
            if listed < self.queue_len {
                let _ = writeln!(out, "  ... {} more", self.queue_len - listed);
            }
        }
        out
    }

    fn liveness(&self, waiter: &WaiterView) -> String {
        match waiter.deadline_ms {
            Some(deadline) if waiter.alive => {
                format!("alive ({} left)", human_millis(deadline - self.now_ms))
            }
            Some(deadline) => format!(
                "DEAD ({} ago)",
                human_millis(self.now_ms.saturating_sub(deadline))
            ),
            None => "DEAD (no heartbeat)".to_owned(),
        }
    }
}

/// The nonce part of an owner id (`<nonce>.<tag>.<lease>`).
fn nonce_of(owner_id: &str) -> String {
    owner_id.split('.').next().unwrap_or(owner_id).to_owned()
}
