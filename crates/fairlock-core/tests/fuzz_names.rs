//! Lock names fuzzed: whatever its bytes, a valid name gets five keys of its
//! own, all in one cluster slot, and an invalid one is refused.
//!
//! The generator leans on the characters that could break the key layout
//! (`{`, `}`, `%`, the escape sequences `%7D` and `%25`, `:` and the role
//! suffixes), so names that equal another lock's key suffix (`a}:owner`)
//! come up in nearly every case. Names are bytes: the generator mixes in
//! bytes that are not UTF-8 (lone continuation bytes, cut multi-byte
//! sequences, `0xFF`) and the text that spells their escapes (`%FF`, `%80`),
//! so a binary name and the text of its escape are tried against each other.

use std::collections::HashMap;

use fairlock_core::{key_slot, KeyPrefix, LockKeys, LockName, NameError, MAX_NAME_BYTES};
use proptest::prelude::*;

/// Names made of the pieces that could collide after escaping.
fn tricky_name() -> impl Strategy<Value = Vec<u8>> {
    let text = |s: &str| Just(s.as_bytes().to_vec());
    let piece = prop_oneof![
        text("{"),
        text("}"),
        text("%"),
        text("%7D"),
        text("%25"),
        text("7D"),
        text("%FF"),
        text("%80"),
        text("%C3"),
        text(":owner"),
        text(":queue"),
        text("}:seq"),
        text("a"),
        text("ü"),
        text("\u{0}"),
        // Not UTF-8: a lone continuation byte, 0xFF, the first byte of
        // "ü" without its second, and a surrogate's encoding.
        Just(vec![0x80]),
        Just(vec![0xFF]),
        Just(vec![0xC3]),
        Just(vec![0xED, 0xA0, 0x80]),
        any::<u8>().prop_map(|b| vec![b]),
        any::<char>().prop_map(|c| c.to_string().into_bytes()),
    ];
    proptest::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
}

/// Lengths around the limit, in one- and multi-byte characters and in
/// bytes that are not UTF-8.
fn sized_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (0usize..4).prop_map(|n| "x".repeat(n).into_bytes()),
        (MAX_NAME_BYTES - 2..MAX_NAME_BYTES + 3).prop_map(|n| "}".repeat(n).into_bytes()),
        (MAX_NAME_BYTES / 2 - 1..MAX_NAME_BYTES / 2 + 2).prop_map(|n| "ü".repeat(n).into_bytes()),
        (MAX_NAME_BYTES - 2..MAX_NAME_BYTES + 3).prop_map(|n| vec![0xFF; n]),
    ]
}

fn any_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![3 => tricky_name(), 1 => sized_name()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

    /// A name is valid exactly when it has 1 to MAX_NAME_BYTES bytes.
    #[test]
    fn validity_follows_the_byte_length(name in any_name()) {
        let result = LockName::new(name.clone());
        match name.len() {
            0 => prop_assert_eq!(result, Err(NameError::Empty)),
            len if len > MAX_NAME_BYTES => prop_assert_eq!(
                result,
                Err(NameError::TooLong { len, max: MAX_NAME_BYTES })
            ),
            _ => prop_assert_eq!(result.map(|n| n.as_bytes().to_vec()), Ok(name)),
        }
    }

    /// The key layout is reversible: the hash tag of a name's keys decodes
    /// to that name and no other, and a text name reads the same as text.
    #[test]
    fn the_hash_tag_decodes_to_the_name(name in any_name()) {
        let Ok(name) = LockName::new(name) else { return Ok(()) };
        let keys = LockKeys::new(&KeyPrefix::default(), &name);
        let tag = keys
            .owner()
            .strip_prefix("fairlock:{")
            .and_then(|rest| rest.strip_suffix("}:owner"))
            .expect("the owner key is <prefix>{<tag>}:owner");
        prop_assert_eq!(LockName::from_tag(tag), Some(name.clone()));
        prop_assert_eq!(name.to_str().is_some(), std::str::from_utf8(name.as_bytes()).is_ok());
    }

    /// Every key of one name hashes to the slot of the lock, and the owner
    /// key gives back the same keys.
    #[test]
    fn all_keys_of_a_name_share_one_slot(name in any_name(), prefix in "[a-z:]{0,8}") {
        let Ok(name) = LockName::new(name) else { return Ok(()) };
        let keys = LockKeys::new(&KeyPrefix::new(prefix).unwrap(), &name);
        for key in keys.all() {
            prop_assert_eq!(key_slot(key.as_bytes()), keys.slot(), "{}", key);
        }
        prop_assert_eq!(LockKeys::from_owner_key(keys.owner()), Some(keys.clone()));
    }

    /// Two different names never share a key, whatever role the key plays.
    #[test]
    fn different_names_never_share_a_key(a in any_name(), b in any_name()) {
        let (Ok(a), Ok(b)) = (LockName::new(a), LockName::new(b)) else { return Ok(()) };
        prop_assume!(a != b);
        let prefix = KeyPrefix::default();
        let (ka, kb) = (LockKeys::new(&prefix, &a), LockKeys::new(&prefix, &b));
        for key in ka.all() {
            prop_assert!(!kb.all().contains(key), "{:?} and {:?} share {}", a, b, key);
        }
    }
}

