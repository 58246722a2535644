//! Bad input gets a typed error and leaves Redis unchanged; an unreachable
//! Redis gets a typed error within the configured timeout, never a hang.

use std::time::{Duration, Instant};

use fairlock::{
    ClientConfig, Error, FencedOp, FencedScript, LockClient, LockOptions, MAX_INSPECT_WAITERS,
    MAX_NAME_BYTES,
};
use fairlock_tests::*;

/// Hang guard: a call that does not finish in this time fails the test.
const NEVER: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_names_and_leases_are_refused_without_touching_redis() {
    let server = server();
    let client = client(&server).await;
    let _held = client
        .lock("existing")
        .await
        .expect("some state to compare");
    let before = dump(&server);
    server.cmd(&["CONFIG", "RESETSTAT"]).expect("reset");

    let empty = client.lock("").await;
    assert!(matches!(empty, Err(Error::InvalidName(_))), "{empty:?}");
    let long = "n".repeat(MAX_NAME_BYTES + 1);
    let too_long = client.try_lock(&long).await;
    assert!(
        matches!(too_long, Err(Error::InvalidName(_))),
        "{too_long:?}"
    );
    assert!(
        client.lock(&"n".repeat(MAX_NAME_BYTES)).await.is_ok(),
        "the limit itself is fine"
    );
    let zero = client
        .lock_with("existing", LockOptions::new().lease(Duration::ZERO))
        .await;
    assert!(matches!(zero, Err(Error::InvalidOptions(_))), "{zero:?}");
    let absurd = client
        .lock_with(
            "existing",
            LockOptions::new().lease(Duration::from_secs(10 * 86_400)),
        )
        .await;
    assert!(
        matches!(absurd, Err(Error::InvalidOptions(_))),
        "{absurd:?}"
    );
    let message = absurd.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("lease"),
        "the message names the option: {message}"
    );

    // An inspection asking for more waiters than one call may read: a
    // clear error, not a script failure reported as a bug.
    for waiters in [MAX_INSPECT_WAITERS + 1, u64::MAX] {
        let listed = client.inspect_queue("existing", waiters).await;
        assert!(
            matches!(&listed, Err(Error::InvalidOptions(m)) if m.contains("at most")),
            "{waiters}: {listed:?}"
        );
    }
    assert!(client
        .inspect_queue("existing", MAX_INSPECT_WAITERS)
        .await
        .is_ok());

    let mut after = dump(&server);
    after.retain(|(key, _)| !key.contains(&long[..MAX_NAME_BYTES]));
    assert_eq!(after, before, "refused calls changed Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_a_typed_error_and_stays_untouched() {
    let server = server();
    let client = client(&server).await;
    let owner = keys("typed").owner().to_owned();
    let queue = keys("typed").queue().to_owned();
    for (role, plant) in [
        (
            "owner: a foreign string",
            vec!["SET", &owner, "somebody else's data"],
        ),
        ("owner: a hash", vec!["HSET", &owner, "id", "x"]),
        (
            "queue: a string",
            vec!["SET", &queue, "somebody else's data"],
        ),
        // Shaped like "<owner id> <token>", but no owner id fairlock writes:
        // once taken as a holder for ever (not even force_release could
        // clear it: it refused the value as an owner id).
        ("owner: `x 5`", vec!["SET", &owner, "x 5"]),
        (
            "owner: not UTF-8",
            vec![
                "EVAL",
                "redis.call('SET', KEYS[1], string.char(255) .. ' 5')",
                "1",
                &owner,
            ],
        ),
        (
            "owner: a token beyond 64 bits",
            vec!["SET", &owner, "0a.0b.5 99999999999999999999"],
        ),
    ] {
        server.cmd(&["FLUSHALL"]).expect("flush");
        server.cmd(&plant).expect("plant");
        let before = dump(&server);
        for result in [
            // Bounded: a foreign value taken for a holder queued the
            // caller behind it for ever.
            tokio::time::timeout(NEVER, client.lock("typed"))
                .await
                .unwrap_or_else(|_| panic!("{role}: lock() waits behind a foreign value"))
                .map(|_| ()),
            client.try_lock("typed").await.map(|_| ()),
            client.inspect("typed").await.map(|_| ()),
            client.force_release("typed").await.map(|_| ()),
        ] {
            assert!(
                matches!(result, Err(Error::WrongType(_))),
                "{role}: {result:?}"
            );
            // Said once (the script's message and the error's advice
            // once both said it).
            let text = result.map_or_else(|e| e.to_string(), |()| String::new());
            assert_eq!(
                text.matches("another program uses this key").count(),
                1,
                "{role}: {text}"
            );
        }
        assert_eq!(
            dump(&server),
            before,
            "{role}: a WRONGTYPE call changed Redis"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inconsistent_client_options_are_refused_before_connecting() {
    let mut config = ClientConfig::new("redis://127.0.0.1:1");
    config.heartbeat_interval = Duration::from_secs(5);
    config.waiter_timeout = Duration::from_secs(5);
    let refused = LockClient::with_config(config).await;
    assert!(matches!(refused, Err(Error::InvalidOptions(_))));
    for calls in [0, 1_000_001] {
        let window = ClientConfig::builder("redis://127.0.0.1:1")
            .max_in_flight(calls)
            .build();
        match window {
            Err(Error::InvalidOptions(message)) => {
                assert!(message.contains("max_in_flight"), "{message}")
            }
            other => panic!("max_in_flight({calls}) was taken: {other:?}"),
        }
    }
    let bad_url = LockClient::connect("http://127.0.0.1:1").await;
    assert!(
        matches!(bad_url, Err(Error::InvalidOptions(_))),
        "{:?}",
        bad_url.err()
    );
}

/// A URL whose scheme is not Redis's or Valkey's (a typo, `http://`,
/// `tcp://`) is refused before anything connects, naming the schemes
/// taken: fred reads every unknown scheme as a plain single server, so it
/// connected, and `https://` to a TLS port failed only after the connect
/// timeout as `Unreachable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_with_a_scheme_that_is_not_redis_is_refused_before_connecting() {
    let server = fairlock_testkit::RedisServer::start().expect("redis");
    let connections =
        || server.info("stats").expect("INFO stats")["total_connections_received"].clone();
    let before = connections();
    for scheme in [
        "http",
        "https",
        "tcp",
        "redis+tcp",
        "reddis",
        "REDIS-CLUSTR",
    ] {
        let url = format!("{scheme}://127.0.0.1:{}", server.port());
        match LockClient::connect(&url).await {
            Err(Error::InvalidOptions(message)) => {
                assert!(
                    message.contains("redis://"),
                    "names what is taken: {message}"
                )
            }
            Ok(client) => {
                client.shutdown().await;
                panic!("{url} connected")
            }
            Err(other) => panic!("{url}: expected InvalidOptions, got {other:?}"),
        }
    }
    assert_eq!(connections(), before, "nothing connected");
    for scheme in ["redis", "REDIS", "valkey"] {
        let url = format!("{scheme}://127.0.0.1:{}", server.port());
        let client = LockClient::connect(&url).await.expect(&url);
        client.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_is_a_typed_error_within_the_connect_timeout() {
    // A closed port: refused at once.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let mut config = ClientConfig::new(format!("redis://127.0.0.1:{port}"));
    config.connect_timeout = Duration::from_millis(500);
    let result = tokio::time::timeout(NEVER, LockClient::with_config(config)).await;
    assert!(
        matches!(result, Ok(Err(Error::Unreachable { .. }))),
        "{:?}",
        result.map(|r| r.err())
    );

    // A server that accepts and never answers: the connect timeout ends it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut config = ClientConfig::new(format!(
        "redis://127.0.0.1:{}",
        silent.local_addr().expect("addr").port()
    ));
    config.connect_timeout = Duration::from_millis(500);
    let started = Instant::now();
    let result = tokio::time::timeout(NEVER, LockClient::with_config(config)).await;
    assert!(
        matches!(result, Ok(Err(Error::Unreachable { .. }))),
        "{:?}",
        result.map(|r| r.err())
    );
    eprintln!("silent server refused after {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_dead_server_fail_instead_of_hanging() {
    let mut server = server();
    let mut config = fast_config(&server);
    config.command_timeout = Duration::from_millis(500);
    let client = LockClient::with_config(config).await.expect("connect");
    let guard = client.lock("gone").await.expect("lock");
    server.kill();
    let result = tokio::time::timeout(NEVER, client.lock("other")).await;
    assert!(
        matches!(
            result,
            Ok(Err(Error::Timeout { .. }
                | Error::Redis { .. }
                | Error::Unreachable { .. }))
        ),
        "{:?}",
        result.map(|r| r.err())
    );
    let released = tokio::time::timeout(NEVER, guard.release()).await;
    assert!(
        matches!(released, Ok(Err(_))),
        "release against a dead server must fail, typed"
    );
}

/// `redis://user:password@host:port` authenticates (an ACL user here);
/// a wrong password is a typed error, not a hang, and its message does not
/// repeat the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_credentials_authenticate_and_bad_ones_are_refused() {
    let server = RedisServer::builder()
        .args(["--user", "alice", "on", ">wonderland", "~*", "&*", "+@all"])
        .start()
        .expect("redis-server with an ACL user");
    let mut config = fast_config(&server);
    config.url = format!("redis://alice:wonderland@127.0.0.1:{}", server.port());
    let client = LockClient::with_config(config.clone())
        .await
        .expect("alice connects");
    let guard = client.lock("acl").await.expect("lock as alice");
    guard.release().await.expect("release");
    let who = server.cmd(&["CLIENT", "LIST"]).expect("CLIENT LIST");
    assert!(
        who.as_str().unwrap_or_default().contains("user=alice"),
        "connected as alice"
    );

    config.url = format!("redis://alice:wrong-password@127.0.0.1:{}", server.port());
    config.connect_timeout = Duration::from_secs(2);
    let refused = tokio::time::timeout(NEVER, LockClient::with_config(config)).await;
    match refused {
        Ok(Err(error @ Error::Unreachable { .. })) => {
            assert!(!error.to_string().contains("wrong-password"), "{error}");
        }
        other => panic!(
            "a bad password must be a typed error: {:?}",
            other.map(|r| r.err())
        ),
    }
}

/// Calls that name a key or a holder wrongly are refused with
/// `InvalidOptions` before anything reaches Redis: a fenced write whose
/// fence key is its target (it would overwrite the fence record and
/// switch fencing off: a stale token's write was then applied), a fenced
/// script that lists its fence key among the keys it writes, an empty
/// key, an owner id fairlock never writes (release, extend and force
/// release by it), and admission without the wait timeout it needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misnamed_keys_holders_and_options_are_refused_without_touching_redis() {
    use fairlock::{FencedOp, FencedScript};
    let server = server();
    let client = client(&server).await;
    let guard = client.lock("fenced").await.expect("lock");
    let token = guard.token();
    client
        .fenced_write("{r}:fence", "{r}:count", token, FencedOp::Set(b"1"))
        .await
        .expect("a fenced write with its own fence key");
    client
        .extend_by_owner_id("fenced", guard.owner_id(), Duration::from_secs(5))
        .await
        .expect("extend by the holder's own owner id");
    // Released, so no heartbeat or renewal runs while calls are counted.
    guard.release().await.expect("release");
    let before = dump(&server);
    server.cmd(&["CONFIG", "RESETSTAT"]).expect("reset");

    let refused = |what: &str, result: fairlock::Result<()>| match result {
        Err(Error::InvalidOptions(message)) => assert!(!message.is_empty(), "{what}"),
        other => panic!("{what}: expected InvalidOptions, got {other:?}"),
    };
    let same = client
        .fenced_write("{r}:count", "{r}:count", token, FencedOp::Set(b"2"))
        .await;
    refused("the fence key as target", same.map(drop));
    let empty = client
        .fenced_write("", "{r}:count", token, FencedOp::Set(b"2"))
        .await;
    refused("an empty fence key", empty.map(drop));
    let script = FencedScript::new("return redis.call('SET', KEYS[2], ARGV[3])");
    let listed = client
        .fenced_eval(&script, "{r}:fence", &["{r}:fence"], token, &["3"])
        .await;
    refused("the fence key among the written keys", listed.map(drop));
    for owner_id in ["x", "", "0a.0b.030000", &"f".repeat(1 << 20)] {
        let shown = &owner_id[..owner_id.len().min(12)];
        refused(
            &format!("release by {shown:?}"),
            client.release_by_owner_id("fenced", owner_id).await,
        );
        refused(
            &format!("extend by {shown:?}"),
            client
                .extend_by_owner_id("fenced", owner_id, Duration::from_secs(5))
                .await,
        );
    }
    refused(
        "force release from a holder that is no owner id",
        client.force_release_from("fenced", "x 12").await.map(drop),
    );
    refused(
        "admission without a wait timeout",
        client
            .lock_with("other", LockOptions::new().admission(true))
            .await
            .map(drop),
    );

    assert_eq!(calls(&server, "evalsha"), 0, "nothing was sent to Redis");
    assert_eq!(calls(&server, "eval"), 0, "nothing was sent to Redis");
    assert_eq!(dump(&server), before, "Redis is unchanged");
}

/// A fence key holding a value fairlock did not write ("<token> <holder>")
/// is another program's key (or a data key named by mistake): a fenced
/// call is refused with `WrongType` and changes nothing. Once a value such
/// as "hello" was read as token 0 and overwritten by the first write, and
/// a data key holding "100" as token 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_key_fairlock_did_not_write_is_refused_untouched() {
    let server = server();
    let client = client(&server).await;
    let guard = client.lock("fence-owner").await.expect("lock");
    let script = FencedScript::new("return redis.call('SET', KEYS[1], ARGV[1])");
    for planted in ["hello", "100", "12 holder extra", "12 "] {
        server.cmd(&["FLUSHALL"]).expect("flush");
        server.cmd(&["SET", "{r}:fence", planted]).expect("plant");
        let before = dump(&server);
        let write = client
            .fenced_write("{r}:fence", "{r}:value", guard.token(), FencedOp::Set(b"x"))
            .await;
        assert!(
            matches!(write, Err(Error::WrongType(_))),
            "{planted:?}: {write:?}"
        );
        let eval = client
            .fenced_eval(&script, "{r}:fence", &["{r}:value"], guard.token(), &["x"])
            .await;
        assert!(
            matches!(eval, Err(Error::WrongType(_))),
            "{planted:?}: {eval:?}"
        );
        assert_eq!(dump(&server), before, "{planted:?}: Redis changed");
    }
}

