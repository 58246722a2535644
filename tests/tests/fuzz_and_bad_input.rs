//! Fuzzed names, options at their extremes, foreign and garbage values
//! under every lock key, and a misbehaving Redis, against a real
//! redis-server (issue 12, section 2).
//!
//! Each bad input gets a typed error that leaves Redis unchanged, or is
//! repaired, or works as documented; no call hangs (every call runs under
//! a generous hang guard), and no state is left that stalls the lock for
//! the next caller. The list of inputs and the error each gets is in the
//! README ("Bad input and the errors it gets"). Property tests of names and
//! reply decoding live in `crates/fairlock-core/tests/`.

use std::io::Write;
use std::time::Duration;

use fairlock::{ClientConfig, Error, LockClient, LockOptions, MAX_DURATION, MAX_NAME_BYTES};
use fairlock_core::{KeyPrefix, LockKeys, LockName, PermitFamily};
use fairlock_tests::*;

/// Hang guard: a call that does not end within this fails the test.
const NEVER: Duration = Duration::from_secs(20);

/// Runs `call` under the hang guard.
async fn bounded<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(NEVER, call).await {
        Ok(value) => value,
        Err(_) => panic!("{what} hung"),
    }
}

/// The names of the list, plus a few built from them.
fn listed_names() -> Vec<String> {
    let mut names: Vec<String> = [
        "x",
        "{",
        "}",
        "{}",
        "}{",
        "%",
        "%7D",
        "%25",
        "a",
        "a}:owner",
        "a}:queue",
        "a%7D:owner",
        "ü",
        "日本語",
        "\u{0}",
        " ",
        "a b",
        "*",
        "?",
        "\\",
        "\r\n",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    names.push("x".repeat(MAX_NAME_BYTES));
    names.push("}".repeat(MAX_NAME_BYTES));
    names.push("ü".repeat(MAX_NAME_BYTES / 2));
    names
}

/// Keys without a TTL (PTTL -1), fairlock's or not.
fn keys_without_ttl(server: &RedisServer) -> Vec<String> {
    dump(server)
        .into_iter()
        .map(|(key, _)| key)
        .filter(|key| server.cmd(&["PTTL", key]).ok().and_then(|r| r.as_int()) == Some(-1))
        .collect()
}

// ---------------------------------------------------------------- names

/// Every listed name locks and releases, two names that could collide
/// (`a` and `a}:owner`, `}` and `%7D`) are held at the same time, and no
/// key is left without a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_names_lock_release_and_leave_no_key_without_ttl() {
    let server = server();
    let client = client(&server).await;
    let names = listed_names();
    let mut guards = Vec::new();
    for name in &names {
        let guard = bounded("lock", client.lock(name))
            .await
            .unwrap_or_else(|e| panic!("lock {name:?}: {e}"));
        guards.push(guard);
    }
    // All held at once: no two names share an owner key.
    for name in &names {
        let state = bounded("inspect", client.inspect(name))
            .await
            .expect("inspect");
        assert!(state.owner.is_some(), "{name:?} is held");
        let other = bounded("try_lock", client.try_lock(name))
            .await
            .expect("try");
        assert!(
            other.is_none(),
            "{name:?} is held, try_lock must not get it"
        );
    }
    assert!(
        keys_without_ttl(&server).is_empty(),
        "{:?}",
        keys_without_ttl(&server)
    );
    for guard in guards {
        bounded("release", guard.release()).await.expect("release");
    }
    for name in &names {
        let state = bounded("inspect", client.inspect(name))
            .await
            .expect("inspect");
        assert_eq!(state.owner, None, "{name:?} was released");
        assert_eq!(state.queue_len, 0);
    }
    assert!(
        keys_without_ttl(&server).is_empty(),
        "{:?}",
        keys_without_ttl(&server)
    );
}

/// A cluster-enabled node computes the slot of every key of every listed
/// name as fairlock does (`CLUSTER KEYSLOT` is refused without cluster
/// mode, so one node is started with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_slots_match_cluster_keyslot() {
    let node = RedisServer::builder()
        .cluster_enabled()
        .start()
        .expect("a cluster-enabled redis-server");
    let prefix = KeyPrefix::new("app:").expect("prefix");
    for name in listed_names() {
        let keys = LockKeys::new(&prefix, &LockName::new(name.as_str()).expect("valid"));
        for key in keys.all() {
            let slot = node.cmd(&["CLUSTER", "KEYSLOT", key]).expect("KEYSLOT");
            assert_eq!(
                slot.as_int(),
                Some(i64::from(keys.slot())),
                "{name:?}: {key}"
            );
        }
    }
}

/// Empty and limit+1 names are refused before Redis is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_oversized_names_are_refused_untouched() {
    let server = server();
    let client = client(&server).await;
    let before = dump(&server);
    for name in [
        String::new(),
        "x".repeat(MAX_NAME_BYTES + 1),
        "ü".repeat(MAX_NAME_BYTES / 2 + 1),
    ] {
        let results = [
            bounded("lock", client.lock(&name)).await.map(drop),
            bounded("try", client.try_lock(&name)).await.map(drop),
            bounded("inspect", client.inspect(&name)).await.map(drop),
            bounded("force", client.force_release(&name))
                .await
                .map(drop),
            bounded("release", client.release_by_owner_id(&name, "x")).await,
        ];
        for result in results {
            assert!(
                matches!(result, Err(Error::InvalidName(_))),
                "{}: {result:?}",
                name.len()
            );
        }
    }
    assert_eq!(dump(&server), before);
}

