//! 10,000 dead waiters at the head of the queue (issue 10, fault 6): one
//! release or acquire must do bounded work inside Redis, and the purge
//! calls that follow (`Heartbeat::purge`) must reach the live waiter behind
//! them and grant it the lock.
//!
//! Work is counted with `INFO commandstats`, which in Redis 7 counts every
//! command a script runs. The server time of each call is printed (not
//! asserted: timings are for the benchmark report) with
//! `cargo test -p fairlock-core --test dead_waiters -- --nocapture`.

mod support;

use fairlock_core::{
    Acquire, AcquireMode, AcquireReply, Heartbeat, KeyPrefix, LockKeys, LockName, OwnerId, Purged,
    Release, ReleaseReply, Reply, Script, ScriptCall, Timings,
};
use fairlock_testkit::RedisServer;

use support::{commandstats, eval, load_scripts, run_script, Subscriber};

const DEAD: u64 = 10_000;
/// "At most a few hundred commands inside the script" (issue 10).
const MAX_COMMANDS_PER_CALL: u64 = 300;
/// Entries one call may look at: the sum of `SCAN_WINDOWS` in
/// `includes/common.lua`.
const SCANNED_PER_CALL: u64 = 128;
const CHANNEL_PREFIX: &str = "dead:notify:";
const LIVE_LEASE_MS: u64 = 45_000;

fn timings() -> Timings {
    Timings::default()
}

/// Fills the lock: `holder` owns it, then DEAD waiters of one dead process
/// (deadline in the past), then one waiter of a live process.
const SETUP: &str = r#"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = tonumber(ARGV[1])
for first = 1, dead, 1000 do
  local args = {}
  for i = first, math.min(first + 999, dead) do
    args[#args + 1] = i
    args[#args + 1] = string.format('%032x.%s.30000', i, ARGV[2])
  end
  redis.call('ZADD', KEYS[2], unpack(args))
end
redis.call('ZADD', KEYS[2], dead + 1, ARGV[4])
redis.call('ZADD', KEYS[3], 1, ARGV[2], now_ms + 60000, ARGV[3])
redis.call('PEXPIRE', KEYS[2], 60000)
redis.call('PEXPIRE', KEYS[3], 60000)
redis.call('SET', KEYS[4], dead + 2, 'PX', 600000)
if ARGV[5] ~= '' then
  redis.call('SET', KEYS[1], ARGV[5] .. ' ' .. (dead + 2), 'PX', 30000)
end
return redis.call('ZCARD', KEYS[2])
"#;

struct Crowd {
    /// The live waiter's process: a handoff must reach a listener to carry
    /// the waiter's full lease (an unheard one gets the waiter TTL).
    _listener: Subscriber,
    server: RedisServer,
    keys: LockKeys,
    live_waiter: String,
    holder: String,
}

const DEAD_TAG: &str = "000000000000dead";
const LIVE_TAG: &str = "00000000000000a1";

fn crowd(with_holder: bool, dead: u64) -> Crowd {
    let server = RedisServer::start().unwrap();
    load_scripts(&server);
    let keys = LockKeys::new(&KeyPrefix::default(), &LockName::new("crowd").unwrap());
    let live_waiter = OwnerId::new(&"b".repeat(32), LIVE_TAG, LIVE_LEASE_MS)
        .as_str()
        .to_owned();
    let holder = OwnerId::new(&"c".repeat(32), LIVE_TAG, 30_000)
        .as_str()
        .to_owned();
    let key_refs: Vec<&str> = keys.all().iter().map(String::as_str).collect();
    let dead_count = dead;
    let dead = dead.to_string();
    let owner = if with_holder { holder.as_str() } else { "" };
    let queued = eval(
        &server,
        SETUP,
        &key_refs,
        &[&dead, DEAD_TAG, LIVE_TAG, &live_waiter, owner],
    );
    assert_eq!(queued, Reply::Int(dead_count as i64 + 1));
    Crowd {
        _listener: Subscriber::psubscribe(&server.addr(), &format!("{CHANNEL_PREFIX}{LIVE_TAG}")),
        server,
        keys,
        live_waiter,
        holder,
    }
}

/// Commands run inside scripts and server µs of the script call itself,
/// for one call of `script`.
fn measured<T>(server: &RedisServer, script: &Script, call: impl FnOnce() -> T) -> (T, u64, u64) {
    server.reset_stats().unwrap();
    let out = call();
    let stats = commandstats(server);
    let inner: Vec<_> = stats
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "evalsha" | "info" | "config|resetstat"))
        .collect();
    let inside = inner.iter().map(|(_, stat)| stat.calls).sum();
    let call_stat = stats["evalsha"];
    assert_eq!(call_stat.calls, 1, "one {} call", script.name());
    if std::env::var_os("FAIRLOCK_DEAD_WAITERS_DETAIL").is_some() {
        println!("{}: {call_stat:?}, inside: {inner:?}", script.name());
    }
    (out, inside, call_stat.usec)
}

