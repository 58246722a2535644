//! The fast paths of acquire.lua and release.lua (`scripts/fast_paths/`):
//! they answer the uncontended cycle, a join and a handoff before the
//! shared helpers are defined, and must answer exactly as the full script
//! would, falling through without a write wherever it would answer
//! something else.
//!
//! Which path ran is told by the commands Redis counts (only the fast path
//! of acquire runs EXISTS, the full script's grant runs SET NX and no
//! EXISTS; the release's fast path reads the queue's oldest entry once),
//! and by sending a fast path alone, without the full script behind it:
//! what it handles it answers, the rest it leaves (nil) with Redis as it
//! was. The model check (`model.rs`) and the foreign-key matrix
//! (`wrong_type.rs`) cover the rest of both scripts' behaviour with the
//! fast paths in place.

mod support;

use std::collections::BTreeMap;

use fairlock_core::{
    Acquire, AcquireMode, KeyPrefix, LockKeys, LockName, OwnerId, Release, Reply, ScriptCall,
    Timings,
};
use fairlock_testkit::{RedisServer, Resp};

use support::{commands_run_inside, load_scripts, run_script, Subscriber};

const CHANNEL_PREFIX: &str = "fast:notify:";
const TAG: &str = "00000000000000aa";

fn keys(name: &str) -> LockKeys {
    LockKeys::new(&KeyPrefix::default(), &LockName::new(name).expect("name"))
}

fn key_list(keys: &LockKeys) -> Vec<&str> {
    keys.all().iter().map(String::as_str).collect()
}

fn owner(n: u32, lease_ms: u64) -> String {
    OwnerId::new(&format!("{n:032x}"), TAG, lease_ms)
        .as_str()
        .to_owned()
}

fn acquire(server: &RedisServer, keys: &LockKeys, owner_id: &str) -> Result<Reply, String> {
    support::acquire_wait(server, keys, owner_id, CHANNEL_PREFIX)
}

fn release(server: &RedisServer, keys: &LockKeys, owner_id: &str) -> Result<Reply, String> {
    let timings = Timings::default();
    let call = Release {
        owner_id,
        timings: &timings,
        channel_prefix: CHANNEL_PREFIX,
        reply_to: "",
    };
    run_script(server, Release::SCRIPT, &key_list(keys), &call.args())
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect()
}

fn get(server: &RedisServer, key: &str) -> Option<String> {
    server
        .cmd(&["GET", key])
        .expect("GET")
        .as_str()
        .map(str::to_owned)
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cmd(&["PTTL", key])
        .expect("PTTL")
        .as_int()
        .expect("int")
}

/// Server time in microseconds.
fn server_us(server: &RedisServer) -> u64 {
    let reply = support::eval(
        server,
        "local t = redis.call('TIME') return t[1] .. string.sub('00000' .. t[2], -6)",
        &[],
        &[],
    );
    match reply {
        Reply::Str(digits) => digits.parse().expect("digits"),
        other => panic!("TIME: {other:?}"),
    }
}

fn granted_token(reply: Result<Reply, String>) -> u64 {
    match reply {
        Ok(Reply::Array(items)) if items.len() == 2 && items[0] == Reply::Int(1) => {
            match items[1] {
                Reply::Int(token) => u64::try_from(token).expect("positive token"),
                ref other => panic!("token {other:?}"),
            }
        }
        other => panic!("expected a grant {{1, token}}, got {other:?}"),
    }
}

fn released() -> Reply {
    Reply::Array(vec![
        Reply::Int(1),
        Reply::Int(0),
        Reply::Int(0),
        Reply::Str(String::new()),
        Reply::Int(0),
        Reply::Int(0),
    ])
}

/// Everything under the lock's keys: type, value and whether it has a TTL.
fn dump(server: &RedisServer, keys: &LockKeys) -> Vec<String> {
    keys.all()
        .iter()
        .map(|key| {
            let kind = server.cmd(&["TYPE", key]).expect("TYPE");
            let value = server.cmd(&["DUMP", key]).expect("DUMP");
            format!("{key}: {kind:?} {value:?} ttl {}", pttl(server, key) > 0)
        })
        .collect()
}

