//! Lock names fuzzed: whatever its bytes, a valid name gets five keys of its
//! own, all in one cluster slot, and an invalid one is refused.
//!
//! The generator leans on the characters that could break the key layout
//! (`{`, `}`, `%`, the escape sequences `%7D` and `%25`, `:` and the role
//! suffixes), so names that equal another lock's key suffix (`a}:owner`)
//! come up in nearly every case. Names are `&str`: binary names and invalid
//! UTF-8 cannot be expressed through the API (a separate issue).

use std::collections::HashMap;

use fairlock_core::{key_slot, KeyPrefix, LockKeys, LockName, NameError, MAX_NAME_BYTES};
use proptest::prelude::*;

/// Names made of the pieces that could collide after escaping.
fn tricky_name() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("%".to_owned()),
        Just("%7D".to_owned()),
        Just("%25".to_owned()),
        Just("7D".to_owned()),
        Just(":owner".to_owned()),
        Just(":queue".to_owned()),
        Just("}:seq".to_owned()),
        Just("a".to_owned()),
        Just("ü".to_owned()),
        Just("\u{0}".to_owned()),
        any::<char>().prop_map(String::from),
    ];
    proptest::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
}

/// Lengths around the limit, in one- and multi-byte characters.
fn sized_name() -> impl Strategy<Value = String> {
    prop_oneof![
        (0usize..4).prop_map(|n| "x".repeat(n)),
        (MAX_NAME_BYTES - 2..MAX_NAME_BYTES + 3).prop_map(|n| "}".repeat(n)),
        (MAX_NAME_BYTES / 2 - 1..MAX_NAME_BYTES / 2 + 2).prop_map(|n| "ü".repeat(n)),
    ]
}

fn any_name() -> impl Strategy<Value = String> {
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
            _ => prop_assert_eq!(result.map(|n| n.as_str().to_owned()), Ok(name)),
        }
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
    ];
    let prefix = KeyPrefix::default();
    let mut owners: HashMap<String, &str> = HashMap::new();
    for name in &listed {
        let keys = LockKeys::new(&prefix, &LockName::new(name.as_str()).unwrap());
        for key in keys.all() {
            assert_eq!(key_slot(key.as_bytes()), keys.slot(), "{name:?}: {key}");
            if let Some(other) = owners.insert(key.clone(), name) {
                panic!("{name:?} and {other:?} share {key}");
            }
        }
    }
    assert_eq!(owners.len(), listed.len() * 5);
    assert_eq!(LockName::new(""), Err(NameError::Empty));
    assert!(LockName::new("x".repeat(MAX_NAME_BYTES + 1)).is_err());
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
