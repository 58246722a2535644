//! A lock key that holds a value of another type (another program uses the
//! name): every script either answers or fails with WRONGTYPE, and a
//! failing script leaves every key of the lock as it found it
//! (`includes/common.lua`: scripts read every key they will write before
//! their first write). The model check never plants foreign values, so this
//! matrix covers that promise: each lock state × each key × each call.

mod support;

use fairlock_core::{
    Acquire, AcquireMode, Cancel, ForceRelease, Heartbeat, KeyPrefix, LockKeys, LockName, OwnerId,
    Release, RenewBatch, RenewItem, Reply, Script, ScriptCall, Timings,
};
use fairlock_testkit::{RedisServer, Resp};

use support::{load_scripts, run_script};

const CHANNEL_PREFIX: &str = "wrong:notify:";

fn owner_id(id: char, tag: &str) -> String {
    OwnerId::new(&id.to_string().repeat(32), tag, 30_000)
        .as_str()
        .to_owned()
}

/// The lock states the matrix starts from.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// Held by `holder`, `waiter` queued.
    HeldWithWaiter,
    /// Free, nobody queued, seq and freed left by an earlier holder.
    Free,
    /// The holder's lease ran out, `waiter` still queued.
    VanishedWithWaiter,
}

struct Lock {
    keys: LockKeys,
    holder: String,
    waiter: String,
    newcomer: String,
    tag: String,
}

fn setup(server: &RedisServer, lock: &Lock, start: Start) {
    let run = |args: &[&str]| {
        let reply = server.cmd(args).unwrap();
        assert!(!reply.is_error(), "{args:?}: {reply:?}");
    };
    run(&["FLUSHALL"]);
    let keys: Vec<&str> = lock.keys.all().iter().map(String::as_str).collect();
    let timings = Timings::default();
    let acquire = |who: &str| {
        let call = Acquire {
            owner_id: who,
            mode: AcquireMode::Wait,
            timings: &timings,
            channel_prefix: CHANNEL_PREFIX,
            rejoin: None,
        };
        run_script(server, Acquire::SCRIPT, &keys, &call.args()).unwrap();
    };
    acquire(&lock.holder);
    match start {
        Start::HeldWithWaiter => acquire(&lock.waiter),
        Start::Free => {
            let call = Release {
                owner_id: &lock.holder,
                timings: &timings,
                channel_prefix: CHANNEL_PREFIX,
                reply_to: "",
            };
            run_script(server, Release::SCRIPT, &keys, &call.args()).unwrap();
        }
        Start::VanishedWithWaiter => {
            acquire(&lock.waiter);
            run(&["DEL", lock.keys.owner()]);
        }
    }
}

/// Replaces `key` with a value of another type, with a TTL.
fn plant_foreign_value(server: &RedisServer, key: &str) {
    let kind = server.cmd(&["TYPE", key]).unwrap();
    server.cmd(&["DEL", key]).unwrap();
    if kind.as_str() == Some("zset") {
        server.cmd(&["SET", key, "foreign", "PX", "60000"]).unwrap();
    } else {
        server.cmd(&["HSET", key, "foreign", "1"]).unwrap();
        server.cmd(&["PEXPIRE", key, "60000"]).unwrap();
    }
}

/// Every key's serialized value and whether it expires.
fn dump(server: &RedisServer, keys: &LockKeys) -> Vec<(Resp, bool)> {
    keys.all()
        .iter()
        .map(|key| {
            let value = server.cmd(&["DUMP", key]).unwrap();
            let pttl = server.cmd(&["PTTL", key]).unwrap().as_int().unwrap();
            (value, pttl != -1)
        })
        .collect()
}