// -------------------------------------------------------------- options

/// Leases, wait timeouts and client timings at 0, 1 ms, MAX_DURATION and
/// beyond, `Duration::MAX` and `u64::MAX` ms: refused with
/// `InvalidOptions` before Redis is touched, or working as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_at_their_extremes() {
    let server = server();
    let client = client(&server).await;
    let holder = client.lock("busy").await.expect("a busy lock");
    let before = dump(&server);
    let refused_leases = [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::MAX,
        Duration::from_millis(u64::MAX),
        MAX_DURATION + Duration::from_nanos(1),
    ];
    let refused_waits = [
        Duration::MAX,
        Duration::from_millis(u64::MAX),
        MAX_DURATION + Duration::from_nanos(1),
    ];
    for name in ["busy", "free"] {
        for lease in refused_leases {
            let options = LockOptions::new().lease(lease);
            let lock = bounded("lock", client.lock_with(name, options)).await;
            assert!(
                matches!(lock, Err(Error::InvalidOptions(_))),
                "{lease:?}: {lock:?}"
            );
            let try_lock = bounded("try", client.try_lock_with(name, options)).await;
            assert!(
                matches!(try_lock, Err(Error::InvalidOptions(_))),
                "{lease:?}: {try_lock:?}"
            );
            let extend = bounded(
                "extend",
                client.extend_by_owner_id(name, holder.owner_id(), lease),
            )
            .await;
            assert!(
                matches!(extend, Err(Error::InvalidOptions(_))),
                "{lease:?}: {extend:?}"
            );
        }
        for wait in refused_waits {
            let options = LockOptions::new().wait_timeout(wait);
            let lock = bounded("lock", client.lock_with(name, options)).await;
            assert!(
                matches!(lock, Err(Error::InvalidOptions(_))),
                "{wait:?}: {lock:?}"
            );
        }
    }
    assert_eq!(dump(&server), before, "refused options changed Redis");
    // try_lock_with waits up to its wait timeout; an absurd one is refused there too.
    for wait in refused_waits {
        let options = LockOptions::new().wait_timeout(wait);
        let try_lock = bounded("try", client.try_lock_with("free", options)).await;
        assert!(
            matches!(try_lock, Err(Error::InvalidOptions(_))),
            "{wait:?}: {try_lock:?}"
        );
    }
    assert_eq!(dump(&server), before, "refused options changed Redis");

    // A wait timeout shorter than a round trip (1 µs), or 0, on a busy
    // lock: WaitTimeout, and no queue entry is left behind.
    for timeout in [
        Duration::ZERO,
        Duration::from_micros(1),
        Duration::from_millis(1),
    ] {
        let waited = bounded(
            "lock",
            client.lock_with("busy", LockOptions::new().wait_timeout(timeout)),
        )
        .await;
        assert!(
            matches!(waited, Err(Error::WaitTimeout { .. })),
            "{timeout:?}: {waited:?}"
        );
        let state = client.inspect("busy").await.expect("inspect");
        assert_eq!(state.queue_len, 0, "{timeout:?}: the waiter left the queue");
    }
    // ... and on a free lock the first call already grants it.
    let quick = bounded(
        "lock",
        client.lock_with(
            "free",
            LockOptions::new().wait_timeout(Duration::from_micros(1)),
        ),
    )
    .await
    .expect("a free lock is granted before any wait");
    quick.release().await.expect("release");
    // A 1 ms lease and MAX_DURATION are accepted.
    for lease in [Duration::from_millis(1), MAX_DURATION] {
        let guard = bounded(
            "lock",
            client.lock_with("edge", LockOptions::new().lease(lease)),
        )
        .await
        .unwrap_or_else(|e| panic!("lease {lease:?}: {e}"));
        assert!(guard.token().value() > 0);
        // A 1 ms lease may be gone by now: NotOwner then, as documented.
        // A MAX_DURATION lease is not: only Ok is right (before, NotOwner
        // passed for both, hiding a lease cut short).
        let released = guard.release().await;
        if lease == MAX_DURATION {
            assert!(matches!(released, Ok(())), "lease {lease:?}: {released:?}");
        } else {
            assert!(
                matches!(released, Ok(()) | Err(Error::NotOwner { .. })),
                "lease {lease:?}: {released:?}"
            );
        }
    }
    let free = client.try_lock("edge").await.expect("try");
    assert!(free.is_some(), "nothing stalls the lock after the extremes");
    holder.release().await.expect("release");
}

/// Client timings at 0, `Duration::MAX` and `u64::MAX` ms are refused
/// before any connection is made (the URL points at a closed port, so a
/// call that got past validation would fail with `Unreachable` instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_timings_at_their_extremes_are_refused_before_connecting() {
    let url = "redis://127.0.0.1:1";
    type Setter = fn(&mut ClientConfig, Duration);
    let fields: [(&str, Setter); 5] = [
        ("connect timeout", |c, d| c.connect_timeout = d),
        ("command timeout", |c, d| c.command_timeout = d),
        ("heartbeat interval", |c, d| c.heartbeat_interval = d),
        ("waiter timeout", |c, d| c.waiter_timeout = d),
        ("watchdog lease", |c, d| c.watchdog_lease = d),
    ];
    for (what, set) in fields {
        for value in [
            Duration::ZERO,
            Duration::MAX,
            Duration::from_millis(u64::MAX),
            MAX_DURATION + Duration::from_millis(1),
        ] {
            let mut config = ClientConfig::new(url);
            set(&mut config, value);
            let result = bounded("connect", LockClient::with_config(config)).await;
            match result {
                Err(Error::InvalidOptions(message)) => {
                    assert!(
                        message.contains(what) || message.contains("heartbeat"),
                        "{message}"
                    )
                }
                other => panic!("{what} = {value:?}: {:?}", other.err()),
            }
        }
    }
}