#[test]
fn an_uncontended_cycle_takes_the_fast_paths() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let k = keys("cycle");
    let reset = || {
        server.cmd(&["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
    };

    // A fresh lock: the counter is new and gets the idle TTL.
    reset();
    let first = granted_token(acquire(&server, &k, &owner(1, 30_000)));
    assert_eq!(
        commands_run_inside(&server),
        counts(&[
            ("zcard", 1),
            ("exists", 1),
            ("time", 1),
            ("set", 2),
            ("pexpire", 1)
        ]),
        "first grant"
    );
    assert_eq!(get(&server, k.seq()), Some(first.to_string()));
    assert!(pttl(&server, k.seq()) > 0, "the counter expires");
    assert_eq!(
        get(&server, k.owner()),
        Some(format!("{} {first}", owner(1, 30_000)))
    );
    let lease = pttl(&server, k.owner());
    // Above halfway between the owner's own 30 s and the 5 s waiter TTL,
    // the lease this rules out: a loaded machine may take seconds from the
    // grant to this read (the bound was 25 s, 5 s of slack).
    assert!(lease > 15_000 && lease <= 30_000, "own lease, {lease} ms");

    reset();
    assert_eq!(release(&server, &k, &owner(1, 30_000)), Ok(released()));
    assert_eq!(
        commands_run_inside(&server),
        counts(&[("get", 2), ("zrange", 1), ("del", 1), ("set", 1)]),
        "release"
    );
    assert_eq!(get(&server, k.owner()), None);
    assert_eq!(get(&server, k.freed()), Some(owner(1, 30_000)));

    // The next grant keeps the counter's TTL.
    reset();
    let second = granted_token(acquire(&server, &k, &owner(2, 30_000)));
    assert!(second > first, "tokens increase: {first} then {second}");
    assert_eq!(
        commands_run_inside(&server),
        counts(&[("zcard", 1), ("exists", 1), ("time", 1), ("set", 2)]),
        "next grant"
    );

    // A resent release, the lock now held by another owner, still finds
    // the release recorded (the full script).
    assert_eq!(release(&server, &k, &owner(1, 30_000)), Ok(released()));
    assert_eq!(
        get(&server, k.owner()),
        Some(format!("{} {second}", owner(2, 30_000)))
    );
}

#[test]
fn a_counter_ahead_of_the_clock_is_drawn_past() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let k = keys("ahead");
    let ahead = server_us(&server) + 10_000_000;
    server
        .cmd(&["SET", k.seq(), &ahead.to_string(), "PX", "400000"])
        .expect("SET");
    let token = granted_token(acquire(&server, &k, &owner(1, 30_000)));
    assert_eq!(token, ahead + 1);
    assert_eq!(get(&server, k.seq()), Some((ahead + 1).to_string()));
    let ttl = pttl(&server, k.seq());
    assert!(
        ttl > 300_000 && ttl <= 400_000,
        "the counter keeps its TTL, {ttl} ms"
    );
    assert_eq!(
        get(&server, k.owner()),
        Some(format!("{} {}", owner(1, 30_000), ahead + 1))
    );
}

#[test]
fn a_garbage_counter_starts_again_at_the_clock() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    // A number below the clock is a counter like any other (it keeps its
    // TTL, here none); text, and a number more than a day ahead, are
    // garbage, replaced with a counter that expires.
    for (n, (garbage, replaced)) in [
        ("soon", true),
        ("99999999999999999999", true),
        ("-5", false),
    ]
    .into_iter()
    .enumerate()
    {
        let k = keys(&format!("garbage{n}"));
        server.cmd(&["SET", k.seq(), garbage]).expect("SET");
        let before = server_us(&server);
        let token = granted_token(acquire(&server, &k, &owner(1, 30_000)));
        let after = server_us(&server);
        assert!(
            before <= token && token <= after,
            "{garbage:?}: {before} <= {token} <= {after}"
        );
        assert_eq!(
            get(&server, k.seq()),
            Some(token.to_string()),
            "{garbage:?}"
        );
        if replaced {
            assert!(pttl(&server, k.seq()) > 0, "{garbage:?}: the idle TTL");
        }
    }
}

