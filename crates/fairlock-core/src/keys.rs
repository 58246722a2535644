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
    #[error("key prefix is {len} bytes long; the limit is {max} bytes: choose a shorter prefix")]
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

/// A validated lock name: 1 to [`MAX_NAME_BYTES`] bytes, any bytes
/// (invalid UTF-8 included).
///
/// Names compare, hash and order by their bytes. Text names are the common
/// case, so the name also keeps a text form for messages and metrics:
/// [`LockName::as_str`] is the name itself when it is UTF-8, and a lossy
/// rendering (invalid bytes as U+FFFD) otherwise; [`LockName::as_bytes`]
/// is always exact.
///
/// ```
/// use fairlock_core::LockName;
/// let text = LockName::new("orders:42")?;
/// assert_eq!(text.as_str(), "orders:42");
/// let binary = LockName::new(b"job\xff\x00")?;
/// assert_eq!(binary.as_bytes(), b"job\xff\x00");
/// assert_eq!(binary.to_str(), None);
/// assert_eq!(binary.as_str(), "job\u{fffd}\u{0}");
/// # Ok::<(), fairlock_core::NameError>(())
/// ```
#[derive(Clone)]
pub struct LockName {
    /// The name if it is UTF-8, else its lossy rendering.
    text: String,
    /// The exact bytes, only when the name is not UTF-8.
    binary: Option<Box<[u8]>>,
}

impl LockName {
    /// Validates `name`: any bytes (`&str`, `String`, `&[u8]`, `Vec<u8>`,
    /// byte literals), 1 to [`MAX_NAME_BYTES`] of them.
    pub fn new(name: impl AsRef<[u8]>) -> Result<Self, NameError> {
        let bytes = name.as_ref();
        if bytes.is_empty() {
            return Err(NameError::Empty);
        }
        if bytes.len() > MAX_NAME_BYTES {
            return Err(NameError::TooLong {
                len: bytes.len(),
                max: MAX_NAME_BYTES,
            });
        }
        Ok(match std::str::from_utf8(bytes) {
            Ok(text) => Self {
                text: text.to_owned(),
                binary: None,
            },
            Err(_) => Self {
                text: String::from_utf8_lossy(bytes).into_owned(),
                binary: Some(bytes.into()),
            },
        })
    }

    /// The name's exact bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.binary.as_deref().unwrap_or(self.text.as_bytes())
    }

    /// The name as text, `None` if it is not UTF-8.
    pub fn to_str(&self) -> Option<&str> {
        self.binary.is_none().then_some(self.text.as_str())
    }

    /// The name as text for people: the name itself when it is UTF-8,
    /// otherwise a lossy rendering (two binary names may render alike; use
    /// [`LockName::as_bytes`] to tell them apart).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The name whose keys carry hash tag `tag` (as in
    /// `<prefix>{<tag>}:owner`); `None` if `tag` is not one fairlock
    /// makes. The inverse of the escaping in [`LockKeys::new`].
    ///
    /// ```
    /// use fairlock_core::{KeyPrefix, LockKeys, LockName};
    /// let name = LockName::new(b"a}%\xff")?;
    /// let keys = LockKeys::new(&KeyPrefix::default(), &name);
    /// assert_eq!(keys.owner(), "fairlock:{a%7D%25%FF}:owner");
    /// assert_eq!(LockName::from_tag("a%7D%25%FF"), Some(name));
    /// # Ok::<(), fairlock_core::NameError>(())
    /// ```
    pub fn from_tag(tag: &str) -> Option<Self> {
        let mut bytes = Vec::with_capacity(tag.len());
        let mut rest = tag.as_bytes();
        while let Some((&first, tail)) = rest.split_first() {
            if first == b'}' {
                return None;
            }
            if first != b'%' {
                bytes.push(first);
                rest = tail;
                continue;
            }
            let hex = tail.get(..2)?;
            let byte = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            bytes.push(byte);
            rest = &tail[2..];
        }
        let name = Self::new(bytes).ok()?;
        // Only the one spelling fairlock writes maps back (e.g. `%41` for
        // `A` is not one), so a tag names one lock or none.
        (escape_tag(name.as_bytes()) == tag).then_some(name)
    }
}