// ------------------------------------------------- foreign types and garbage

/// The lock's key of each role under the default prefix.
fn role_key(name: &str, role: &str) -> String {
    let keys = keys(name);
    match role {
        "owner" => keys.owner(),
        "queue" => keys.queue(),
        "alive" => keys.alive(),
        "seq" => keys.seq(),
        _ => keys.freed(),
    }
    .to_owned()
}

/// The commands that plant a value of type `kind` at `key`.
fn plant(server: &RedisServer, key: &str, kind: &str) {
    server.cmd(&["DEL", key]).expect("DEL");
    let reply = match kind {
        "string" => server.cmd(&["SET", key, "somebody else's data"]),
        "hash" => server.cmd(&["HSET", key, "field", "value"]),
        "list" => server.cmd(&["RPUSH", key, "item"]),
        "set" => server.cmd(&["SADD", key, "item"]),
        _ => server.cmd(&["ZADD", key, "1", "item"]),
    };
    assert!(!reply.expect("plant").is_error(), "plant {kind} at {key}");
}

/// What one operation gave, reduced for assertions.
#[derive(Debug)]
enum Outcome {
    Works,
    WrongType(String),
    Other(Error),
}

fn outcome<T>(result: fairlock::Result<T>) -> Outcome {
    match result {
        Ok(_) => Outcome::Works,
        Err(Error::WrongType(message)) => Outcome::WrongType(message),
        Err(other) => Outcome::Other(other),
    }
}

/// Every key of a lock holding a value of each foreign type, against
/// lock, try_lock, inspect, force_release and release: a WrongType error
/// naming that key with Redis unchanged, or the call works without
/// touching the foreign value; seq and freed are fairlock's own
/// disposable keys and are repaired (overwritten) by design.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_types_under_every_key() {
    let server = server();
    let client = client(&server).await;
    let rival = fairlock_tests::client(&server).await;
    let name = "typed";
    let roles = ["owner", "queue", "alive", "seq", "freed"];
    for role in roles {
        let expected_type = if matches!(role, "queue" | "alive") {
            "zset"
        } else {
            "string"
        };
        for kind in ["string", "hash", "list", "set", "zset"] {
            if kind == expected_type && role != "owner" {
                continue; // a zset under a zset key is garbage, tested below
            }
            let key = role_key(name, role);
            let label = format!("{role} as {kind}");
            // Each operation on a fresh plant; `held` ones take the lock first.
            for op in [
                "lock",
                "try_lock",
                "inspect",
                "force_release",
                "release",
                "wait",
            ] {
                server.cmd(&["FLUSHALL"]).expect("flush");
                let mut guard = match op {
                    "release" | "wait" => Some(
                        client
                            .lock_with(name, LockOptions::new().lease(Duration::from_secs(30)))
                            .await
                            .expect("lock before planting"),
                    ),
                    _ => None,
                };
                plant(&server, &key, kind);
                let before = dump(&server);
                let wait = LockOptions::new().wait_timeout(Duration::from_secs(2));
                let short_wait = LockOptions::new().wait_timeout(Duration::from_millis(300));
                let result = match op {
                    "lock" => outcome(bounded(op, client.lock_with(name, wait)).await),
                    "try_lock" => outcome(bounded(op, client.try_lock(name)).await),
                    "inspect" => outcome(bounded(op, client.inspect(name)).await),
                    "force_release" => outcome(bounded(op, client.force_release(name)).await),
                    "release" => outcome(bounded(op, guard.take().expect("held").release()).await),
                    // Another process waits on the held lock: it must join
                    // the queue, which touches queue and alive.
                    // A WaitTimeout here means it queued normally: works.
                    _ => match bounded(op, rival.lock_with(name, short_wait)).await {
                        Err(Error::WaitTimeout { .. }) => Outcome::Works,
                        other => outcome(other),
                    },
                };
                let after = dump(&server);
                match (&result, role, op) {
                    (Outcome::WrongType(message), _, _) => {
                        assert!(
                            message.contains(&key),
                            "{label}, {op}: {message} names {key}"
                        );
                        assert_eq!(after, before, "{label}, {op}: changed Redis");
                        let still = server.cmd(&["TYPE", &key]).expect("TYPE");
                        assert_eq!(still.as_str(), Some(kind), "{label}, {op}: value kept");
                    }
                    // A string at the owner key that fairlock did not
                    // write is refused like another type (see below);
                    // any other case that works must leave the foreign
                    // value alone, except seq and freed, which are
                    // fairlock's own disposable keys: repaired.
                    (Outcome::Works, "seq" | "freed", _) => {}
                    (Outcome::Works, _, _) => {
                        let still = server.cmd(&["TYPE", &key]).expect("TYPE");
                        assert_eq!(
                            still.as_str(),
                            Some(kind),
                            "{label}, {op}: works but overwrote"
                        );
                    }
                    // A release whose owner key was replaced by another
                    // string: the lease is lost, as documented.
                    (Outcome::Other(Error::NotOwner { .. }), "owner", "release") => {}
                    (Outcome::Other(error), _, _) => {
                        panic!("{label}, {op}: neither WrongType nor working: {error:?}")
                    }
                }
                eprintln!("{label:>16}, {op:>13}: {}", describe(&result));
                drop(guard);
            }
        }
    }
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Works => "works".to_owned(),
        Outcome::WrongType(_) => "WrongType".to_owned(),
        Outcome::Other(error) => format!("{error:?}"),
    }
}

