//! The key layout of a permit set: a fair semaphore or a read-write lock.
//!
//! A permit set keeps its holders in a sorted set (owner id → lease deadline),
//! so several can hold at once, each with its own lease. Its five keys share
//! the lock's hash tag `{<name>}` but carry a family infix (`:sem:` or
//! `:rw:`), so a lock, a semaphore and a read-write lock of the same name
//! never share a key, while all keys of one set still live in one cluster
//! slot. They travel in a [`LockKeys`] value, so the client's waiter
//! registry, grant router, heartbeat and watchdog carry them unchanged; the
//! family tells which scripts apply. Each script refuses the other
//! family's keys before it reads or writes anything
//! (`scripts/includes/key_family.lua`).
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<prefix>{<name>}:<family>:holders` | zset | holder owner id → lease deadline (server ms) |
//! | `<prefix>{<name>}:<family>:queue` | zset | waiter owner id → ticket |
//! | `<prefix>{<name>}:<family>:alive` | zset | client tag → heartbeat deadline (server ms); released owner id → when its release is forgotten (server ms), so a resent release is recognised |
//! | `<prefix>{<name>}:<family>:seq` | string | the last token or ticket issued |
//! | `<prefix>{<name>}:<family>:grants` | hash | holder owner id → fencing token; `limit` → the latest permit count |

use crate::keys::{KeyPrefix, LockKeys, LockName};

/// Which kind of permit set a [`LockKeys`] value names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PermitFamily {
    /// A fair semaphore: at most `permits` holders at once.
    Semaphore,
    /// A fair read-write lock: readers share, a writer holds alone.
    ReadWrite,
}

impl PermitFamily {
    /// The infix of the family's keys.
    fn infix(self) -> &'static str {
        match self {
            PermitFamily::Semaphore => ":sem:",
            PermitFamily::ReadWrite => ":rw:",
        }
    }
}

const HOLDERS: &str = "holders";
const SUFFIXES: [&str; 5] = [HOLDERS, "queue", "alive", "seq", "grants"];

impl LockKeys {
    /// The keys of permit set `name` of `family` under `prefix`. The first
    /// key (where a lock has its owner) is the holders set, and the last
    /// (where a lock has `freed`) the grants hash.
    pub fn permits(prefix: &KeyPrefix, name: &LockName, family: PermitFamily) -> Self {
        // The lock's own keys give the escaped hash tag: one escaping rule.
        let lock = LockKeys::new(prefix, name);
        let base = lock
            .owner()
            .strip_suffix(":owner")
            .unwrap_or(lock.owner())
            .to_owned();
        Self::from_parts(SUFFIXES.map(|suffix| format!("{base}{}{suffix}", family.infix())))
    }

    /// The keys of the permit set whose holders key is `holders_key`, as
    /// named in a grant message; `None` if it is not a holders key.
    pub fn from_holders_key(holders_key: &str) -> Option<Self> {
        let family = [PermitFamily::Semaphore, PermitFamily::ReadWrite]
            .into_iter()
            .find(|family| {
                holders_key
                    .strip_suffix(HOLDERS)
                    .is_some_and(|rest| rest.ends_with(family.infix()))
            })?;
        let base = holders_key
            .strip_suffix(HOLDERS)?
            .strip_suffix(family.infix())?;
        if !base.ends_with('}') || !base.contains('{') {
            return None;
        }
        Some(Self::from_parts(
            SUFFIXES.map(|suffix| format!("{base}{}{suffix}", family.infix())),
        ))
    }

    /// The permit family these keys belong to, or `None` for a lock's keys.
    pub fn permit_family(&self) -> Option<PermitFamily> {
        let holders = self.owner().strip_suffix(HOLDERS)?;
        [PermitFamily::Semaphore, PermitFamily::ReadWrite]
            .into_iter()
            .find(|family| holders.ends_with(family.infix()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_keep_apart_from_the_lock_and_in_its_slot() {
        let prefix = KeyPrefix::default();
        let name = LockName::new("a}b").unwrap();
        let lock = LockKeys::new(&prefix, &name);
        let sem = LockKeys::permits(&prefix, &name, PermitFamily::Semaphore);
        let rw = LockKeys::permits(&prefix, &name, PermitFamily::ReadWrite);
        assert_eq!(sem.owner(), "fairlock:{a%7Db}:sem:holders");
        assert_eq!(rw.all()[4], "fairlock:{a%7Db}:rw:grants");
        assert_eq!(sem.slot(), lock.slot());
        for key in sem.all().iter().chain(rw.all()) {
            assert!(!lock.all().contains(key), "{key}");
            assert_eq!(crate::key_slot(key.as_bytes()), lock.slot());
        }
        assert_eq!(lock.permit_family(), None);
        assert_eq!(sem.permit_family(), Some(PermitFamily::Semaphore));
        assert_eq!(rw.permit_family(), Some(PermitFamily::ReadWrite));
        assert_eq!(LockKeys::from_holders_key(sem.owner()), Some(sem.clone()));
        assert_eq!(LockKeys::from_holders_key(rw.owner()), Some(rw));
        assert_eq!(LockKeys::from_holders_key(lock.owner()), None);
        assert_eq!(LockKeys::from_holders_key("x:sem:holders"), None);
        assert_eq!(LockKeys::from_owner_key(sem.owner()), None);
    }
}
