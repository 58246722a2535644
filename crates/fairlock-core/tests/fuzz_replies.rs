//! Reply decoding fuzzed: every call type's `decode`, and `decode_fenced`,
//! fed arbitrary reply trees, and valid replies truncated, extended or with
//! one field replaced. Decoding never panics; a reply that does not have
//! the shape its script's header promises is a `ProtocolError`.
//!
//! Documented leniency (asserted, so a change is noticed): fields after the
//! ones a script's header lists are ignored (forward compatibility), an
//! integer may arrive as its decimal string, and `inspect` reads its tail
//! as waiters in whole triples, ignoring a partial one.

use fairlock_core::{
    decode_fenced, Acquire, Cancel, ForceRelease, Heartbeat, Inspect, ProtocolError, Release,
    RenewBatch, Reply, ScriptCall,
};
use proptest::prelude::*;

fn any_reply() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(Reply::Int),
        (-3i64..5).prop_map(Reply::Int),
        ".{0,12}".prop_map(Reply::Str),
        (-3i64..5).prop_map(|i| Reply::Str(i.to_string())),
        Just(Reply::Nil),
    ];
    leaf.prop_recursive(3, 64, 10, |inner| {
        proptest::collection::vec(inner, 0..10).prop_map(Reply::Array)
    })
}

