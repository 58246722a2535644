//! A permit set remembers each release (in its `alive` key) for the
//! caller's `remember_ms`, so that the same release sent again is answered
//! released. Enqueues and heartbeats refresh that key's TTL to the queue
//! TTL: they must never shorten it below a remembered release's time, or
//! a resend within it would answer `NotHolder` (a lease counted lost for a
//! release that ran), with a queue TTL shorter than the remember time
//! (a client whose command timeout is longer than its waiter timeout).

mod support;

use fairlock_core::{
    AcquireMode, KeyPrefix, LockKeys, LockName, PermitAcquire, PermitFamily, PermitOwnerId,
    PermitRelease, PermitRequest, ScriptCall, Timings,
};
use fairlock_testkit::RedisServer;

use support::{load_scripts, run_script};

const REMEMBER_MS: u64 = 40_000;

fn owner(tag: &str) -> PermitOwnerId {
    PermitOwnerId::new(&tag.repeat(2), tag, 30_000, PermitRequest::Shared(1)).expect("owner id")
}

#[test]
fn an_enqueue_does_not_cut_short_a_remembered_release() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let keys = LockKeys::permits(
        &KeyPrefix::new("memory:").expect("prefix"),
        &LockName::new("remembered").expect("name"),
        PermitFamily::Semaphore,
    );
    let key_list: Vec<&str> = keys.all().iter().map(String::as_str).collect();
    // A 1 s waiter TTL and a 4 s queue TTL: far below the 40 s memory.
    let timings = Timings::new(1_000, 4_000, 600_000).expect("timings");
    let acquire = |owner: &PermitOwnerId| {
        let call = PermitAcquire {
            owner_id: owner.as_str(),
            mode: AcquireMode::Wait,
            timings: &timings,
            channel_prefix: "memory:notify:",
            rejoin: None,
        };
        run_script(&server, PermitAcquire::SCRIPT, &key_list, &call.args()).expect("acquire")
    };
    let (first, second, third) = (
        owner("00000000000000a1"),
        owner("00000000000000b2"),
        owner("00000000000000c3"),
    );
    // One permit: the first holder releases, the second takes it, the
    // third queues behind it.
    acquire(&first);
    let release = PermitRelease {
        owner_id: first.as_str(),
        timings: &timings,
        channel_prefix: "memory:notify:",
        remember_ms: REMEMBER_MS,
    };
    run_script(&server, PermitRelease::SCRIPT, &key_list, &release.args()).expect("release");
    acquire(&second);
    acquire(&third);
    let alive = keys.alive().to_owned();
    let ttl = server
        .cmd_ok(&["PTTL", &alive])
        .expect("PTTL")
        .as_int()
        .expect("an integer");
    assert!(
        ttl >= REMEMBER_MS as i64 - 1_000,
        "the enqueue cut the remembered release's key to {ttl} ms"
    );
    // The release sent again is still recognised.
    let again = run_script(&server, PermitRelease::SCRIPT, &key_list, &release.args())
        .expect("release again");
    assert!(
        matches!(
            PermitRelease::decode(again),
            Ok(fairlock_core::PermitReleaseReply::Released { .. })
        ),
        "the resend is answered released"
    );
}
