//! Arguments a program on `fairlock-core` can build through its public
//! types but the `fairlock` client never sends (its own ids, leases and
//! tokens are always in range): each script refuses them before its first
//! write, so Redis is left as it was. A review that ran each script with
//! such values found them taken, with a lock left granted to an owner id
//! no later call could use, a fence no later token could pass, or one
//! lock of a batch renewed before the call failed.

mod support;

use fairlock_core::{
    Acquire, AcquireMode, Cancel, FencedOp, FencedWrite, ForceRelease, Heartbeat, HeartbeatBatch,
    HeartbeatItem, Inspect, KeyPrefix, LockKeys, LockName, OwnerId, PermitAcquire, PermitCancel,
    PermitFamily, PermitHeartbeat, PermitOwnerId, PermitRelease, PermitRenewBatch, PermitRenewItem,
    PermitRequest, RedlockAcquire, RedlockFence, RedlockRenew, Release, ReleaseReply, RenewBatch,
    RenewItem, Reply, Script, ScriptCall, Timings,
};
use fairlock_testkit::{RedisServer, Resp};

use support::{load_scripts, run_script};

const CHANNEL_PREFIX: &str = "bad:notify:";

fn keys(name: &str) -> LockKeys {
    let prefix = KeyPrefix::new("bad:").expect("prefix");
    LockKeys::new(&prefix, &LockName::new(name).expect("name"))
}

fn key_list(keys: &LockKeys) -> Vec<&str> {
    keys.all().iter().map(String::as_str).collect()
}

/// Type, value and TTL of each key, to compare before and after a call.
fn dump(server: &RedisServer, keys: &[&str]) -> Vec<String> {
    keys.iter()
        .map(|key| {
            let value = server.cmd(&["DUMP", key]).expect("DUMP");
            let ttl = server.cmd(&["PTTL", key]).expect("PTTL");
            // The TTL to the second: a call that renews shows, time passing
            // between the two dumps does not.
            let ttl = ttl.as_int().map(|ms| (ms + 500) / 1000);
            format!("{key}: {value:?} ttl {ttl:?}")
        })
        .collect()
}

/// A call refused with an error that mentions `needle`; `what` names it.
fn assert_refused(result: Result<Reply, String>, needle: &str, what: &str) {
    match result {
        Err(message) => assert!(message.contains(needle), "{what}: {message}"),
        Ok(reply) => panic!("{what} was taken: {reply:?}"),
    }
}

fn acquire(server: &RedisServer, keys: &LockKeys, owner_id: &str) -> Result<Reply, String> {
    support::acquire_wait(server, keys, owner_id, CHANNEL_PREFIX)
}

/// An owner id over 128 bytes (`OwnerId::is_well_formed`'s limit) was
/// granted a free lock or queued, and every later call read its owner
/// value as another program's: its own release answered "not owner", the
/// others got WRONGTYPE until the lease ran out.
#[test]
fn an_owner_id_over_128_bytes_is_refused_before_any_write() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let long = OwnerId::new(&"ab".repeat(60), "00000000000000ff", 30_000);
    assert!(long.as_str().len() > 128);
    let holder = OwnerId::new(&"cd".repeat(16), "00000000000000aa", 30_000);

    // A free lock, then a held one (the join).
    let free = keys("long-free");
    let held = keys("long-held");
    acquire(&server, &held, holder.as_str()).expect("held");
    for k in [&free, &held] {
        let before = dump(&server, &key_list(k));
        assert_refused(
            acquire(&server, k, long.as_str()),
            "malformed owner id",
            &format!("a {}-byte owner id", long.as_str().len()),
        );
        assert_eq!(dump(&server, &key_list(k)), before, "Redis unchanged");
    }
}