/// Every decoder, each result reduced to ok / protocol error.
fn decode_all(reply: &Reply) -> [(&'static str, Result<(), ProtocolError>); 8] {
    [
        ("acquire", Acquire::decode(reply.clone()).map(drop)),
        ("release", Release::decode(reply.clone()).map(drop)),
        ("heartbeat", Heartbeat::decode(reply.clone()).map(drop)),
        ("cancel", Cancel::decode(reply.clone()).map(drop)),
        (
            "force_release",
            ForceRelease::decode(reply.clone()).map(drop),
        ),
        ("inspect", Inspect::decode(reply.clone()).map(drop)),
        ("renew", RenewBatch::decode(reply.clone()).map(drop)),
        ("fenced", decode_fenced("fenced", reply.clone()).map(drop)),
    ]
}

fn ints(items: &[i64]) -> Vec<Reply> {
    items.iter().map(|&i| Reply::Int(i)).collect()
}

fn s(text: &str) -> Reply {
    Reply::Str(text.to_owned())
}

const MEMBER: &str = "0123456789abcdef0123456789abcdef.00000000000000ff.30000";

/// One valid reply of each script, as its header describes it, and how
/// many leading fields the header requires.
fn valid_replies() -> Vec<(&'static str, Vec<Reply>, usize)> {
    vec![
        ("acquire", ints(&[1, 7]), 2),
        ("acquire", ints(&[2, 10, 3, 1, 0]), 5),
        ("acquire", ints(&[3, 0, 1]), 3),
        (
            "release",
            vec![
                Reply::Int(1),
                Reply::Int(0),
                Reply::Int(0),
                s(MEMBER),
                Reply::Int(9),
                Reply::Int(1),
            ],
            6,
        ),
        ("release", ints(&[0]), 1),
        (
            "heartbeat",
            vec![
                s(MEMBER),
                Reply::Int(9),
                Reply::Int(1),
                Reply::Int(0),
                Reply::Int(0),
            ],
            5,
        ),
        ("cancel", ints(&[1, 0, 2, 1]), 4),
        (
            "force_release",
            vec![Reply::Int(1), s(MEMBER), Reply::Int(0), Reply::Int(0)],
            4,
        ),
        (
            "inspect",
            vec![
                s(MEMBER),
                Reply::Int(9),
                Reply::Int(2_500),
                Reply::Int(1),
                Reply::Int(9),
                Reply::Int(1_700_000_000_000),
                s(MEMBER),
                s("10"),
                Reply::Int(-1),
            ],
            6,
        ),
        ("fenced", ints(&[0, 12]), 2),
    ]
}

fn decode_one(script: &str, reply: Reply) -> Result<(), ProtocolError> {
    match script {
        "acquire" => Acquire::decode(reply).map(drop),
        "release" => Release::decode(reply).map(drop),
        "heartbeat" => Heartbeat::decode(reply).map(drop),
        "cancel" => Cancel::decode(reply).map(drop),
        "force_release" => ForceRelease::decode(reply).map(drop),
        "inspect" => Inspect::decode(reply).map(drop),
        "renew" => RenewBatch::decode(reply).map(drop),
        _ => decode_fenced("fenced", reply).map(drop),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

    /// Any tree: no decoder panics, and anything but an array is refused.
    #[test]
    fn arbitrary_replies_never_panic(reply in any_reply()) {
        for (script, result) in decode_all(&reply) {
            if !matches!(reply, Reply::Array(_)) {
                prop_assert!(result.is_err(), "{} accepted a non-array {:?}", script, reply);
            }
            if let Err(error) = result {
                prop_assert!(!error.detail.is_empty());
            }
        }
    }

    /// A valid reply cut short of the fields its header requires is refused;
    /// one with extra fields after them is read as the valid one.
    #[test]
    fn truncated_replies_are_refused_extended_ones_read(
        pick in 0usize..10,
        cut in 1usize..6,
        extra in proptest::collection::vec(any_reply(), 1..4),
    ) {
        let replies = valid_replies();
        let (script, fields, required) = &replies[pick % replies.len()];
        prop_assert!(decode_one(script, Reply::Array(fields.clone())).is_ok(), "{}", script);
        let kept = required.saturating_sub(cut);
        let short = Reply::Array(fields[..kept].to_vec());
        prop_assert!(decode_one(script, short.clone()).is_err(), "{} accepted {:?}", script, short);
        // inspect's tail is its list of waiters: extra fields there are
        // read as waiters, not ignored.
        if *script != "inspect" {
            let mut long = fields.clone();
            long.extend(extra);
            prop_assert!(decode_one(script, Reply::Array(long)).is_ok(), "{} refused extra fields", script);
        }
    }

    /// A required field replaced by a value of the wrong kind (an array,
    /// a negative count, text where a number belongs) never panics, and is
    /// refused wherever the header promises a number.
    #[test]
    fn one_field_replaced_never_panics(
        pick in 0usize..10,
        at in 0usize..9,
        with in any_reply(),
    ) {
        let replies = valid_replies();
        let (script, fields, required) = &replies[pick % replies.len()];
        let at = at % required;
        let mut fields = fields.clone();
        let numeric = matches!(fields[at], Reply::Int(_));
        let is_int = matches!(&with, Reply::Int(_))
            || matches!(&with, Reply::Str(t) if t.parse::<i64>().is_ok());
        fields[at] = with.clone();
        let result = decode_one(script, Reply::Array(fields));
        if numeric && !is_int {
            prop_assert!(result.is_err(), "{} field {} accepted {:?}", script, at, with);
        }
    }
}

#[test]
fn negative_counts_and_tokens_are_refused() {
    assert!(Acquire::decode(Reply::Array(ints(&[1, -7]))).is_err());
    assert!(Acquire::decode(Reply::Array(ints(&[2, 10, -1, 0, 0]))).is_err());
    assert!(Release::decode(Reply::Array(vec![
        Reply::Int(1),
        Reply::Int(-1),
        Reply::Int(0),
        s(""),
        Reply::Int(0),
        Reply::Int(0)
    ]))
    .is_err());
    assert!(RenewBatch::decode(Reply::Array(ints(&[1, 2]))).is_err());
    assert!(decode_fenced("f", Reply::Array(ints(&[0, -5]))).is_err());
    assert!(decode_fenced("f", Reply::Array(vec![])).is_err());
    assert!(decode_fenced("f", Reply::Nil).is_err());
}