/// Garbage of the right type: each is refused with WrongType, repaired, or
/// passed over, and the lock then works for the next caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_values_are_refused_or_repaired() {
    let server = server();
    let client = client(&server).await;
    let name = "garbage";
    let k = keys(name);
    let wait = LockOptions::new().wait_timeout(Duration::from_secs(3));

    // Owner strings fairlock did not write: refused, untouched.
    for value in [
        "somebody else's data",
        "owner-id-without-token",
        "",
        "a b c 1",
    ] {
        server.cmd(&["FLUSHALL"]).expect("flush");
        server.cmd(&["SET", k.owner(), value]).expect("SET");
        let before = dump(&server);
        for result in [
            outcome(bounded("lock", client.lock_with(name, wait)).await),
            outcome(bounded("try", client.try_lock(name)).await),
            outcome(bounded("inspect", client.inspect(name)).await),
            outcome(bounded("force", client.force_release(name)).await),
        ] {
            match result {
                Outcome::WrongType(message) => assert!(message.contains(k.owner()), "{message}"),
                other => panic!("owner {value:?}: {other:?}"),
            }
        }
        assert_eq!(dump(&server), before, "owner {value:?}: changed Redis");
    }

    // Queue entries of no live process, well-formed or not, are dropped
    // by the next caller, who gets the lock.
    let dead_owner_id = format!("{}.00000000000000ee.1000", "0".repeat(32));
    for owner_id in [
        dead_owner_id.as_str(),
        "garbage",
        "a.b.c",
        "",
        "..",
        "x.ff.-5",
    ] {
        for op in ["lock", "try_lock"] {
            server.cmd(&["FLUSHALL"]).expect("flush");
            server
                .cmd(&["ZADD", k.queue(), "1", owner_id])
                .expect("ZADD");
            server
                .cmd(&["PEXPIRE", k.queue(), "60000"])
                .expect("PEXPIRE");
            let guard = match op {
                "lock" => bounded("lock", client.lock_with(name, wait))
                    .await
                    .map(Some),
                _ => bounded("try", client.try_lock(name)).await,
            };
            let guard = guard
                .unwrap_or_else(|e| panic!("queue entry {owner_id:?}, {op}: {e}"))
                .unwrap_or_else(|| panic!("queue entry {owner_id:?}, {op}: still busy"));
            guard.release().await.expect("release");
        }
        let state = client.inspect(name).await.expect("inspect");
        assert_eq!(state.queue_len, 0, "{owner_id:?} was dropped");
    }

    // An entry of a live process whose lease has a leading zero: once
    // taken as well-formed, it failed the grant (`SET ... PX 060000` is
    // refused), so the caller got an error and the lock stayed stuck; it
    // is not fairlock's format and is dropped like the ones above.
    let zero_led = format!("{}.00000000000000ef.060000", "0".repeat(32));
    server.cmd(&["FLUSHALL"]).expect("flush");
    server
        .cmd(&["ZADD", k.queue(), "1", &zero_led])
        .expect("ZADD");
    server
        .cmd(&["ZADD", k.alive(), "+inf", "00000000000000ef"])
        .expect("ZADD");
    let guard = bounded("lock", client.lock_with(name, wait))
        .await
        .unwrap_or_else(|e| panic!("queue entry {zero_led:?}: {e}"));
    guard.release().await.expect("release");
    assert_eq!(client.inspect(name).await.expect("inspect").queue_len, 0);

    // A process whose alive deadline passed (0, or long ago), and one with
    // an endless deadline that listens nowhere: its waiter is passed over.
    for deadline in ["0", "-inf", "+inf"] {
        server.cmd(&["FLUSHALL"]).expect("flush");
        server
            .cmd(&["ZADD", k.queue(), "1", &dead_owner_id])
            .expect("ZADD");
        server
            .cmd(&["ZADD", k.alive(), deadline, "00000000000000ee"])
            .expect("ZADD");
        let guard = bounded("lock", client.lock_with(name, wait))
            .await
            .unwrap_or_else(|e| panic!("alive deadline {deadline}: {e}"));
        guard.release().await.expect("release");
        assert_eq!(client.inspect(name).await.expect("inspect").queue_len, 0);
    }

    // A seq holding text, or a negative number: repaired by design (the
    // next number is above the server clock); tokens stay increasing.
    for value in ["not a number", "-5", "1.5", ""] {
        server.cmd(&["FLUSHALL"]).expect("flush");
        server
            .cmd(&["SET", k.seq(), value, "PX", "60000"])
            .expect("SET");
        let first = bounded("lock", client.lock(name)).await.expect("lock");
        let token = first.token().value();
        first.release().await.expect("release");
        let second = bounded("lock", client.lock(name)).await.expect("lock");
        assert!(
            second.token().value() > token,
            "seq {value:?}: tokens increase"
        );
        second.release().await.expect("release");
    }

    // An owner in fairlock's format that no client holds, without a TTL
    // (written by hand): the lock looks held forever; force_release is the
    // documented way out, after which the lock works.
    server.cmd(&["FLUSHALL"]).expect("flush");
    let ghost = format!("{}.00000000000000ee.1000 5", "0".repeat(32));
    server.cmd(&["SET", k.owner(), &ghost]).expect("SET");
    assert!(
        client.try_lock(name).await.expect("try").is_none(),
        "held by the ghost"
    );
    assert!(
        client.force_release(name).await.expect("force"),
        "the ghost is evicted"
    );
    let guard = bounded("lock", client.lock(name))
        .await
        .expect("lock after the ghost");
    guard.release().await.expect("release");

    // freed holding another owner id: a release by a non-owner is refused.
    server.cmd(&["FLUSHALL"]).expect("flush");
    server
        .cmd(&["SET", k.freed(), "someone", "PX", "60000"])
        .expect("SET");
    let nobody = format!("{}.00000000000000ee.1000", "0".repeat(32));
    let refused = client.release_by_owner_id(name, &nobody).await;
    assert!(
        matches!(refused, Err(Error::NotOwner { .. })),
        "{refused:?}"
    );
}