/// A checked name is bytes too, so it can be passed wherever a name is
/// taken as `impl AsRef<[u8]>`.
impl AsRef<[u8]> for LockName {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialEq for LockName {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for LockName {}

impl std::hash::Hash for LockName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialOrd for LockName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LockName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.binary {
            None => f.debug_tuple("LockName").field(&self.text).finish(),
            Some(bytes) => write!(f, "LockName(b\"{}\")", bytes.escape_ascii()),
        }
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
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

    /// The pub/sub channel prefix on a single server: a client with tag `t`
    /// listens on `<prefix>notify:<t>`, and scripts `PUBLISH` to it.
    pub fn channel_prefix(&self) -> String {
        format!("{}notify:", self.0)
    }

    /// The sharded pub/sub channel prefix for locks in cluster slot `slot`:
    /// `<prefix>notify:{<tag>}:`, where the hash tag is chosen to land in
    /// `slot`. A client with tag `t` listens on that prefix plus `t` with
    /// `SSUBSCRIBE` once per slot it waits in (not per lock), and scripts
    /// `SPUBLISH` there, so a grant never crosses the cluster bus.
    pub fn sharded_channel_prefix(&self, slot: u16) -> String {
        format!("{}notify:{{{}}}:", self.0, slot_tag(slot))
    }
}

impl Default for KeyPrefix {
    fn default() -> Self {
        Self("fairlock:".to_owned())
    }
}

/// The five keys of one lock, in the order every lock script takes them.
///
/// | key | type | holds |
/// |---|---|---|
/// | `<prefix>{<name>}:owner` | string | `<owner id> <token>`; its TTL is the lease |
/// | `<prefix>{<name>}:queue` | zset | waiter owner id → ticket |
/// | `<prefix>{<name>}:alive` | zset | client tag → heartbeat deadline of that process (server ms) |
/// | `<prefix>{<name>}:seq` | string | the last token or ticket issued; expires when idle |
/// | `<prefix>{<name>}:freed` | string | the owner ids of the last 8 releases, newest first, space-separated; expires when idle |
///
/// The name inside the braces is escaped (`%` → `%25`, `}` → `%7D`, and
/// each byte that is not part of valid UTF-8 → `%XX`), so every name,
/// whatever its bytes, yields a non-empty UTF-8 hash tag of its own (see
/// [`LockName::from_tag`] for the way back): all keys of a lock hash to one
/// cluster slot, and two names never share a key. Text names without `%`
/// or `}` appear in their keys as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    keys: [String; 5],
    slot: u16,
}

impl LockKeys {
    /// The keys of lock `name` under `prefix`.
    pub fn new(prefix: &KeyPrefix, name: &LockName) -> Self {
        let tag = escape_tag(name.as_bytes());
        let base = format!("{}{{{}}}", prefix.as_str(), tag);
        Self {
            keys: [
                format!("{base}:owner"),
                format!("{base}:queue"),
                format!("{base}:alive"),
                format!("{base}:seq"),
                format!("{base}:freed"),
            ],
            slot: key_slot(base.as_bytes()),
        }
    }

    /// The keys of the lock whose owner key is `owner_key`, as named in a
    /// grant message; `None` if it is not an owner key.
    pub fn from_owner_key(owner_key: &str) -> Option<Self> {
        let base = owner_key.strip_suffix(":owner")?;
        if !base.ends_with('}') || !base.contains('{') {
            return None;
        }
        Some(Self {
            keys: [
                owner_key.to_owned(),
                format!("{base}:queue"),
                format!("{base}:alive"),
                format!("{base}:seq"),
                format!("{base}:freed"),
            ],
            slot: key_slot(base.as_bytes()),
        })
    }

