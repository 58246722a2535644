//! One heartbeat call covers many locks (`HeartbeatBatch`): each lock in
//! the batch is answered and changed exactly as a heartbeat for that lock
//! alone would answer and change it, in KEYS order, each probe of a lock
//! is answered on its own, and a call whose keys and probes do not pair up
//! changes nothing.

mod support;

use fairlock_core::{
    HeartbeatBatch, HeartbeatItem, HeartbeatReply, KeyPrefix, LockKeys, LockName, OwnerId,
    ProbeFlags, Purged, Reply, Timings, MAX_PROBES,
};
use fairlock_testkit::RedisServer;

use support::{load_scripts, run_script};

/// The calling process.
const OURS: &str = "00000000000000a1";
/// Another live process.
const THEIRS: &str = "00000000000000b2";
const CHANNEL_PREFIX: &str = "batch:notify:";

fn owner_id(nonce: char, tag: &str) -> String {
    OwnerId::new(&nonce.to_string().repeat(32), tag, 30_000)
        .as_str()
        .to_owned()
}

fn keys(name: &str) -> LockKeys {
    LockKeys::new(&KeyPrefix::default(), &LockName::new(name).unwrap())
}

fn server_ms(server: &RedisServer) -> i64 {
    let time = server.cmd(&["TIME"]).unwrap();
    let parts = time.as_array().unwrap();
    let secs: i64 = parts[0].as_str().unwrap().parse().unwrap();
    let micros: i64 = parts[1].as_str().unwrap().parse().unwrap();
    secs * 1000 + micros / 1000
}

fn deadline(server: &RedisServer, keys: &LockKeys, tag: &str) -> Option<i64> {
    server
        .cmd(&["ZSCORE", keys.alive(), tag])
        .unwrap()
        .as_str()
        .map(|score| score.parse().unwrap())
}

struct Locks {
    server: RedisServer,
    /// Held by another process; our waiter is queued (and is the probe).
    held: LockKeys,
    held_by: String,
    our_waiter: String,
    /// Free, with another process's live waiter queued: the heartbeat
    /// hands it the lock.
    free: LockKeys,
    their_waiter: String,
    /// Held; our probe is missing from its queue (the queue lost it).
    lost: LockKeys,
    lost_holder: String,
    lost_probe: String,
}

fn locks() -> Locks {
    let server = RedisServer::start().unwrap();
    load_scripts(&server);
    let now = server_ms(&server);
    let soon = (now + 100).to_string();
    let later = (now + 60_000).to_string();
    let locks = Locks {
        held: keys("batch:held"),
        held_by: owner_id('1', THEIRS),
        our_waiter: owner_id('2', OURS),
        free: keys("batch:free"),
        their_waiter: owner_id('3', THEIRS),
        lost: keys("batch:lost"),
        lost_holder: owner_id('4', THEIRS),
        lost_probe: owner_id('5', OURS),
        server,
    };
    let s = &locks.server;
    let held_value = format!("{} 5", locks.held_by);
    s.cmd(&["SET", locks.held.owner(), &held_value, "PX", "30000"])
        .unwrap();
    s.cmd(&["ZADD", locks.held.queue(), "6", &locks.our_waiter])
        .unwrap();
    s.cmd(&["ZADD", locks.held.alive(), &soon, OURS]).unwrap();
    s.cmd(&["SET", locks.held.seq(), "6"]).unwrap();

    s.cmd(&["ZADD", locks.free.queue(), "8", &locks.their_waiter])
        .unwrap();
    s.cmd(&["ZADD", locks.free.alive(), &later, THEIRS])
        .unwrap();
    s.cmd(&["SET", locks.free.seq(), "8"]).unwrap();

    let lost_value = format!("{} 7", locks.lost_holder);
    s.cmd(&["SET", locks.lost.owner(), &lost_value, "PX", "30000"])
        .unwrap();
    s.cmd(&["SET", locks.lost.seq(), "7"]).unwrap();
    locks
}

fn batch<'a>(timings: &'a Timings, items: Vec<HeartbeatItem<'a>>) -> HeartbeatBatch<'a> {
    HeartbeatBatch {
        tag: OURS,
        timings,
        channel_prefix: CHANNEL_PREFIX,
        items,
    }
}

/// Runs `call` on `server` and reads its reply, lock by lock.
fn beat(server: &RedisServer, call: &HeartbeatBatch<'_>) -> Vec<HeartbeatReply> {
    let reply = run_script(server, HeartbeatBatch::script(), &call.keys(), &call.args())
        .expect("heartbeat script");
    call.decode(reply).expect("a reply the batch reads")
}

/// The held lock with `ours` (our waiter) as probes, then the free lock,
/// no probe.
fn held_and_free<'a>(locks: &'a Locks, ours: &'a [&'a str]) -> Vec<HeartbeatItem<'a>> {
    vec![
        HeartbeatItem {
            keys: &locks.held,
            probes: ours,
        },
        HeartbeatItem {
            keys: &locks.free,
            probes: &[],
        },
    ]
}