/// A queued owner id whose process is alive but whose lease field is not a
/// usable PX (0, or too big for Redis) once made the granting script fail
/// half-way (`SET ... PX 0` after the ZREM and the seq write); such an
/// entry is now dropped like a dead one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_owner_id_with_an_unusable_lease_is_passed_over() {
    let server = server();
    let client = client(&server).await;
    let k = keys("lease0");
    for lease in ["0", "99999999999999999999"] {
        server.cmd(&["FLUSHALL"]).expect("flush");
        let owner_id = format!("{}.00000000000000ee.{lease}", "0".repeat(32));
        server
            .cmd(&["ZADD", k.queue(), "1", &owner_id])
            .expect("ZADD");
        server
            .cmd(&["ZADD", k.alive(), "+inf", "00000000000000ee"])
            .expect("ZADD");
        let _listener = listener(&server, "fairlock:notify:00000000000000ee").await;
        let result = bounded("lock", client.try_lock("lease0")).await;
        assert!(
            !matches!(
                result,
                Err(Error::ScriptFailed { .. } | Error::Redis { .. })
            ),
            "lease {lease}: {result:?}"
        );
    }
}

/// A seq at or above 2^53 was once trusted: Lua numbers are doubles, so
/// `last + 1` stopped increasing (tokens repeated), and at 2^63 every
/// grant was orphaned. `next_seq` now repairs a value more than a day
/// ahead of the server clock, like a foreign type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_seq_is_repaired() {
    let server = server();
    let client = client(&server).await;
    let k = keys("huge");
    for seq in ["9007199254740993", "99999999999999999999"] {
        server.cmd(&["FLUSHALL"]).expect("flush");
        server
            .cmd(&["SET", k.seq(), seq, "PX", "600000"])
            .expect("SET");
        let first = bounded("lock", client.lock("huge")).await.expect("lock");
        let token = first.token().value();
        first.release().await.expect("release");
        let second = bounded("lock", client.lock("huge")).await.expect("lock");
        assert!(second.token().value() > token, "seq {seq}: tokens increase");
        second.release().await.expect("release");
    }
}

// ------------------------------------------------------ Redis misbehaving

/// Redis dies while a task waits, and comes back (empty, no persistence):
/// the waiter keeps waiting and gets the lock after the restart; the
/// holder is told its lease is lost. A waiter with a wait timeout ends with
/// WaitTimeout while the server is down, never hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_dying_mid_wait() {
    let mut server = server();
    let holder_client = client(&server).await;
    let waiter_client = client(&server).await;
    let holder = holder_client.lock("mid-wait").await.expect("holder");
    let waiter = {
        let c = waiter_client.clone();
        tokio::spawn(async move { c.lock("mid-wait").await })
    };
    wait_for_queue_len(&holder_client, "mid-wait", 1).await;
    // And the waiting task knows it: an acquire that ran just before the
    // kill, its reply never sent, leaves a task that cannot know it was
    // queued, which fails like an acquire sent while Redis is down (the
    // hunt for a CI failure of this test found that race, 1 run in 16).
    for _ in 0..500 {
        if waiter_client.stats().queued == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        waiter_client.stats().queued,
        1,
        "the waiter knows it is queued"
    );
    server.kill();
    // While Redis is down, a bounded wait ends with WaitTimeout.
    let bounded_wait = bounded(
        "bounded wait",
        waiter_client.lock_with(
            "other",
            LockOptions::new().wait_timeout(Duration::from_millis(300)),
        ),
    )
    .await;
    eprintln!("a bounded wait while Redis is down: {bounded_wait:?}");
    assert!(
        matches!(
            bounded_wait,
            Err(Error::WaitTimeout { .. } | Error::Timeout { .. } | Error::Redis { .. })
        ),
        "{bounded_wait:?}"
    );
    server.restart().expect("restart");
    let granted = bounded("waiter after restart", waiter)
        .await
        .expect("task")
        .expect("the waiter gets the lock after the restart");
    bounded("lease lost", holder.lost()).await;
    granted.release().await.expect("release");
    let next = holder_client.try_lock("mid-wait").await.expect("try");
    assert!(next.is_some(), "nothing stalls the lock after the restart");
}