fn calls(lock: &Lock, t: &Timings) -> Vec<(&'static Script, Vec<String>, &'static str)> {
    let c = CHANNEL_PREFIX;
    let acquire = |who: &str, mode| {
        Acquire {
            owner_id: who,
            mode,
            timings: t,
            channel_prefix: c,
            rejoin: None,
        }
        .args()
    };
    vec![
        (
            Acquire::SCRIPT,
            acquire(&lock.newcomer, AcquireMode::Wait),
            "acquire wait",
        ),
        (
            Acquire::SCRIPT,
            acquire(&lock.newcomer, AcquireMode::Try),
            "acquire try",
        ),
        (
            Acquire::SCRIPT,
            acquire(&lock.waiter, AcquireMode::Wait),
            "acquire resend",
        ),
        (
            Release::SCRIPT,
            Release {
                owner_id: &lock.holder,
                timings: t,
                channel_prefix: c,
                reply_to: "",
            }
            .args(),
            "release",
        ),
        (
            Cancel::SCRIPT,
            Cancel {
                owner_id: &lock.waiter,
                timings: t,
                channel_prefix: c,
            }
            .args(),
            "cancel",
        ),
        (
            Heartbeat::SCRIPT,
            Heartbeat {
                tag: &lock.tag,
                probes: &[lock.waiter.as_str()],
                timings: t,
                channel_prefix: c,
            }
            .args(),
            "heartbeat",
        ),
        (
            Heartbeat::SCRIPT,
            Heartbeat::purge(&lock.tag, t, c).args(),
            "heartbeat purge",
        ),
        (
            ForceRelease::SCRIPT,
            ForceRelease {
                expected: &lock.holder,
                timings: t,
                channel_prefix: c,
            }
            .args(),
            "force release",
        ),
        (
            ForceRelease::SCRIPT,
            ForceRelease {
                expected: "",
                timings: t,
                channel_prefix: c,
            }
            .args(),
            "force release free",
        ),
    ]
}

/// Each call on each lock state with each key foreign: a reply, or
/// WRONGTYPE with every key as it was; no key left without a TTL.
#[test]
fn a_foreign_key_fails_a_script_cleanly_or_not_at_all() {
    let server = RedisServer::start().unwrap();
    load_scripts(&server);
    let lock = Lock {
        keys: LockKeys::new(&KeyPrefix::default(), &LockName::new("foreign").unwrap()),
        holder: owner_id('a', "00000000000000a1"),
        waiter: owner_id('b', "00000000000000b2"),
        newcomer: owner_id('c', "00000000000000c3"),
        tag: "00000000000000b2".to_owned(),
    };
    let (mut failed, mut answered) = (0, 0);
    for start in [
        Start::HeldWithWaiter,
        Start::Free,
        Start::VanishedWithWaiter,
    ] {
        for key in lock.keys.all() {
            for (script, args, what) in calls(&lock, &Timings::default()) {
                setup(&server, &lock, start);
                plant_foreign_value(&server, key);
                let before = dump(&server, &lock.keys);
                let keys: Vec<&str> = lock.keys.all().iter().map(String::as_str).collect();
                let context = format!("{what} on {start:?} with {key} foreign");
                match run_script(&server, script, &keys, &args) {
                    Err(error) => {
                        failed += 1;
                        assert!(error.contains("WRONGTYPE"), "{context}: {error}");
                        assert_eq!(dump(&server, &lock.keys), before, "{context}: changed keys");
                    }
                    Ok(_) => answered += 1,
                }
                for (i, (_, expires)) in dump(&server, &lock.keys).iter().enumerate() {
                    assert!(expires, "{context}: {} has no TTL", lock.keys.all()[i]);
                }
            }
        }
    }
    println!("foreign keys: {failed} calls failed cleanly, {answered} answered");
    assert!(failed > 0 && answered > 0);
}

/// `renew.lua` reports a foreign owner key per lock instead of failing the
/// whole batch.
#[test]
fn a_foreign_owner_key_is_reported_by_renew() {
    let server = RedisServer::start().unwrap();
    load_scripts(&server);
    let keys = LockKeys::new(&KeyPrefix::default(), &LockName::new("foreign").unwrap());
    plant_foreign_value(&server, keys.owner());
    let batch = RenewBatch {
        items: vec![RenewItem {
            owner_key: keys.owner(),
            owner_id: "m.t.5",
            lease_ms: 5,
            token: None,
        }],
    };
    let reply = run_script(&server, RenewBatch::script(), &batch.keys(), &batch.args()).unwrap();
    assert_eq!(reply, Reply::Array(vec![Reply::Int(-1)]));
}