/// The fast path checks an owner id's lease as the full script does: from
/// 1 ms to a day, no leading zero; anything else is refused with Redis
/// unchanged, by the full script.
#[test]
fn leases_at_the_limits() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let nonce = "0123456789abcdef0123456789abcdef";
    for lease in ["1", "86400000"] {
        let k = keys(&format!("lease{lease}"));
        let owner_id = format!("{nonce}.{TAG}.{lease}");
        granted_token(acquire(&server, &k, &owner_id));
        assert_eq!(
            get(&server, k.owner()).map(|v| v.starts_with(&owner_id)),
            Some(true)
        );
    }
    for lease in ["0", "060000", "86400001", "999999999", "x"] {
        let k = keys(&format!("refused{lease}"));
        let owner_id = format!("{nonce}.{TAG}.{lease}");
        let before = dump(&server, &k);
        match acquire(&server, &k, &owner_id) {
            Err(message) => assert!(
                message.contains("malformed owner id"),
                "lease {lease}: {message}"
            ),
            Ok(reply) => panic!("lease {lease}: granted {reply:?}"),
        }
        assert_eq!(dump(&server, &k), before, "lease {lease}: Redis unchanged");
    }
}

/// An owner value fairlock would not have written is nobody's, for the
/// fast path as for the full script: the release is refused and the value
/// left alone.
#[test]
fn a_release_of_a_value_fairlock_did_not_write_is_refused() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let owner_id = owner(1, 30_000);
    let long_owner_id = format!("{}.{TAG}.30000", "a".repeat(120));
    let cases = [
        (
            owner_id.clone(),
            format!("{owner_id} {}", "9".repeat(19)),
            false,
        ),
        (
            owner_id.clone(),
            format!("{owner_id} {}", "9".repeat(18)),
            true,
        ),
        (owner_id.clone(), format!("{owner_id} 12x"), false),
        (owner_id.clone(), format!("{owner_id}  12"), false),
        (long_owner_id.clone(), format!("{long_owner_id} 12"), false),
    ];
    for (n, (releaser, value, ours)) in cases.into_iter().enumerate() {
        let k = keys(&format!("foreign{n}"));
        server.cmd(&["SET", k.owner(), &value]).expect("SET");
        let reply = release(&server, &k, &releaser).expect("release answers");
        if ours {
            assert_eq!(reply, released(), "{value:?}");
            assert_eq!(get(&server, k.owner()), None, "{value:?}");
        } else {
            assert_eq!(reply, Reply::Array(vec![Reply::Int(0)]), "{value:?}");
            assert_eq!(get(&server, k.owner()), Some(value.clone()), "{value:?}");
            assert_eq!(get(&server, k.freed()), None, "{value:?}");
        }
    }
}