/// A release sent again as one already answered (`ReleaseAgain`) with an
/// owner id no lock could ever have had (empty, with a space, over 128
/// bytes: a program on `fairlock-core` could send one; the client never
/// does) records nothing when the counter it would renew is missing: such
/// an id would have split or emptied the lock's record of its last
/// releases (found by a review of that record on 2026-11-29).
#[test]
fn a_release_sent_again_records_no_malformed_owner_id() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let timings = Timings::default();
    let k = keys("record");
    let holder = OwnerId::new(&"cd".repeat(16), "00000000000000aa", 30_000);
    acquire(&server, &k, holder.as_str()).expect("held");
    let release = |owner_id: &str, again: bool| {
        let call = Release {
            owner_id,
            timings: &timings,
            channel_prefix: CHANNEL_PREFIX,
            reply_to: "",
        };
        let args = match again {
            true => fairlock_core::ReleaseAgain(call).args(),
            false => call.args(),
        };
        run_script(&server, Release::SCRIPT, &key_list(&k), &args)
    };
    release(holder.as_str(), false).expect("released");
    let long = "ab".repeat(70);
    for bad in ["", "a b", long.as_str()] {
        server.cmd(&["DEL", k.seq()]).expect("DEL seq");
        let before = dump(&server, &[k.freed()]);
        release(bad, true).expect("answered released");
        assert_eq!(
            dump(&server, &[k.freed()]),
            before,
            "{bad:?} left the record as it was"
        );
    }
    let freed = server.cmd(&["GET", k.freed()]).expect("GET freed");
    assert_eq!(freed.as_str(), Some(holder.as_str()));
}

fn fenced(server: &RedisServer, fence: &str, target: &str, token: u64, value: &[u8]) -> Resp {
    let call = FencedWrite {
        token,
        holder: "holder-a",
        op: FencedOp::Set(value),
    };
    let source = FencedWrite::script().source;
    let args: Vec<String> = call
        .args()
        .into_iter()
        .map(|arg| String::from_utf8(arg).expect("ASCII"))
        .collect();
    let mut command = vec!["EVAL", source, "2", fence, target];
    command.extend(args.iter().map(String::as_str));
    server.cmd(&command).expect("EVAL")
}

/// A fencing token above 2^53 (the scripts compare tokens as Lua numbers,
/// exact up to 2^53) was recorded: from 10^18 on as a record no later
/// fenced write could read (every one, the same token's included, got
/// WRONGTYPE), and between 2^53 and 10^18 rounded, so an older token
/// could pass a newer one.
#[test]
fn a_fencing_token_above_2_pow_53_is_refused_and_the_fence_kept() {
    let server = RedisServer::start().expect("redis-server");
    let (fence, target) = ("bad:{f}:fence", "bad:{f}:target");
    assert!(matches!(
        fenced(&server, fence, target, 1_000, b"v1"),
        Resp::Array(_)
    ));
    let before = dump(&server, &[fence, target]);
    for token in [(1 << 53) + 1, 1_000_000_000_000_000_000, u64::MAX] {
        match fenced(&server, fence, target, token, b"v2") {
            Resp::Error(message) => assert!(message.contains("fencing token"), "{message}"),
            other => panic!("token {token} was taken: {other:?}"),
        }
        assert_eq!(
            dump(&server, &[fence, target]),
            before,
            "token {token}: Redis unchanged"
        );
    }
    // The limit itself is a token like any other, and the fence still works.
    assert!(matches!(
        fenced(&server, fence, target, 1 << 53, b"v3"),
        Resp::Array(_)
    ));
    assert_eq!(
        server.cmd(&["GET", target]).expect("GET").as_str(),
        Some("v3")
    );
}

/// A renewal batch is checked whole before any lock is renewed: a lease
/// over a day (owner ids carry at most a day) in one item fails the call
/// with every lock's lease as it was. It renewed the items before it, and
/// a lease up to 10^17 ms was set.
#[test]
fn a_renewal_batch_is_checked_before_any_lease_is_set() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let a = OwnerId::new(&"aa".repeat(16), "00000000000000aa", 30_000);
    let b = OwnerId::new(&"bb".repeat(16), "00000000000000aa", 30_000);
    let (ka, kb) = (keys("renew-a"), keys("renew-b"));
    acquire(&server, &ka, a.as_str()).expect("a");
    acquire(&server, &kb, b.as_str()).expect("b");
    for too_long in [86_400_001, 90_000_000_000_000_000, u64::MAX] {
        let batch = RenewBatch {
            items: vec![
                RenewItem {
                    owner_key: ka.owner(),
                    owner_id: a.as_str(),
                    lease_ms: 90_000,
                    token: None,
                },
                RenewItem {
                    owner_key: kb.owner(),
                    owner_id: b.as_str(),
                    lease_ms: too_long,
                    token: None,
                },
            ],
        };
        let before = dump(&server, &[ka.owner(), kb.owner()]);
        let owner_keys = [ka.owner(), kb.owner()];
        assert_refused(
            run_script(&server, RenewBatch::script(), &owner_keys, &batch.args()),
            "lease",
            &format!("a {too_long} ms lease"),
        );
        assert_eq!(
            dump(&server, &[ka.owner(), kb.owner()]),
            before,
            "{too_long}: no lease set"
        );
    }
}