/// A server with one ACL user lacking `perm` (an ACL rule), started fresh.
fn server_with_user(rules: &[&str]) -> RedisServer {
    let mut args = vec!["--user", "limited", "on", ">pw"];
    args.extend_from_slice(rules);
    RedisServer::builder()
        .args(args)
        .start()
        .expect("redis-server with an ACL user")
}

fn limited_config(server: &RedisServer) -> ClientConfig {
    let mut config = fast_config(server);
    config.url = format!("redis://limited:pw@127.0.0.1:{}", server.port());
    config
}

/// An ACL user lacking EVALSHA gets NoPermission at the first lock call;
/// one lacking SUBSCRIBE, or the notify channels, at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_lacking_a_permission_get_no_permission() {
    let no_evalsha = server_with_user(&["~*", "&*", "+@all", "-evalsha"]);
    let client = bounded(
        "connect",
        LockClient::with_config(limited_config(&no_evalsha)),
    )
    .await
    .expect("connects: EVALSHA is only needed by lock calls");
    let before = dump(&no_evalsha);
    for result in [
        bounded("lock", client.lock("acl")).await.map(drop),
        bounded("try", client.try_lock("acl")).await.map(drop),
        bounded("inspect", client.inspect("acl")).await.map(drop),
    ] {
        match result {
            Err(error @ Error::NoPermission(_)) => {
                assert!(error.to_string().contains("evalsha"), "{error}")
            }
            other => panic!("no EVALSHA: {other:?}"),
        }
    }
    assert_eq!(dump(&no_evalsha), before);

    for rules in [
        &["~*", "&*", "+@all", "-subscribe"][..],
        &["~*", "resetchannels", "+@all"][..],
    ] {
        let server = server_with_user(rules);
        let refused = bounded("connect", LockClient::with_config(limited_config(&server))).await;
        assert!(
            matches!(refused, Err(Error::NoPermission(_))),
            "{rules:?}: {:?}",
            refused.err()
        );
    }
}

/// A server with a password (`requirepass`, the URL's `:password@`): all
/// three connections authenticate, the pub/sub one too (fairlock's own on
/// a single server: without its AUTH, its SUBSCRIBE would be refused with
/// NOAUTH and the client would not connect), and a waiter is granted by
/// another client's release. A wrong password is Unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_protected_server_is_used_with_the_urls_password() {
    // Set after start: the test kit's readiness PING has no password.
    let server = server();
    server
        .cmd_ok(&["CONFIG", "SET", "requirepass", "s3cret"])
        .expect("requirepass");
    let with_password = |password: &str| {
        let mut config = fast_config(&server);
        config.url = format!("redis://:{password}@127.0.0.1:{}", server.port());
        config
    };
    let holder_client = bounded("connect", LockClient::with_config(with_password("s3cret")))
        .await
        .expect("connects with the password");
    let waiter_client = bounded("connect", LockClient::with_config(with_password("s3cret")))
        .await
        .expect("connects with the password");
    let holder = holder_client.lock("pw").await.expect("lock");
    let waiter = spawn_lock(&waiter_client, "pw");
    wait_for_queue_len(&holder_client, "pw", 1).await;
    holder.release().await.expect("release");
    granted(waiter, "the waiter of the other client")
        .await
        .release()
        .await
        .expect("release");
    let wrong = bounded("connect", LockClient::with_config(with_password("wrong"))).await;
    assert!(
        matches!(wrong, Err(Error::Unreachable { .. })),
        "{:?}",
        wrong.err()
    );
}

/// A replica refuses writes: lock and try_lock get ReadOnly; read-only
/// calls work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refuses_lock_calls_with_read_only() {
    let primary = server();
    let replica = RedisServer::builder()
        .args(["--replicaof", "127.0.0.1", &primary.port().to_string()])
        .start()
        .expect("replica");
    for _ in 0..200 {
        let info = replica.cmd(&["INFO", "replication"]).expect("INFO");
        if info
            .as_str()
            .unwrap_or_default()
            .contains("master_link_status:up")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let client = bounded("connect", LockClient::with_config(fast_config(&replica)))
        .await
        .expect("connects to the replica");
    for result in [
        bounded("lock", client.lock("ro")).await.map(drop),
        bounded("try", client.try_lock("ro")).await.map(drop),
    ] {
        assert!(matches!(result, Err(Error::ReadOnly(_))), "{result:?}");
    }
    let state = bounded("inspect", client.inspect("ro"))
        .await
        .expect("inspect reads");
    assert_eq!(state.owner, None);
    assert!(dump(&primary).is_empty(), "nothing was written anywhere");
}

