//! Lock names, the key prefix, and the key layout of one lock.
//!
//! All keys of one lock share the hash tag `{<name>}`, so on Redis Cluster
//! they live in one slot and one script can touch them all. Scripts only
//! ever receive key names as KEYS, never build them from ARGV: cluster
//! routing and ACL key patterns depend on that.

use std::fmt;

/// The longest lock name accepted, in bytes.
///
/// Every key of a lock embeds its name and every queue entry is routed by
/// it, so names are kept short enough to be cheap.
pub const MAX_NAME_BYTES: usize = 512;

/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_BYTES: usize = 128;

/// Why a lock name or key prefix was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The lock name was empty.
    #[error("lock name is empty: give every lock a non-empty name, such as \"orders:42\"")]
    Empty,
    /// The lock name was longer than [`MAX_NAME_BYTES`].
    #[error(
        "lock name is {len} bytes long; the limit is {max} bytes (hash long identifiers first)"
    )]
    TooLong {
        /// Length of the refused name in bytes.
        len: usize,
        /// The limit, [`MAX_NAME_BYTES`].
        max: usize,
    },
    /// The key prefix was longer than [`MAX_PREFIX_BYTES`].
    #[error("key prefix is {len} bytes long; the limit is {max} bytes")]
    PrefixTooLong {
        /// Length of the refused prefix in bytes.
        len: usize,
        /// The limit, [`MAX_PREFIX_BYTES`].
        max: usize,
    },
    /// The key prefix contained `{` or `}`, which would break the hash tag.
    #[error("key prefix {0:?} contains '{{' or '}}': the prefix must not contain braces, fairlock adds the hash tag itself")]
    PrefixHasBraces(String),
}

/// A validated lock name: 1 to [`MAX_NAME_BYTES`] bytes of UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(String);

impl LockName {
    /// Validates `name`.
    pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
        let name = name.into();
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(NameError::TooLong {
                len: name.len(),
                max: MAX_NAME_BYTES,
            });
        }
        Ok(Self(name))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The namespace of all fairlock keys and channels, `fairlock:` by default.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyPrefix(String);

impl KeyPrefix {
    /// Validates `prefix`: at most [`MAX_PREFIX_BYTES`] bytes, no braces.
    pub fn new(prefix: impl Into<String>) -> Result<Self, NameError> {
        let prefix = prefix.into();
        if prefix.len() > MAX_PREFIX_BYTES {
            return Err(NameError::PrefixTooLong {
                len: prefix.len(),
                max: MAX_PREFIX_BYTES,
            });
        }
        if prefix.contains(['{', '}']) {
            return Err(NameError::PrefixHasBraces(prefix));
        }
        Ok(Self(prefix))
    }

    /// The prefix as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The pub/sub channel prefix: a client with tag `t` listens on
    /// `<prefix>notify:<t>`.
    pub fn channel_prefix(&self) -> String {
        format!("{}notify:", self.0)
    }
}

impl Default for KeyPrefix {
    fn default() -> Self {
        Self("fairlock:".to_owned())
    }
}

/// The four keys of one lock, in the order every script takes them.
///
/// | key | type | holds |
/// |---|---|---|
/// | `<prefix>{<name>}:owner` | hash | `id` (owner member), `token`; its TTL is the lease |
/// | `<prefix>{<name>}:queue` | zset | waiter member → ticket |
/// | `<prefix>{<name>}:alive` | zset | client tag → heartbeat deadline of that process (server ms) |
/// | `<prefix>{<name>}:fence` | hash | last `token`, last `ticket`, last `freed` member; never expires |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    keys: [String; 4],
}

impl LockKeys {
    /// The keys of lock `name` under `prefix`.
    pub fn new(prefix: &KeyPrefix, name: &LockName) -> Self {
        let base = format!("{}{{{}}}", prefix.as_str(), name.as_str());
        Self {
            keys: [
                format!("{base}:owner"),
                format!("{base}:queue"),
                format!("{base}:alive"),
                format!("{base}:fence"),
            ],
        }
    }

    /// The owner hash; its TTL is the current lease.
    pub fn owner(&self) -> &str {
        &self.keys[0]
    }

    /// The FIFO queue: member → ticket.
    pub fn queue(&self) -> &str {
        &self.keys[1]
    }

    /// Process liveness: client tag → heartbeat deadline.
    pub fn alive(&self) -> &str {
        &self.keys[2]
    }

    /// The never-expiring counters: fencing token, ticket, last release.
    pub fn fence(&self) -> &str {
        &self.keys[3]
    }

    /// All four keys, in script order.
    pub fn all(&self) -> &[String; 4] {
        &self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert_eq!(LockName::new(""), Err(NameError::Empty));
        assert!(LockName::new("x".repeat(MAX_NAME_BYTES)).is_ok());
        assert_eq!(
            LockName::new("x".repeat(MAX_NAME_BYTES + 1)),
            Err(NameError::TooLong {
                len: MAX_NAME_BYTES + 1,
                max: MAX_NAME_BYTES
            })
        );
        assert!(matches!(
            KeyPrefix::new("a{b"),
            Err(NameError::PrefixHasBraces(_))
        ));
    }

    #[test]
    fn all_keys_share_one_hash_tag() {
        let keys = LockKeys::new(
            &KeyPrefix::new("app:").unwrap(),
            &LockName::new("jobs").unwrap(),
        );
        for key in keys.all() {
            assert!(key.starts_with("app:{jobs}:"), "{key}");
        }
        assert_eq!(keys.fence(), "app:{jobs}:fence");
    }
}