/// A one-permit semaphore `name`: A (process aa) holds it, B (process bb)
/// waits. Its keys and both owner ids.
fn semaphore_with_a_waiter(server: &RedisServer, name: &str) -> (LockKeys, String, String) {
    let keys = LockKeys::permits(
        &KeyPrefix::new("bad:").expect("prefix"),
        &LockName::new(name).expect("name"),
        PermitFamily::Semaphore,
    );
    let owner = |n: u32, tag: &str| {
        PermitOwnerId::new(&format!("{n:032x}"), tag, 30_000, PermitRequest::Shared(1))
            .expect("owner id")
            .as_str()
            .to_owned()
    };
    let (a, b) = (owner(1, "00000000000000aa"), owner(2, "00000000000000bb"));
    let timings = Timings::default();
    for who in [&a, &b] {
        let call = PermitAcquire {
            owner_id: who,
            mode: AcquireMode::Wait,
            timings: &timings,
            channel_prefix: CHANNEL_PREFIX,
            rejoin: None,
        };
        run_script(
            server,
            PermitAcquire::SCRIPT,
            &key_list(&keys),
            &call.args(),
        )
        .expect("permit acquire");
    }
    (keys, a, b)
}

/// A permit release checks what it is given before its first write: a
/// release remembered for 0 ms (a resend would be answered "not a
/// holder") or longer than a day (`PEXPIRE` refused twice that after the
/// release's writes: the holder gone, the waiter not granted, the record
/// left without a TTL); an owner id that is no permit owner id (a process
/// tag was read as a release record and overwrote that process's
/// liveness deadline, so its live waiter was later dropped as dead).
#[test]
fn a_permit_release_checks_its_arguments_before_any_write() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let (keys, a, _b) = semaphore_with_a_waiter(&server, "sem-release");
    let timings = Timings::default();
    let before = dump(&server, &key_list(&keys));
    for (owner_id, remember_ms) in [
        (a.as_str(), 0),
        (a.as_str(), 86_400_001),
        (a.as_str(), u64::MAX),
        ("00000000000000bb", 60_000),
        ("garbage", 60_000),
    ] {
        let call = PermitRelease {
            owner_id,
            timings: &timings,
            channel_prefix: CHANNEL_PREFIX,
            remember_ms,
        };
        assert_refused(
            run_script(
                &server,
                PermitRelease::SCRIPT,
                &key_list(&keys),
                &call.args(),
            ),
            "fairlock permit release",
            &format!("{owner_id} remembered {remember_ms} ms"),
        );
        assert_eq!(
            dump(&server, &key_list(&keys)),
            before,
            "{owner_id} remembered {remember_ms} ms: Redis unchanged"
        );
    }
}

/// A permit renewal batch is checked whole before any lease is set: a
/// lease over a day set the holder's deadline (a permit held for ever
/// while the set is in use) and failed afterwards, with the items before
/// it renewed.
#[test]
fn a_permit_renewal_batch_is_checked_before_any_lease_is_set() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let (one, a, _) = semaphore_with_a_waiter(&server, "sem-renew-1");
    let (two, c, _) = semaphore_with_a_waiter(&server, "sem-renew-2");
    let mut watched = key_list(&one);
    watched.extend(key_list(&two));
    for too_long in [86_400_001, 90_000_000_000_000_000, u64::MAX] {
        let batch = PermitRenewBatch {
            items: vec![
                PermitRenewItem {
                    keys: &one,
                    owner_id: &a,
                    lease_ms: 90_000,
                    token: None,
                },
                PermitRenewItem {
                    keys: &two,
                    owner_id: &c,
                    lease_ms: too_long,
                    token: None,
                },
            ],
        };
        let before = dump(&server, &watched);
        assert_refused(
            run_script(
                &server,
                PermitRenewBatch::script(),
                &batch.keys(),
                &batch.args(),
            ),
            "lease",
            &format!("a {too_long} ms permit lease"),
        );
        assert_eq!(dump(&server, &watched), before, "{too_long}: no lease set");
    }
}