/// maxmemory reached under noeviction: a write that Redis refuses gets
/// OutOfMemory and changes nothing (a fenced write); a holder can still
/// release (its first write is a DEL, which Redis allows, and a script that
/// has written may go on), so nothing stalls the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_a_typed_error_and_release_still_works() {
    let server = server();
    let client = client(&server).await;
    let holder = client
        .lock_with(
            "oom-held",
            LockOptions::new().lease(Duration::from_secs(60)),
        )
        .await
        .expect("held before OOM");
    server
        .cmd(&["CONFIG", "SET", "maxmemory", "1"])
        .expect("maxmemory");
    let before = dump(&server);
    let write = bounded(
        "fenced write",
        client.fenced_write(
            "{r}:fence",
            "{r}:value",
            holder.token(),
            fairlock::FencedOp::set("1"),
        ),
    )
    .await;
    match write {
        Err(error @ Error::OutOfMemory(_)) => {
            assert!(error.to_string().contains("noeviction"), "{error}")
        }
        other => panic!("a fenced write under OOM: {other:?}"),
    }
    assert_eq!(dump(&server), before, "a refused write changed Redis");
    bounded("release", holder.release())
        .await
        .expect("a holder can release under OOM");
    let rival = fairlock_tests::client(&server).await;
    server
        .cmd(&["CONFIG", "SET", "maxmemory", "0"])
        .expect("maxmemory");
    let next = rival.try_lock("oom-held").await.expect("try");
    assert!(next.is_some(), "nothing stalls the lock");
}

/// Under OOM, acquire once still took locks: the `pcall` around its first
/// write took the OOM refusal for a foreign type and repaired with a DEL,
/// after which Redis let the script write past maxmemory. Only WRONGTYPE
/// is repaired or reported as such now; any other refusal is raised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_under_oom_is_refused() {
    let server = server();
    let client = client(&server).await;
    client
        .lock("used")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    server
        .cmd(&["CONFIG", "SET", "maxmemory", "1"])
        .expect("maxmemory");
    let before = dump(&server);
    for name in ["used", "fresh"] {
        for result in [
            bounded("lock", client.lock(name)).await.map(drop),
            bounded("try", client.try_lock(name)).await.map(drop),
        ] {
            assert!(
                matches!(result, Err(Error::OutOfMemory(_))),
                "{name}: {result:?}"
            );
        }
    }
    assert_eq!(dump(&server), before);
}

/// Another connection runs a script past busy-reply-threshold: lock calls
/// get Busy at once instead of waiting; after SCRIPT KILL the lock works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_script_is_a_typed_error() {
    let server = RedisServer::builder()
        .args(["--busy-reply-threshold", "50"])
        .start()
        .expect("redis-server");
    let client = client(&server).await;
    let mut hog = std::net::TcpStream::connect(server.addr()).expect("connect");
    hog.write_all(b"*3\r\n$4\r\nEVAL\r\n$17\r\nwhile true do end\r\n$1\r\n0\r\n")
        .expect("send the endless script");
    let mut busy = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        match bounded("lock", client.try_lock("busy")).await {
            Err(Error::Busy(message)) => {
                busy = Some(message);
                break;
            }
            other => eprintln!("not busy yet: {:?}", other.map(|g| g.is_some())),
        }
    }
    let message = busy.expect("a lock call during the endless script gets Busy");
    assert!(message.starts_with("BUSY"), "{message}");
    let lock = bounded("lock", client.lock("busy")).await;
    assert!(matches!(lock, Err(Error::Busy(_))), "{lock:?}");
    let killed = server.cmd(&["SCRIPT", "KILL"]).expect("SCRIPT KILL");
    assert!(!killed.is_error(), "{killed:?}");
    // The script stops at its next interrupt check, just after the OK.
    for _ in 0..200 {
        if !server.cmd(&["PING"]).expect("PING").is_error() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let guard = bounded("lock", client.lock("busy"))
        .await
        .expect("works after SCRIPT KILL");
    guard.release().await.expect("release");
    assert_eq!(client.inspect("busy").await.expect("inspect").queue_len, 0);
}

/// An acquire refused with WrongType leaves no work behind in the client:
/// its cancel, which fails the same way, is not retried every heartbeat
/// for as long as the foreign key exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_type_refusal_leaves_no_retries_behind() {
    let server = server();
    let client = client(&server).await;
    plant(&server, &role_key("retry", "queue"), "string");
    let refused = bounded("lock", client.lock("retry")).await;
    assert!(matches!(refused, Err(Error::WrongType(_))), "{refused:?}");
    // Once the cancel the refused acquire left has run, refused the same
    // way (a second WRONGTYPE; a 300 ms sleep stood here), count.
    within("the acquire's cancel to be refused", async {
        while errors_answered(&server, "WRONGTYPE") < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let before = calls(&server, "evalsha");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let during = calls(&server, "evalsha") - before;
    assert_eq!(
        during, 0,
        "script calls in 10 heartbeat intervals after the refusal"
    );
}

/// `inspect` with its queue listed reads queue entries fairlock did not
/// write (a member that is no owner id, or not UTF-8; a ticket of `+inf`)
/// and processes with an endless deadline without failing: such entries
/// are left out of the list (the next caller drops them), and the others
/// are listed. Before, the whole call failed with `Error::Protocol`, whose
/// message blamed mismatched scripts (and so did the CLI's `inspect` and
/// `watch`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_lists_the_waiters_around_garbage_queue_entries() {
    let server = server();
    let client = client(&server).await;
    let name = "garbage-queue";
    let k = keys(name);
    let waiter = format!("{}.00000000000000ee.1000", "0".repeat(32));
    let endless = format!("{}.00000000000000ef.1000", "1".repeat(32));
    for (score, member) in [
        ("+inf", "garbage-inf"),
        ("1", "a.b.c"),
        ("2", waiter.as_str()),
        ("3", endless.as_str()),
        ("-inf", "negative"),
    ] {
        server
            .cmd(&["ZADD", k.queue(), score, member])
            .expect("ZADD");
    }
    server
        .cmd(&[
            "EVAL",
            "redis.call('ZADD', KEYS[1], 4, string.char(255) .. '.ff.1000')",
            "1",
            k.queue(),
        ])
        .expect("EVAL");
    server
        .cmd(&["ZADD", k.alive(), "+inf", "00000000000000ef"])
        .expect("ZADD");
    let state = bounded("inspect", client.inspect_queue(name, 10))
        .await
        .unwrap_or_else(|e| panic!("inspect with garbage queued: {e}"));
    assert_eq!(state.queue_len, 6);
    let listed: Vec<(&str, u64)> = state
        .waiters
        .iter()
        .map(|w| (w.owner_id.as_str(), w.ticket))
        .collect();
    assert_eq!(listed, [(waiter.as_str(), 2), (endless.as_str(), 3)]);
}