#[test]
fn one_call_answers_every_lock_as_its_own_heartbeat_would() {
    let locks = locks();
    let timings = Timings::default();
    let ours = [locks.our_waiter.as_str()];
    let mut items = held_and_free(&locks, &ours);
    let lost_probe = [locks.lost_probe.as_str()];
    items.push(HeartbeatItem {
        keys: &locks.lost,
        probes: &lost_probe,
    });
    let call = batch(&timings, items);
    let before = server_ms(&locks.server);
    let replies = beat(&locks.server, &call);
    let none = Purged {
        dropped: 0,
        more: false,
    };

    // Held, our waiter queued: the holder is reported and our process's
    // deadline there moves a waiter TTL ahead.
    assert_eq!(
        replies[0],
        HeartbeatReply {
            holder: Some((locks.held_by.clone(), 5)),
            queued: ProbeFlags::from_bits(1),
            purged: none,
        }
    );
    let refreshed = deadline(&locks.server, &locks.held, OURS).unwrap();
    assert!(refreshed >= before + timings.waiter_ttl_ms() as i64 - 1_000);

    // Free with a live waiter: the heartbeat grants it the lock with a
    // token above every number issued, and reports it.
    let (new_owner, token) = replies[1].holder.clone().unwrap();
    assert_eq!(new_owner, locks.their_waiter);
    assert!(token > 8, "token {token}");
    assert_eq!(replies[1].queued, ProbeFlags::default());
    let owner = locks.server.cmd(&["GET", locks.free.owner()]).unwrap();
    assert_eq!(
        owner.as_str(),
        Some(format!("{} {token}", locks.their_waiter).as_str())
    );
    // Nobody of ours waits there: our process gets no deadline on it.
    assert_eq!(deadline(&locks.server, &locks.free, OURS), None);

    // Held, our probe missing: reported as not queued (the client then
    // re-runs acquire for its waiters), and no deadline is made for us.
    assert_eq!(
        replies[2],
        HeartbeatReply {
            holder: Some((locks.lost_holder.clone(), 7)),
            queued: ProbeFlags::default(),
            purged: none,
        }
    );
    assert_eq!(deadline(&locks.server, &locks.lost, OURS), None);
}

#[test]
fn keys_and_probes_that_do_not_pair_up_change_nothing() {
    let locks = locks();
    let timings = Timings::default();
    let ours = [locks.our_waiter.as_str()];
    let call = batch(&timings, held_and_free(&locks, &ours));
    // A probe missing, one too many, a count that is no number, a
    // count over the limit.
    let args = call.args();
    let mut short = args.clone();
    short.pop();
    let mut long = args.clone();
    long.push("x".to_owned());
    let mut garbled = args.clone();
    garbled[5] = "one".to_owned();
    let mut over = args.clone();
    over[5] = (MAX_PROBES + 1).to_string();
    over.splice(7..7, vec![locks.our_waiter.clone(); MAX_PROBES]);
    for args in [short, long, garbled, over] {
        let refused = run_script(&locks.server, HeartbeatBatch::script(), &call.keys(), &args);
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("a count of at most 32 probes")),
            "{args:?}: {refused:?}"
        );
    }
    let mut keys = call.keys();
    keys.pop();
    let refused = run_script(&locks.server, HeartbeatBatch::script(), &keys, &call.args());
    assert!(refused.is_err(), "{refused:?}");
    // The free lock was not handed on, and nothing else moved.
    let owner = locks.server.cmd(&["EXISTS", locks.free.owner()]).unwrap();
    assert_eq!(owner.as_int(), Some(0));
    let queued = locks.server.cmd(&["ZCARD", locks.free.queue()]).unwrap();
    assert_eq!(queued.as_int(), Some(1));
}

#[test]
fn a_reply_for_another_number_of_locks_is_a_protocol_error() {
    let timings = Timings::default();
    let a = keys("batch:a");
    let call = batch(
        &timings,
        vec![
            HeartbeatItem {
                keys: &a,
                probes: &[],
            },
            HeartbeatItem {
                keys: &a,
                probes: &[],
            },
        ],
    );
    let one_lock = Reply::Array(vec![
        Reply::Str(String::new()),
        Reply::Int(0),
        Reply::Int(0),
        Reply::Int(0),
        Reply::Int(0),
    ]);
    let error = call.decode(one_lock).unwrap_err();
    assert!(error.detail.contains("5 fields for 2 locks"), "{error}");
}

/// Several probes of one lock are answered one by one, in the order sent:
/// a process's waiter that lost its place is found even while an older
/// one of the same process is queued (a fail-over to a replica that had
/// the older enqueue only). Any queued probe keeps the process alive; so
/// does one that holds the lock.
#[test]
fn each_probe_of_a_lock_is_answered_on_its_own() {
    let locks = locks();
    let timings = Timings::default();
    let second = owner_id('6', OURS);
    let missing = owner_id('7', OURS);
    locks
        .server
        .cmd(&["ZADD", locks.held.queue(), "9", &second])
        .unwrap();
    let probes = [missing.as_str(), locks.our_waiter.as_str(), second.as_str()];
    // The lost lock's holder is probed among missing ones.
    let holder_probes = [missing.as_str(), locks.lost_holder.as_str()];
    let call = batch(
        &timings,
        vec![
            HeartbeatItem {
                keys: &locks.held,
                probes: &probes,
            },
            HeartbeatItem {
                keys: &locks.lost,
                probes: &holder_probes,
            },
        ],
    );
    let before = server_ms(&locks.server);
    let replies = beat(&locks.server, &call);
    let queued = replies[0].queued;
    assert_eq!(
        (queued.get(0), queued.get(1), queued.get(2)),
        (false, true, true),
        "{queued:?}"
    );
    assert!(deadline(&locks.server, &locks.held, OURS).unwrap() >= before + 4_000);
    // Neither queued, but one holds: alive, and the reply names the holder.
    assert_eq!(replies[1].queued, ProbeFlags::default());
    assert_eq!(replies[1].holder, Some((locks.lost_holder.clone(), 7)));
    assert!(deadline(&locks.server, &locks.lost, OURS).unwrap() >= before + 4_000);
}