/// A release that hands the lock over reads the queue's oldest entry once
/// (the fast path's read, passed on to the handoff): GET, ZRANGE, TIME,
/// ZSCORE alive, ZREM, SET seq, SET owner, PUBLISH, GET and SET freed (the
/// record of the last releases, includes/releases.lua).
#[test]
fn a_handoff_reads_the_queue_once() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let k = keys("handoff");
    let holder = owner(1, 30_000);
    let waiter = OwnerId::new(&format!("{:032x}", 2), "00000000000000bb", 30_000)
        .as_str()
        .to_owned();
    // The waiter's process listens, so its grant is heard (an unheard
    // grant costs a PEXPIRE more, cutting the lease to the waiter TTL).
    let _listener = Subscriber::psubscribe(&server.addr(), &format!("{CHANNEL_PREFIX}*"));
    granted_token(acquire(&server, &k, &holder));
    acquire(&server, &k, &waiter).expect("queued");
    server.cmd(&["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
    let reply = release(&server, &k, &holder).expect("released");
    let Reply::Array(items) = reply else {
        panic!("release: {reply:?}");
    };
    assert_eq!(items[0], Reply::Int(1));
    assert_eq!(items[3], Reply::Str(waiter.clone()), "handed to the waiter");
    assert_eq!(
        commands_run_inside(&server),
        counts(&[
            ("get", 2),
            ("zrange", 1),
            ("time", 1),
            ("zscore", 1),
            ("zrem", 1),
            ("set", 3),
            ("publish", 1),
        ]),
    );
    assert_eq!(
        get(&server, k.owner()).map(|v| v.starts_with(&waiter)),
        Some(true)
    );
}

/// A fast path sent alone, without the full script behind it: it answers
/// what it handles and returns nothing (nil) where the full script would
/// take over.
fn fast_path_alone(server: &RedisServer, fast: &str, keys: &LockKeys, args: &[String]) -> Reply {
    let source = format!(
        "{}\n{}\n{}\n{}\n{fast}",
        include_str!("../scripts/includes/key_family.lua"),
        include_str!("../scripts/includes/publish.lua"),
        include_str!("../scripts/fast_paths/draw.lua"),
        include_str!("../scripts/includes/releases.lua")
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    support::eval(server, &source, &key_list(keys), &args)
}

const FAST_ACQUIRE: &str = include_str!("../scripts/fast_paths/acquire.lua");
const FAST_RELEASE: &str = include_str!("../scripts/fast_paths/release.lua");

fn acquire_args(owner_id: &str, mode: AcquireMode, rejoin: Option<u64>) -> Vec<String> {
    let timings = Timings::default();
    Acquire {
        owner_id,
        mode,
        timings: &timings,
        channel_prefix: CHANNEL_PREFIX,
        rejoin,
    }
    .args()
}

fn release_args(owner_id: &str, reply_to: &str) -> Vec<String> {
    let timings = Timings::default();
    Release {
        owner_id,
        timings: &timings,
        channel_prefix: CHANNEL_PREFIX,
        reply_to,
    }
    .args()
}

fn waiter(n: u32, tag: &str, lease_ms: u64) -> String {
    OwnerId::new(&format!("{n:032x}"), tag, lease_ms)
        .as_str()
        .to_owned()
}

fn ints(items: &[Reply]) -> Vec<i64> {
    items
        .iter()
        .map(|item| match item {
            Reply::Int(n) => *n,
            other => panic!("not a number: {other:?}"),
        })
        .collect()
}

/// A lock `name` held by owner 1 (a 30 s lease) with owner 2 of another
/// process (a 45 s lease) queued behind it, nobody listening: its keys
/// and both owner ids.
fn held_with_a_waiter(server: &RedisServer, name: &str) -> (LockKeys, String, String) {
    let k = keys(name);
    let holder = owner(1, 30_000);
    let next = waiter(2, "00000000000000bb", 45_000);
    granted_token(acquire(server, &k, &holder));
    acquire(server, &k, &next).expect("queued");
    (k, holder, next)
}

/// A join sent to the acquire fast path alone: its reply's numbers.
fn join_alone(server: &RedisServer, keys: &LockKeys, owner_id: &str) -> Vec<i64> {
    let args = acquire_args(owner_id, AcquireMode::Wait, None);
    match fast_path_alone(server, FAST_ACQUIRE, keys, &args) {
        Reply::Array(items) => ints(&items),
        other => panic!("the fast path did not answer the join of {owner_id}: {other:?}"),
    }
}

/// The contended cycle, a join and a handoff, is answered by the fast
/// paths alone (before 2026-11-27's twelfth session only the uncontended
/// cycle was, and the full script, with its ~25 helper closures, ran on
/// every join and every handoff): a join gets its ticket and place, the
/// waiter's liveness and both keys' TTLs; a release hands the lock to the
/// live head with its own lease and the next token, and publishes the
/// grant on its process's channel, none to the releaser's own process.
#[test]
fn a_join_and_a_handoff_are_answered_by_the_fast_paths_alone() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let mut listener = Subscriber::psubscribe(&server.addr(), &format!("{CHANNEL_PREFIX}*"));
    let k = keys("contended");
    let holder = owner(1, 30_000);
    let first = waiter(2, "00000000000000bb", 45_000);
    // Both waiters are of one process, the holder's is another.
    let second = waiter(3, "00000000000000bb", 20_000);
    let token = granted_token(acquire(&server, &k, &holder));

    // The first waiter of a held lock (the queue is new), then a second.
    let before = server_us(&server);
    let joined = join_alone(&server, &k, &first);
    assert_eq!((joined[0], joined[2], joined[3], joined[4]), (2, 0, 0, 0));
    let first_ticket = u64::try_from(joined[1]).expect("ticket");
    assert!(first_ticket > token && first_ticket >= before, "{joined:?}");
    let joined = join_alone(&server, &k, &second);
    assert_eq!((joined[0], joined[2]), (2, 1), "one waiter ahead");
    let second_ticket = u64::try_from(joined[1]).expect("ticket");
    assert!(second_ticket > first_ticket);
    assert_eq!(get(&server, k.seq()), Some(second_ticket.to_string()));
    let queue = support::eval(
        &server,
        "return redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')",
        &[k.queue()],
        &[],
    );
    let entry = |text: &str| Reply::Str(text.to_owned());
    assert_eq!(
        queue,
        Reply::Array(vec![
            entry(&first),
            entry(&first_ticket.to_string()),
            entry(&second),
            entry(&second_ticket.to_string()),
        ]),
        "FIFO by ticket"
    );
    let now_ms = server_us(&server) / 1000;
    let deadline = server
        .cmd(&["ZSCORE", k.alive(), "00000000000000bb"])
        .expect("ZSCORE")
        .as_str()
        .and_then(|d| d.parse::<u64>().ok())
        .expect("a liveness deadline");
    assert!(
        deadline > now_ms && deadline <= now_ms + Timings::default().waiter_ttl_ms(),
        "{deadline} against {now_ms}"
    );
    for key in [k.queue(), k.alive()] {
        let ttl = pttl(&server, key);
        assert!(ttl > 0 && ttl <= 20_000, "{key}: {ttl} ms");
    }
    assert_eq!(listener.drain(), vec![], "a join publishes nothing");

    // The holder releases: the head owns the lock with its own lease and
    // is told on its process's channel.
    let Reply::Array(handed) =
        fast_path_alone(&server, FAST_RELEASE, &k, &release_args(&holder, TAG))
    else {
        panic!("the fast path did not answer the handoff");
    };
    let next_token = match &handed[..] {
        [Reply::Int(1), Reply::Int(0), Reply::Int(0), Reply::Str(next), Reply::Int(token), Reply::Int(0)]
            if *next == first =>
        {
            u64::try_from(*token).expect("token")
        }
        other => panic!("handoff: {other:?}"),
    };
    assert!(
        next_token > second_ticket,
        "tokens and tickets share one counter"
    );
    assert_eq!(
        get(&server, k.owner()),
        Some(format!("{first} {next_token}"))
    );
    let lease = pttl(&server, k.owner());
    // Halfway between the waiter's own 45 s and the holder's 30 s, the
    // lease this rules out.
    assert!(
        lease > 37_500 && lease <= 45_000,
        "the waiter's own lease: {lease} ms"
    );
    assert_eq!(get(&server, k.freed()), Some(holder.clone()));
    assert_eq!(
        listener.drain(),
        vec![(
            format!("{CHANNEL_PREFIX}00000000000000bb"),
            format!("{first} {next_token} {}", k.owner())
        )]
    );

    // The next handoff goes to a waiter of the releaser's own process
    // (`reply_to`): it learns of its grant from the reply, so no message.
    let Reply::Array(handed) = fast_path_alone(
        &server,
        FAST_RELEASE,
        &k,
        &release_args(&first, "00000000000000bb"),
    ) else {
        panic!("the fast path did not answer the second handoff");
    };
    assert_eq!(handed[3], Reply::Str(second.clone()));
    assert_eq!(handed[5], Reply::Int(0), "heard: the caller wakes it");
    assert_eq!(
        listener.drain(),
        vec![],
        "no message to the caller's own process"
    );
    assert!(pttl(&server, k.owner()) > 15_000, "its own 20 s lease");
}

/// A grant whose message reaches nobody keeps only the waiter TTL as its
/// lease, as the full script's grant_next cuts it.
#[test]
fn an_unheard_handoff_gets_the_waiter_ttl() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let (k, holder, next) = held_with_a_waiter(&server, "unheard");
    let Reply::Array(handed) =
        fast_path_alone(&server, FAST_RELEASE, &k, &release_args(&holder, ""))
    else {
        panic!("the fast path did not answer the handoff");
    };
    assert_eq!(handed[3], Reply::Str(next.clone()));
    assert_eq!(handed[5], Reply::Int(1), "unheard");
    let lease = pttl(&server, k.owner());
    let waiter_ttl = i64::try_from(Timings::default().waiter_ttl_ms()).expect("ttl");
    assert!(
        lease > 0 && lease <= waiter_ttl,
        "cut to the waiter TTL: {lease} ms"
    );
}