    /// Keys laid out by another script family (see `permit_keys.rs`): five
    /// keys that share one hash tag, in that family's script order.
    pub(crate) fn from_parts(keys: [String; 5]) -> Self {
        let slot = key_slot(keys[0].as_bytes());
        Self { keys, slot }
    }

    /// The owner key; its TTL is the current lease.
    pub fn owner(&self) -> &str {
        &self.keys[0]
    }

    /// The FIFO queue: owner id → ticket.
    pub fn queue(&self) -> &str {
        &self.keys[1]
    }

    /// Process liveness: client tag → heartbeat deadline.
    pub fn alive(&self) -> &str {
        &self.keys[2]
    }

    /// The sequence counter of tokens and tickets.
    pub fn seq(&self) -> &str {
        &self.keys[3]
    }

    /// The owner ids of the last 8 releases, newest first.
    pub fn freed(&self) -> &str {
        &self.keys[4]
    }

    /// All five keys, in script order.
    pub fn all(&self) -> &[String; 5] {
        &self.keys
    }

    /// The Redis Cluster slot all the keys hash to.
    pub fn slot(&self) -> u16 {
        self.slot
    }
}

/// The name as it stands inside the hash tag: `%`, `}` and every byte of
/// invalid UTF-8 percent-escaped, so the tag ends where fairlock ends it,
/// stays non-empty, and decodes to exactly one name (a `%` in a tag always
/// starts an escape).
fn escape_tag(name: &[u8]) -> String {
    let mut tag = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '%' => tag.push_str("%25"),
                '}' => tag.push_str("%7D"),
                c => tag.push(c),
            }
        }
        for byte in chunk.invalid() {
            tag.push_str(&format!("%{byte:02X}"));
        }
    }
    tag
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, or of
/// the whole key when it has no non-empty tag, modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16_xmodem(hashed) % 16_384
}

/// A short string whose cluster slot is `slot` (every slot has one), for
/// naming a channel that lives in a given slot.
pub fn slot_tag(slot: u16) -> &'static str {
    static TAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); 16_384];
        let mut missing = tags.len();
        let mut n: u64 = 0;
        while missing > 0 {
            let tag = format!("{n:x}");
            let slot = usize::from(key_slot(tag.as_bytes()));
            if tags[slot].is_empty() {
                tags[slot] = tag;
                missing -= 1;
            }
            n += 1;
        }
        tags
    });
    &tags[usize::from(slot % 16_384)]
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
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
        assert_eq!(keys.seq(), "app:{jobs}:seq");
        assert_eq!(LockKeys::from_owner_key(keys.owner()), Some(keys));
        assert_eq!(LockKeys::from_owner_key("app:{jobs}:queue"), None);
    }

    #[test]
    fn every_slot_has_a_channel_tag() {
        for slot in [0, 1, 777, 16_383] {
            let prefix = KeyPrefix::default().sharded_channel_prefix(slot);
            assert_eq!(
                key_slot(format!("{prefix}00ff").as_bytes()),
                slot,
                "{prefix}"
            );
        }
    }

    #[test]
    fn every_name_keeps_its_keys_in_one_slot_and_apart() {
        // Redis's own examples: CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        let prefix = KeyPrefix::default();
        let mut seen = std::collections::HashSet::new();
        for name in [
            "}x", "{", "}", "{}", "}{", "%7D", "a}:owner", "a", "%", "%25", "ü",
        ] {
            let keys = LockKeys::new(&prefix, &LockName::new(name).unwrap());
            for key in keys.all() {
                assert_eq!(key_slot(key.as_bytes()), keys.slot(), "{name:?}: {key}");
                assert!(seen.insert(key.clone()), "{name:?} shares {key}");
            }
        }
    }
}