/// RedLock's scripts check their numbers first: a lease of 0 or over a
/// day is refused before the vote is written or renewed (a lease of 10^17
/// ms was set: a vote that never expires), and a fence call refuses an
/// idle TTL of 0 (it deleted the counter its reply described) and a token
/// over 2^53 (rounded, or written as a counter later calls ignore).
#[test]
fn redlock_scripts_check_their_numbers_before_any_write() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let (owner, seq) = ("bad:redlock:{r}:owner", "bad:redlock:{r}:seq");
    let holder = "0123456789abcdef0123456789abcdef";
    let vote = RedlockAcquire {
        owner_id: holder,
        lease_ms: 30_000,
        min_uptime_ms: 0,
    };
    let fence = RedlockFence {
        token: 1_000,
        idle_ms: 600_000,
    };
    let run = |script, keys: &[&str], args: Vec<String>| run_script(&server, script, keys, &args);
    run(RedlockAcquire::SCRIPT, &[owner, seq], vote.args()).expect("vote");
    run(RedlockFence::SCRIPT, &[seq], fence.args()).expect("fence");
    let before = dump(&server, &[owner, seq]);
    let refused = |result: Result<Reply, String>, what: &str| {
        assert_refused(result, "fairlock redlock", what);
        assert_eq!(
            dump(&server, &[owner, seq]),
            before,
            "{what}: Redis unchanged"
        );
    };
    for lease_ms in [0, 86_400_001, 90_000_000_000_000_000, u64::MAX] {
        let acquire = RedlockAcquire {
            lease_ms,
            ..vote.clone()
        };
        refused(
            run(RedlockAcquire::SCRIPT, &[owner, seq], acquire.args()),
            &format!("a vote for {lease_ms} ms"),
        );
        let renew = RedlockRenew {
            owner_id: holder,
            lease_ms,
        };
        refused(
            run(RedlockRenew::SCRIPT, &[owner], renew.args()),
            &format!("a renewal for {lease_ms} ms"),
        );
    }
    for (token, idle_ms) in [(2_000, 0), ((1 << 53) + 1, 600_000), (u64::MAX, 600_000)] {
        refused(
            run(
                RedlockFence::SCRIPT,
                &[seq],
                RedlockFence { token, idle_ms }.args(),
            ),
            &format!("a fence of {token} kept {idle_ms} ms"),
        );
    }
}