/// What the fast paths leave to the full script they leave untouched
/// (nil, and Redis as it was), and the full script behind them answers it.
#[test]
fn the_rest_falls_through_to_the_full_scripts() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let holder = owner(1, 30_000);
    let queued = waiter(2, "00000000000000bb", 30_000);
    let caller = waiter(3, "00000000000000cc", 30_000);
    let held = |name: &str| {
        let k = keys(name);
        granted_token(acquire(&server, &k, &holder));
        k
    };
    let unchanged = |k: &LockKeys, fast: &str, args: Vec<String>, what: &str| {
        let before = dump(&server, k);
        assert_eq!(
            fast_path_alone(&server, fast, k, &args),
            Reply::Nil,
            "{what}"
        );
        assert_eq!(dump(&server, k), before, "{what}: Redis unchanged");
    };

    // acquire: a try on a held lock (busy); a rejoin; the owner's own
    // resend (its grant); a free lock with waiters; an owner value
    // fairlock did not write; an alive key of a foreign type.
    let join = |owner_id: &str| acquire_args(owner_id, AcquireMode::Wait, None);
    let k = held("try");
    unchanged(
        &k,
        FAST_ACQUIRE,
        acquire_args(&caller, AcquireMode::Try, None),
        "try",
    );
    let busy = run_script(
        &server,
        Acquire::SCRIPT,
        &key_list(&k),
        &acquire_args(&caller, AcquireMode::Try, None),
    );
    assert_eq!(
        busy,
        Ok(Reply::Array(vec![
            Reply::Int(3),
            Reply::Int(0),
            Reply::Int(0)
        ]))
    );
    let k = held("rejoin");
    unchanged(
        &k,
        FAST_ACQUIRE,
        acquire_args(&caller, AcquireMode::Wait, Some(5)),
        "rejoin",
    );
    let k = held("own");
    unchanged(&k, FAST_ACQUIRE, join(&holder), "owner");
    granted_token(acquire(&server, &k, &holder));
    let k = held("free");
    acquire(&server, &k, &queued).expect("queued");
    server.cmd(&["DEL", k.owner()]).expect("DEL");
    unchanged(&k, FAST_ACQUIRE, join(&caller), "free, waiters");
    let k = keys("foreign");
    server.cmd(&["SET", k.owner(), "x 5"]).expect("SET");
    unchanged(&k, FAST_ACQUIRE, join(&caller), "foreign");
    let k = keys("foreign-alive");
    granted_token(acquire(&server, &k, &holder));
    server.cmd(&["SET", k.alive(), "x"]).expect("SET");
    unchanged(&k, FAST_ACQUIRE, join(&caller), "alive");
    match acquire(&server, &k, &caller) {
        Err(message) => assert!(message.starts_with("WRONGTYPE"), "{message}"),
        Ok(reply) => panic!("a foreign alive key: {reply:?}"),
    }

    // A resend of a join puts the counter back, and the full script keeps
    // the place taken the first time.
    let k = held("resend");
    let Ok(Reply::Array(first)) = acquire(&server, &k, &caller) else {
        panic!("queued");
    };
    let counter = get(&server, k.seq());
    assert_eq!(
        fast_path_alone(&server, FAST_ACQUIRE, &k, &join(&caller)),
        Reply::Nil
    );
    assert_eq!(get(&server, k.seq()), counter, "the counter put back");
    assert_eq!(acquire(&server, &k, &caller), Ok(Reply::Array(first)));

    // release: a dead head (its process's deadline passed); a malformed
    // head. The full script then skips it.
    for (name, head) in [
        ("dead", queued.clone()),
        ("malformed", format!("{queued}0x")),
    ] {
        let k = held(name);
        acquire(&server, &k, &queued).expect("queued");
        if name == "dead" {
            server
                .cmd(&["ZADD", k.alive(), "1", "00000000000000bb"])
                .expect("ZADD");
        } else {
            server.cmd(&["ZREM", k.queue(), &queued]).expect("ZREM");
            server.cmd(&["ZADD", k.queue(), "1", &head]).expect("ZADD");
        }
        unchanged(&k, FAST_RELEASE, release_args(&holder, ""), name);
        let reply = release(&server, &k, &holder).expect("released");
        let Reply::Array(items) = reply else {
            panic!("{name}: {reply:?}");
        };
        assert_eq!(
            (&items[0], &items[1], &items[3]),
            (&Reply::Int(1), &Reply::Int(1), &Reply::Str(String::new())),
            "{name}: released, the head dropped, nobody granted"
        );
        assert_eq!(get(&server, k.owner()), None, "{name}");
    }
}