/// The fixed list of the issue, all at once: no two names share a key.
#[test]
fn the_listed_names_have_keys_of_their_own() {
    let listed = [
        "x".to_owned(),
        "x".repeat(MAX_NAME_BYTES),
        "ü".repeat(MAX_NAME_BYTES / 2),
        "{".to_owned(),
        "}".to_owned(),
        "{}".to_owned(),
        "}{".to_owned(),
        "%".to_owned(),
        "%7D".to_owned(),
        "%25".to_owned(),
        "a".to_owned(),
        "a}:owner".to_owned(),
        "a}:queue".to_owned(),
        "a%7D:owner".to_owned(),
        "日本語のロック".to_owned(),
        "\u{0}".to_owned(),
    ]
    .map(String::into_bytes);
    // Binary names, against the text that spells their escapes above and
    // against each other: both render as "a\u{FFFD}" for people.
    let binary = [
        b"\xff".to_vec(),
        b"%FF".to_vec(),
        b"%25FF".to_vec(),
        b"a\xff".to_vec(),
        b"a\xfe".to_vec(),
        b"a\xc3".to_vec(),
        b"\xc3\xbc\xc3".to_vec(),
        vec![0xFF; MAX_NAME_BYTES],
    ];
    let listed: Vec<Vec<u8>> = listed.into_iter().chain(binary).collect();
    let prefix = KeyPrefix::default();
    let mut owners: HashMap<String, &[u8]> = HashMap::new();
    for name in &listed {
        let keys = LockKeys::new(&prefix, &LockName::new(name).unwrap());
        for key in keys.all() {
            assert_eq!(key_slot(key.as_bytes()), keys.slot(), "{key}");
            if let Some(other) = owners.insert(key.clone(), name) {
                panic!(
                    "{:?} and {:?} share {key}",
                    name.escape_ascii().to_string(),
                    other.escape_ascii().to_string()
                );
            }
        }
    }
    assert_eq!(owners.len(), listed.len() * 5);
    assert_eq!(LockName::new(""), Err(NameError::Empty));
    assert_eq!(LockName::new(b""), Err(NameError::Empty));
    assert!(LockName::new("x".repeat(MAX_NAME_BYTES + 1)).is_err());
    assert!(LockName::new(vec![0xFF; MAX_NAME_BYTES + 1]).is_err());
    // Only the spelling fairlock writes decodes: no second tag per name.
    assert_eq!(LockName::from_tag("%41"), None);
    assert_eq!(LockName::from_tag("%ff"), None);
    assert_eq!(LockName::from_tag("a}b"), None);
    assert_eq!(LockName::from_tag("%2"), None);
    assert_eq!(LockName::from_tag(""), None);
}

/// Slots Redis itself computes (`CLUSTER KEYSLOT` on a Redis 7.0
/// cluster node; `tests/tests/fuzz_and_bad_input.rs` asks a live node for
/// every fuzzed name too).
#[test]
fn slots_match_redis() {
    for (key, slot) in [
        ("foo", 12182),
        ("{user1000}.following", 3443),
        ("fairlock:{orders:42}:owner", 11414),
        ("a{}b", 13694),
        ("fairlock:{%7D}:owner", 14708),
        ("fairlock:{ü}:seq", 9552),
    ] {
        assert_eq!(key_slot(key.as_bytes()), slot, "{key}");
    }
}