/// The scripts of one family run on the other family's keys: a lock's
/// keys (a string owner, a string `freed`) and a permit set's (a zset of
/// holders, a hash of grants) share their hash tag and three key types,
/// and `LockKeys` carries both. The client picks the scripts by the keys'
/// family; a program on `fairlock-core` could mix them up. Each script now
/// refuses the other family's keys before it reads or writes anything
/// (before, some took them and wrote keys of the wrong type, or took one
/// family's entries for the other's). Each call starts from the same
/// state: a held lock with a waiter, a held semaphore with a waiter, and a
/// free lock and a free read-write lock.
#[test]
fn scripts_refuse_the_keys_of_the_other_family() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let lock = keys("family-lock");
    let holder = OwnerId::new(&"ab".repeat(16), "00000000000000aa", 30_000);
    let waiter = OwnerId::new(&"cd".repeat(16), "00000000000000bb", 30_000);
    let free_lock = keys("family-free-lock");
    let free_set = LockKeys::permits(
        &KeyPrefix::new("bad:").expect("prefix"),
        &LockName::new("family-free-set").expect("name"),
        PermitFamily::ReadWrite,
    );
    let setup = || {
        server.cmd_ok(&["FLUSHALL"]).expect("FLUSHALL");
        acquire(&server, &lock, holder.as_str()).expect("held");
        acquire(&server, &lock, waiter.as_str()).expect("queued");
        semaphore_with_a_waiter(&server, "family-set")
    };
    let (set, a, b) = setup();
    let mut watched = key_list(&lock);
    watched.extend(key_list(&set));
    watched.extend(key_list(&free_lock));
    watched.extend(key_list(&free_set));
    let timings = Timings::default();
    let check = |script: &Script, call_keys: &[&str], args: &[String], what: String| {
        setup();
        let before = dump(&server, &watched);
        assert_refused(
            run_script(&server, script, call_keys, args),
            "keys of the other family",
            &what,
        );
        assert_eq!(dump(&server, &watched), before, "{what}: Redis unchanged");
    };

    for permit_keys in [&set, &free_set] {
        for (owner_id, who) in [(holder.as_str(), "holder"), (waiter.as_str(), "waiter")] {
            let probes = [owner_id];
            let calls: Vec<(&Script, Vec<&str>, Vec<String>)> = vec![
                (
                    Acquire::SCRIPT,
                    key_list(permit_keys),
                    Acquire {
                        owner_id,
                        mode: AcquireMode::Wait,
                        timings: &timings,
                        channel_prefix: CHANNEL_PREFIX,
                        rejoin: None,
                    }
                    .args(),
                ),
                (
                    Release::SCRIPT,
                    key_list(permit_keys),
                    Release {
                        owner_id,
                        timings: &timings,
                        channel_prefix: CHANNEL_PREFIX,
                        reply_to: "",
                    }
                    .args(),
                ),
                (
                    Cancel::SCRIPT,
                    key_list(permit_keys),
                    Cancel {
                        owner_id,
                        timings: &timings,
                        channel_prefix: CHANNEL_PREFIX,
                    }
                    .args(),
                ),
                (
                    ForceRelease::SCRIPT,
                    key_list(permit_keys),
                    ForceRelease {
                        expected: "",
                        timings: &timings,
                        channel_prefix: CHANNEL_PREFIX,
                    }
                    .args(),
                ),
                (
                    Inspect::SCRIPT,
                    key_list(permit_keys),
                    Inspect { waiters: 10 }.args(),
                ),
                (
                    Heartbeat::SCRIPT,
                    key_list(permit_keys),
                    Heartbeat {
                        tag: "00000000000000bb",
                        probes: &probes,
                        timings: &timings,
                        channel_prefix: CHANNEL_PREFIX,
                    }
                    .args(),
                ),
                (
                    RenewBatch::script(),
                    vec![permit_keys.owner()],
                    RenewBatch {
                        items: vec![RenewItem {
                            owner_key: permit_keys.owner(),
                            owner_id,
                            lease_ms: 90_000,
                            token: None,
                        }],
                    }
                    .args(),
                ),
            ];
            for (script, call_keys, args) in calls {
                let what = format!(
                    "{} on the keys of permit set {} as its {who}",
                    script.name(),
                    permit_keys.owner()
                );
                check(script, &call_keys, &args, what);
            }
        }
    }

    for lock_keys in [&lock, &free_lock] {
        for (owner_id, who) in [(a.as_str(), "holder"), (b.as_str(), "waiter")] {
            let probes = [owner_id];
            let calls: Vec<(&Script, Vec<&str>, Vec<String>)> = vec![
                (
                    PermitAcquire::SCRIPT,
                    key_list(lock_keys),
                    PermitAcquire {
                        owner_id,
                        mode: AcquireMode::Wait,
                        timings: &timings,
                        channel_prefix: CHANNEL_PREFIX,
                        rejoin: None,
                    }
                    .args(),
                ),
                (
                    PermitRelease::SCRIPT,
                    key_list(lock_keys),
                    PermitRelease {
                        owner_id,
                        timings: &timings,
                        channel_prefix: CHANNEL_PREFIX,
                        remember_ms: 60_000,
                    }
                    .args(),
                ),
                (
                    PermitCancel::SCRIPT,
                    key_list(lock_keys),
                    PermitCancel {
                        owner_id,
                        timings: &timings,
                        channel_prefix: CHANNEL_PREFIX,
                    }
                    .args(),
                ),
                (
                    PermitHeartbeat::SCRIPT,
                    key_list(lock_keys),
                    PermitHeartbeat {
                        tag: "00000000000000bb",
                        probes: &probes,
                        timings: &timings,
                        channel_prefix: CHANNEL_PREFIX,
                    }
                    .args(),
                ),
                (
                    PermitRenewBatch::script(),
                    vec![lock_keys.owner(), lock_keys.freed()],
                    PermitRenewBatch {
                        items: vec![PermitRenewItem {
                            keys: lock_keys,
                            owner_id,
                            lease_ms: 90_000,
                            token: None,
                        }],
                    }
                    .args(),
                ),
            ];
            for (script, call_keys, args) in calls {
                let what = format!(
                    "{} on the keys of lock {} as its {who}",
                    script.name(),
                    lock_keys.owner()
                );
                check(script, &call_keys, &args, what);
            }
        }
    }

    // Batches: one item of the other family among items of the right one.
    let empty: [&str; 0] = [];
    let heartbeat = HeartbeatBatch {
        tag: "00000000000000bb",
        timings: &timings,
        channel_prefix: CHANNEL_PREFIX,
        items: vec![
            HeartbeatItem {
                keys: &lock,
                probes: &empty,
            },
            HeartbeatItem {
                keys: &set,
                probes: &empty,
            },
        ],
    };
    let what = "a heartbeat batch with a permit set second".to_owned();
    check(
        HeartbeatBatch::script(),
        &heartbeat.keys(),
        &heartbeat.args(),
        what,
    );
    let renew = RenewBatch {
        items: vec![
            RenewItem {
                owner_key: lock.owner(),
                owner_id: holder.as_str(),
                lease_ms: 90_000,
                token: None,
            },
            RenewItem {
                owner_key: set.owner(),
                owner_id: a.as_str(),
                lease_ms: 90_000,
                token: None,
            },
        ],
    };
    let what = "a renewal batch with a permit set second".to_owned();
    check(
        RenewBatch::script(),
        &[lock.owner(), set.owner()],
        &renew.args(),
        what,
    );
    let permit_renew = PermitRenewBatch {
        items: vec![
            PermitRenewItem {
                keys: &set,
                owner_id: &a,
                lease_ms: 90_000,
                token: None,
            },
            PermitRenewItem {
                keys: &lock,
                owner_id: holder.as_str(),
                lease_ms: 90_000,
                token: None,
            },
        ],
    };
    let what = "a permit renewal batch with a lock second".to_owned();
    check(
        PermitRenewBatch::script(),
        &permit_renew.keys(),
        &permit_renew.args(),
        what,
    );
}