/// The handoff's fast path reads the waiter TTL as a number, as the full
/// script does: a TTL written `05000` cuts an unheard grant's lease to
/// 5 s. It passed the text to `PEXPIRE`, which refused it after the
/// handoff's writes: an error, the new owner with its whole lease, no
/// release recorded (found by a review comparing both scripts' answers).
#[test]
fn a_handoff_reads_the_waiter_ttl_as_a_number() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let (k, holder, next) = held_with_a_waiter(&server, "ttl-text");
    let mut args = release_args(&holder, "");
    args[3] = "05000".to_owned();
    let Reply::Array(handed) = fast_path_alone(&server, FAST_RELEASE, &k, &args) else {
        panic!("the fast path did not answer the handoff");
    };
    assert_eq!(handed[3], Reply::Str(next.clone()));
    assert_eq!(handed[5], Reply::Int(1), "unheard");
    let lease = pttl(&server, k.owner());
    assert!(lease > 0 && lease <= 5_000, "cut to 5 s: {lease} ms");
    assert_eq!(
        get(&server, k.freed()),
        Some(holder),
        "the release recorded"
    );
}

/// A join that finds a counter of a foreign type: the fast path has
/// written the caller's liveness when its draw finds the type, and falls
/// through; the full script repairs the counter and writes the liveness
/// again, with its TTL, as it would have alone.
#[test]
fn a_join_with_a_foreign_counter_falls_through_after_its_liveness() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let k = keys("foreign-counter");
    let holder = owner(1, 30_000);
    let caller = waiter(3, "00000000000000cc", 30_000);
    granted_token(acquire(&server, &k, &holder));
    server.cmd(&["DEL", k.alive()]).expect("DEL");
    server.cmd(&["DEL", k.seq()]).expect("DEL");
    server.cmd(&["HSET", k.seq(), "f", "v"]).expect("HSET");
    let args = acquire_args(&caller, AcquireMode::Wait, None);
    assert_eq!(
        fast_path_alone(&server, FAST_ACQUIRE, &k, &args),
        Reply::Nil
    );
    assert!(
        matches!(
            server.cmd(&["ZSCORE", k.alive(), "00000000000000cc"]),
            Ok(Resp::Bulk(Some(_)))
        ),
        "the liveness written before the draw"
    );
    let Ok(Reply::Array(joined)) = acquire(&server, &k, &caller) else {
        panic!("the full script did not answer the join");
    };
    assert_eq!(joined[0], Reply::Int(2), "queued");
    assert!(get(&server, k.seq()).is_some(), "the counter repaired");
    let alive_ttl = pttl(&server, k.alive());
    assert!(alive_ttl > 0, "the liveness key expires: {alive_ttl}");
}