/// An ACL user that may subscribe to the notify channels but not publish
/// on them (`-publish`, or a channel rule that lets `SUBSCRIBE` through
/// and `PUBLISH` not) is refused at connect with `NoPermission`: a release
/// handing the lock to a waiter of another process publishes its grant
/// inside the script, after its writes, and a refused `PUBLISH` there
/// failed the release halfway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_that_cannot_publish_grants_is_refused_at_connect() {
    let server = server_with_user(&["~*", "&*", "+@all", "-publish"]);
    let refused = bounded("connect", LockClient::with_config(limited_config(&server))).await;
    match refused {
        Err(error @ Error::NoPermission(_)) => {
            assert!(error.to_string().contains("publish"), "{error}")
        }
        other => panic!("a user without PUBLISH: {:?}", other.map(|_| "connected")),
    }
}

/// `PUBLISH` taken from the clients' user after they connected (the
/// connect-time check passed): a release handing the lock to a waiter of
/// another process still succeeds with all its writes (the lock handed on,
/// the release recorded), and the waiter, whose grant message Redis
/// refused, is granted as when nobody heard it: its lease cut to the
/// waiter TTL until its process's next heartbeat finds the grant. The same
/// for a semaphore's permit, and for a forced release's message to the
/// evicted holder. Before, the refused `PUBLISH` failed each of them
/// halfway (`ScriptFailed`, the lock already handed on with the waiter's
/// full lease and no release record, or already freed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_refused_after_connect_still_hands_the_lock_on() {
    let server = server_with_user(&["~*", "&*", "+@all"]);
    let connect = || async {
        bounded("connect", LockClient::with_config(limited_config(&server)))
            .await
            .expect("a user with every permission connects")
    };
    let (holder_client, waiter_client) = (connect().await, connect().await);
    let name = "acl-changed";
    let holder = bounded("lock", holder_client.lock(name))
        .await
        .expect("the holder");
    let waiter = {
        let client = waiter_client.clone();
        tokio::spawn(async move { client.lock(name).await })
    };
    wait_for_queue_len(&holder_client, name, 1).await;
    server
        .cmd_ok(&["ACL", "SETUSER", "limited", "-publish"])
        .expect("take PUBLISH from the user");
    let holder_token = holder.token().value();
    let released = bounded("release", holder.release()).await;
    assert!(
        released.is_ok(),
        "a release whose grant message was refused: {released:?}"
    );
    let keys = LockKeys::new(&KeyPrefix::default(), &LockName::new(name).expect("name"));
    let freed = server.cmd(&["GET", keys.freed()]).expect("GET freed");
    assert!(
        freed.as_str().is_some(),
        "the release is recorded, as every release is: {freed:?}"
    );
    let granted = bounded("the waiter's grant", waiter)
        .await
        .expect("task")
        .expect("the waiter is granted by its heartbeat");
    assert!(granted.token().value() > holder_token);
    assert!(!granted.is_lost(), "the waiter set its own lease");
    bounded("release", granted.release())
        .await
        .expect("the waiter's release, with nobody to publish to");

    // The same for a semaphore's permit, given on by `permit_release.lua`.
    let semaphore = |client: &LockClient| client.semaphore(name, 1).expect("semaphore");
    let permit = bounded("acquire", semaphore(&holder_client).acquire())
        .await
        .expect("the permit");
    let waiter = {
        let semaphore = semaphore(&waiter_client);
        tokio::spawn(async move { semaphore.acquire().await })
    };
    wait_for_zcard(
        &server,
        permit_keys(name, PermitFamily::Semaphore).queue(),
        1,
    )
    .await;
    let released = bounded("permit release", permit.release()).await;
    assert!(
        released.is_ok(),
        "a permit release whose grant message was refused: {released:?}"
    );
    let granted = bounded("the permit waiter's grant", waiter)
        .await
        .expect("task")
        .expect("the permit waiter is granted by its heartbeat");
    bounded("permit release", granted.release())
        .await
        .expect("the waiter's permit release");

    // An administrator's forced release: its `revoked` message to the
    // holder's process is refused too; the lock is freed all the same, and
    // the holder learns of it at its next lease check.
    let holder = bounded("lock", holder_client.lock("acl-forced"))
        .await
        .expect("a holder to evict");
    let forced = bounded("force release", waiter_client.force_release("acl-forced")).await;
    assert!(
        matches!(forced, Ok(true)),
        "a forced release whose message was refused: {forced:?}"
    );
    bounded("the evicted holder's lost signal", holder.lost()).await;
}