/// On a Redis Cluster, a channel prefix whose hash tag is in another slot
/// than the lock's (the client always builds it in the lock's own slot; a
/// program on `fairlock-core` may not): the grant's `SPUBLISH` is refused
/// inside the release, after the handoff's writes. The release still
/// answers, with every write made (the lock handed on, the release
/// recorded) and the grant unheard, so its lease is cut to the waiter TTL
/// until the waiter's process finds it by heartbeat. Before, the script
/// failed there, with the lock already handed on under the waiter's full
/// lease and no record of the release.
#[test]
fn a_grant_message_refused_inside_a_release_still_answers() {
    let cluster = fairlock_testkit::RedisCluster::start().expect("cluster");
    let lock = keys("foreign-channel");
    let slot = fairlock_testkit::key_slot(lock.owner().as_bytes());
    let address = cluster.slot_owner(slot).expect("the lock's primary");
    let node = cluster
        .nodes()
        .iter()
        .find(|node| node.addr() == address)
        .expect("the node at the lock's primary's address");
    // A hash tag that hashes to a slot another primary serves.
    let foreign = (0..10_000)
        .map(|n| format!("bad:{{elsewhere-{n}}}:notify:"))
        .find(|prefix| {
            let other = fairlock_testkit::key_slot(prefix.as_bytes());
            cluster.slot_owner(other).expect("slot owner") != address
        })
        .expect("a slot on another primary");
    let holder = OwnerId::new(&"aa".repeat(16), "00000000000000aa", 30_000);
    let waiter = OwnerId::new(&"bb".repeat(16), "00000000000000bb", 30_000);
    support::acquire_wait(node, &lock, holder.as_str(), &foreign).expect("the holder");
    support::acquire_wait(node, &lock, waiter.as_str(), &foreign).expect("the waiter joins");
    let timings = Timings::default();
    let release = Release {
        owner_id: holder.as_str(),
        timings: &timings,
        channel_prefix: &foreign,
        reply_to: "00000000000000aa",
    };
    let reply = run_script(node, Release::SCRIPT, &key_list(&lock), &release.args())
        .expect("the release answers although its SPUBLISH was refused");
    let ReleaseReply::Released {
        handed_to: Some(handoff),
        ..
    } = Release::decode(reply).expect("a release reply")
    else {
        panic!("the lock was not handed to the waiter");
    };
    assert_eq!(handoff.owner_id, waiter.as_str());
    assert!(handoff.unheard, "a refused message is a grant nobody heard");
    let lease = node.cmd(&["PTTL", lock.owner()]).expect("PTTL");
    let waiter_ttl = i64::try_from(timings.waiter_ttl_ms()).expect("ms");
    assert!(
        lease.as_int().is_some_and(|ms| ms > 0 && ms <= waiter_ttl),
        "the unheard grant's lease is cut to the waiter TTL: {lease:?}"
    );
    let freed = node.cmd(&["GET", lock.freed()]).expect("GET freed");
    assert_eq!(
        freed.as_str(),
        Some(holder.as_str()),
        "the release is recorded"
    );
}