/// A fenced write that Redis refuses (an increment of a value that is not
/// an integer, or past the 64-bit range; a fenced script that raises an
/// error) fails without recording its token: the resource's fence stays as
/// it was. Once the token was recorded first, so a failed write still
/// fenced out the holder that had written before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_redis_refuses_leaves_the_fence_as_it_was() {
    let server = server();
    let client = client(&server).await;
    let guard = client.lock("fence-refused").await.expect("lock");
    let raises = FencedScript::new("return redis.call('INCRBY', KEYS[1], 1)");
    for planted in ["abc", "9223372036854775807"] {
        server.cmd(&["FLUSHALL"]).expect("flush");
        server.cmd(&["SET", "{r}:count", planted]).expect("plant");
        let before = dump(&server);
        let write = client
            .fenced_write("{r}:fence", "{r}:count", guard.token(), FencedOp::IncrBy(1))
            .await;
        assert!(
            matches!(write, Err(Error::ScriptFailed { .. })),
            "{planted:?}: {write:?}"
        );
        let eval = client
            .fenced_eval(
                &raises,
                "{r}:fence",
                &["{r}:count"],
                guard.token(),
                &[] as &[&str],
            )
            .await;
        assert!(
            matches!(eval, Err(Error::ScriptFailed { .. })),
            "{planted:?}: {eval:?}"
        );
        assert_eq!(dump(&server), before, "{planted:?}: Redis changed");
    }
    // The fence still works as before: the write goes through once the
    // value is a number, and records the token.
    server.cmd(&["SET", "{r}:count", "1"]).expect("plant");
    let applied = client
        .fenced_write("{r}:fence", "{r}:count", guard.token(), FencedOp::IncrBy(1))
        .await
        .expect("applied");
    assert_eq!(applied, fairlock::Reply::Int(2));
    assert!(server
        .cmd(&["GET", "{r}:fence"])
        .expect("GET")
        .as_str()
        .is_some());
}