/// Purge calls until the lock has a holder; returns how many calls it took,
/// the dead waiters they dropped, and prints their cost.
fn purge_until_granted(crowd: &Crowd) -> (u64, u64) {
    let key_refs: Vec<&str> = crowd.keys.all().iter().map(String::as_str).collect();
    let timings = timings();
    let purge = Heartbeat::purge(LIVE_TAG, &timings, CHANNEL_PREFIX);
    let (mut calls, mut dropped, mut max_inside, mut usecs) = (0, 0, 0, Vec::new());
    loop {
        calls += 1;
        assert!(
            calls <= DEAD / SCANNED_PER_CALL + 2,
            "purging {DEAD} dead waiters took more than {calls} calls"
        );
        let (reply, inside, usec) = measured(&crowd.server, Heartbeat::SCRIPT, || {
            run_script(&crowd.server, Heartbeat::SCRIPT, &key_refs, &purge.args()).unwrap()
        });
        let reply = Heartbeat::decode(reply).unwrap();
        assert!(
            inside <= MAX_COMMANDS_PER_CALL,
            "purge call {calls} ran {inside} commands"
        );
        max_inside = max_inside.max(inside);
        usecs.push(usec);
        dropped += reply.purged.dropped;
        if let Some((holder, token)) = reply.holder {
            assert_eq!(holder, crowd.live_waiter, "the live waiter is granted");
            assert!(token > DEAD + 2, "token {token} above every ticket");
            assert!(!reply.purged.more);
            break;
        }
        assert!(
            reply.purged.more,
            "call {calls}: dead waiters left, so more"
        );
    }
    println!(
        "purge: {calls} heartbeat calls, at most {max_inside} commands inside one, \
         usec per call max {} mean {}",
        usecs.iter().max().unwrap(),
        usecs.iter().sum::<u64>() / usecs.len() as u64
    );
    (calls, dropped)
}

/// The crowd's holder releases: the reply, the commands run inside the
/// script and its server µs.
fn release_by_holder(crowd: &Crowd) -> (Reply, u64, u64) {
    let key_refs: Vec<&str> = crowd.keys.all().iter().map(String::as_str).collect();
    let timings = timings();
    let release = Release {
        owner_id: &crowd.holder,
        timings: &timings,
        channel_prefix: CHANNEL_PREFIX,
        reply_to: "",
    };
    measured(&crowd.server, Release::SCRIPT, || {
        run_script(&crowd.server, Release::SCRIPT, &key_refs, &release.args()).unwrap()
    })
}

fn assert_granted_to_live_waiter(crowd: &Crowd) {
    let owner = crowd.server.cmd(&["GET", crowd.keys.owner()]).unwrap();
    let owner = owner.as_str().unwrap();
    assert!(
        owner.starts_with(&format!("{} ", crowd.live_waiter)),
        "{owner}"
    );
    let pttl = crowd.server.cmd(&["PTTL", crowd.keys.owner()]).unwrap();
    let pttl = pttl.as_int().unwrap();
    assert!(
        (LIVE_LEASE_MS as i64 - 5_000..=LIVE_LEASE_MS as i64).contains(&pttl),
        "the handoff carries the waiter's own lease: PTTL {pttl}"
    );
    let left = crowd.server.cmd(&["EXISTS", crowd.keys.queue()]).unwrap();
    assert_eq!(left.as_int(), Some(0), "every dead waiter is purged");
}

/// One release at 10,000 dead waiters runs a bounded number of commands;
/// purge calls then grant the live waiter behind them, with its own lease.
#[test]
fn release_is_bounded_behind_ten_thousand_dead_waiters() {
    let crowd = crowd(true, DEAD);
    let (reply, inside, usec) = release_by_holder(&crowd);
    println!("release at {DEAD} dead waiters: {inside} commands inside the script, {usec} usec");
    assert!(
        inside <= MAX_COMMANDS_PER_CALL,
        "release ran {inside} commands"
    );
    assert_eq!(
        Release::decode(reply).unwrap(),
        ReleaseReply::Released {
            handed_to: None,
            purged: Purged {
                dropped: SCANNED_PER_CALL,
                more: true
            }
        }
    );
    let (_, dropped) = purge_until_granted(&crowd);
    assert_eq!(SCANNED_PER_CALL + dropped, DEAD);
    assert_granted_to_live_waiter(&crowd);
}

