//! One primary's RedLock vote, as the client relies on it: the validity of
//! an attempt counts from before its votes, so every key that voted for it
//! must live a whole lease from then, also a key this owner id set in an
//! earlier attempt whose reply was lost (the client reuses the owner id
//! for every attempt of one `lock` call).

mod support;

use fairlock_core::{RedlockAcquire, ScriptCall};
use fairlock_testkit::RedisServer;

use support::{load_scripts, run_script};

#[test]
fn a_vote_on_the_callers_own_key_sets_its_lease_again() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let (owner, seq) = ("vote:redlock:{v}:owner", "vote:redlock:{v}:seq");
    let vote = |lease_ms| {
        let call = RedlockAcquire {
            owner_id: "0123456789abcdef0123456789abcdef",
            lease_ms,
            min_uptime_ms: 0,
        };
        run_script(&server, RedlockAcquire::SCRIPT, &[owner, seq], &call.args()).expect("vote")
    };
    // An earlier attempt's vote (its reply lost), with 2 s of lease left.
    vote(2_000);
    // The next attempt asks for 10 s: its vote must give the key 10 s from
    // now, or the attempt's validity (counted from its start) overstates
    // what this primary holds.
    vote(10_000);
    let pttl = server
        .cmd_ok(&["PTTL", owner])
        .expect("PTTL")
        .as_int()
        .expect("an integer");
    assert!(
        pttl > 9_000,
        "the key keeps the earlier attempt's lease: {pttl} ms left"
    );
}
