//! A waiter's or holder's identity as the scripts store and read it.

/// A waiter's or holder's identity as stored in Redis: its random nonce,
/// the client tag of its process and the lease it asked for,
/// `<nonce, 32 hex>.<client tag, 16 hex>.<lease ms>`.
///
/// The lease travels inside it, so a release can hand the lock to this
/// owner id with its own lease, and the tag routes grants to its process.
///
/// ```
/// let owner_id = fairlock_core::OwnerId::new("0123456789abcdef0123456789abcdef", "00000000000000ff", 30_000);
/// assert_eq!(owner_id.as_str(), "0123456789abcdef0123456789abcdef.00000000000000ff.30000");
/// assert_eq!(fairlock_core::OwnerId::tag_of(owner_id.as_str()), Some("00000000000000ff"));
/// assert_eq!(fairlock_core::OwnerId::nonce_of(owner_id.as_str()), Some("0123456789abcdef0123456789abcdef"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(String);

impl OwnerId {
    /// Builds an owner id from its parts.
    pub fn new(nonce: &str, tag: &str, lease_ms: u64) -> Self {
        Self(format!("{nonce}.{tag}.{lease_ms}"))
    }

    /// The owner id as stored in Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The client tag (process) of a stored owner id.
    pub fn tag_of(owner_id: &str) -> Option<&str> {
        let mut parts = owner_id.split('.');
        let (_, tag, _) = (parts.next()?, parts.next()?, parts.next()?);
        Some(tag)
    }

    /// The nonce of a stored owner id.
    pub fn nonce_of(owner_id: &str) -> Option<&str> {
        owner_id.split('.').next().filter(|id| !id.is_empty())
    }

    /// Whether `owner_id` has the form fairlock writes and its scripts
    /// read (hex nonce, hex tag, a lease in ms without a leading zero, at
    /// most [`MAX_OWNER_ID_BYTES`]): anything else names no holder fairlock
    /// could have granted.
    ///
    /// ```
    /// use fairlock_core::OwnerId;
    /// assert!(OwnerId::is_well_formed("0a1b.00ff.30000"));
    /// assert!(!OwnerId::is_well_formed("x"));
    /// assert!(!OwnerId::is_well_formed("0a1b.00ff.030000"));
    /// ```
    pub fn is_well_formed(owner_id: &str) -> bool {
        let hex = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_hexdigit());
        let mut parts = owner_id.split('.');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(nonce), Some(tag), Some(lease), None) => {
                owner_id.len() <= MAX_OWNER_ID_BYTES
                    && hex(nonce)
                    && hex(tag)
                    && !lease.starts_with('0')
                    && lease.parse::<u64>().is_ok_and(|ms| ms > 0)
            }
            _ => false,
        }
    }
}

/// The longest owner id [`OwnerId::is_well_formed`] accepts; fairlock's
/// own are 70 bytes at most.
pub const MAX_OWNER_ID_BYTES: usize = 128;

impl std::fmt::Display for OwnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_carry_tag_and_lease() {
        let owner_id = OwnerId::new("ab", "cd", 7);
        assert_eq!(owner_id.as_str(), "ab.cd.7");
        assert_eq!(OwnerId::tag_of("ab.cd.7"), Some("cd"));
        assert_eq!(OwnerId::tag_of("garbage"), None);
    }
}