/// A release that comes after its lease ran out is refused, yet hands the
/// free lock on as a heartbeat would: at 10,000 dead waiters it purges a
/// bounded batch and says so (the dead waiters dropped, and that more are
/// left), so that its client counts them and goes on with purge calls.
/// Before, the refusal was a bare `{0}` and the purge it did went uncounted.
#[test]
fn a_late_release_reports_the_dead_waiters_it_purged() {
    let crowd = crowd(false, DEAD);
    let (reply, inside, _) = release_by_holder(&crowd);
    assert!(
        inside <= MAX_COMMANDS_PER_CALL,
        "release ran {inside} commands"
    );
    assert_eq!(
        Release::decode(reply).unwrap(),
        ReleaseReply::NotOwner {
            purged: Purged {
                dropped: SCANNED_PER_CALL,
                more: true
            }
        }
    );
    let (_, dropped) = purge_until_granted(&crowd);
    assert_eq!(SCANNED_PER_CALL + dropped, DEAD);
    assert_granted_to_live_waiter(&crowd);
}

/// A newcomer's acquire on a lock whose holder vanished, at 10,000 dead
/// waiters: bounded, no barging past the live waiter, and the purge calls
/// grant that waiter.
#[test]
fn acquire_is_bounded_behind_ten_thousand_dead_waiters() {
    let crowd = crowd(false, DEAD);
    let key_refs: Vec<&str> = crowd.keys.all().iter().map(String::as_str).collect();
    let timings = timings();
    let newcomer = OwnerId::new(&"d".repeat(32), LIVE_TAG, 30_000);
    let acquire = Acquire {
        owner_id: newcomer.as_str(),
        mode: AcquireMode::Try,
        timings: &timings,
        channel_prefix: CHANNEL_PREFIX,
        rejoin: None,
    };
    let (reply, inside, usec) = measured(&crowd.server, Acquire::SCRIPT, || {
        run_script(&crowd.server, Acquire::SCRIPT, &key_refs, &acquire.args()).unwrap()
    });
    println!(
        "try-acquire at {DEAD} dead waiters: {inside} commands inside the script, {usec} usec"
    );
    assert!(
        inside <= MAX_COMMANDS_PER_CALL,
        "acquire ran {inside} commands"
    );
    assert_eq!(
        Acquire::decode(reply).unwrap(),
        AcquireReply::Busy {
            purged: Purged {
                dropped: SCANNED_PER_CALL,
                more: true
            }
        },
        "a live waiter is queued: the newcomer must not barge"
    );
    let (_, dropped) = purge_until_granted(&crowd);
    assert_eq!(SCANNED_PER_CALL + dropped, DEAD);
    assert_granted_to_live_waiter(&crowd);
}

/// The live waiter behind a few dead ones asks again (a re-check: its
/// grant message was missed) after the holder's lease ran out: its own
/// acquire purges the dead waiters and grants it. The reply counts them,
/// as every other reply that purges does, for `fairlock_waiters_evicted`.
/// Before the fix the grant reply was `{1, token}` alone.
#[test]
fn an_acquire_granted_past_dead_waiters_counts_them() {
    const FEW: u64 = 5;
    let crowd = crowd(false, FEW);
    let key_refs: Vec<&str> = crowd.keys.all().iter().map(String::as_str).collect();
    let timings = timings();
    let acquire = Acquire {
        owner_id: &crowd.live_waiter,
        mode: AcquireMode::Wait,
        timings: &timings,
        channel_prefix: CHANNEL_PREFIX,
        rejoin: None,
    };
    let reply = run_script(&crowd.server, Acquire::SCRIPT, &key_refs, &acquire.args()).unwrap();
    let AcquireReply::Granted { token, purged } = Acquire::decode(reply).unwrap() else {
        panic!("the oldest live waiter is granted");
    };
    assert!(token > FEW + 2, "token {token} above every ticket");
    assert_eq!(
        purged,
        Purged {
            dropped: FEW,
            more: false
        }
    );
    assert_granted_to_live_waiter(&crowd);
}
