//! The real `fairlock` binary against a real redis-server (fairlock-testkit):
//! states are made with the library, then read, freed or contended through
//! the command line, and checked through the library or Redis itself.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use fairlock::{LockClient, LockOptions};
use fairlock_testkit::RedisServer;
use serde_json::Value;
use tokio::process::Command;

/// Upper bound for any one CLI run, so a hang fails the test instead of CI.
const RUN_LIMIT: Duration = Duration::from_secs(20);

fn fairlock(server: &RedisServer) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fairlock"));
    command
        .env("REDIS_URL", server.url())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

async fn run(server: &RedisServer, args: &[&str]) -> Output {
    let output = tokio::time::timeout(RUN_LIMIT, fairlock(server).args(args).output())
        .await
        .expect("fairlock did not finish")
        .expect("fairlock did not start");
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(output)))
}

fn scratch_file(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let path =
        std::env::temp_dir().join(format!("fairlock-cli-{tag}-{}-{nanos}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// Polls `inspect` until `done` holds (bounded: 10 s).
async fn until(client: &LockClient, name: &str, done: impl Fn(&fairlock::LockState) -> bool) {
    for _ in 0..200 {
        if done(&client.inspect(name).await.unwrap()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("lock {name:?} never reached the expected state");
}

/// A queue entry whose process has no heartbeat: how a crashed waiter
/// looks until a grant purges it.
fn add_dead_waiter(server: &RedisServer, lock_key_tag: &str, ticket: u64) -> String {
    let owner_id = format!("{:032x}.{:016x}.30000", 0xdead_u128, 0xbeef_u64);
    server
        .cmd_ok(&[
            "ZADD",
            &format!("fairlock:{{{lock_key_tag}}}:queue"),
            &ticket.to_string(),
            &owner_id,
        ])
        .unwrap();
    owner_id
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_shows_holder_token_lease_and_queue_with_liveness() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let waiters = LockClient::connect(&server.url()).await.unwrap();
    let guard = client.lock("orders:42").await.unwrap();
    let mut queued = Vec::new();
    for _ in 0..2 {
        let waiters = waiters.clone();
        queued.push(tokio::spawn(async move {
            let guard = waiters.lock("orders:42").await.unwrap();
            guard.release().await.unwrap();
        }));
    }
    until(&client, "orders:42", |s| s.queue_len == 2).await;
    // Behind the two live waiters, one whose process is gone.
    let dead = add_dead_waiter(&server, "orders:42", u64::MAX / 4);

    let output = run(&server, &["inspect", "orders:42", "--json"]).await;
    assert!(output.status.success(), "{output:?}");
    let view = json(&output);
    assert_eq!(view["name"], "orders:42");
    assert_eq!(view["holder"], guard.owner_id());
    assert_eq!(view["nonce"], guard.owner_id().split('.').next().unwrap());
    assert_eq!(view["token"], guard.token().value());
    assert!(view["lease_left_ms"].as_u64().unwrap() > 0);
    assert_eq!(view["queue_len"], 3);
    let listed = view["waiters"].as_array().unwrap();
    assert_eq!(listed.len(), 3);
    let positions: Vec<u64> = listed
        .iter()
        .map(|w| w["position"].as_u64().unwrap())
        .collect();
    assert_eq!(positions, [1, 2, 3]);
    let tickets: Vec<u64> = listed
        .iter()
        .map(|w| w["ticket"].as_u64().unwrap())
        .collect();
    assert!(
        tickets.windows(2).all(|w| w[0] < w[1]),
        "oldest first: {tickets:?}"
    );
    let alive: Vec<bool> = listed
        .iter()
        .map(|w| w["alive"].as_bool().unwrap())
        .collect();
    assert_eq!(alive, [true, true, false]);
    assert_eq!(listed[2]["owner_id"], dead.as_str());
    assert_eq!(listed[2]["deadline_ms"], Value::Null);

    let output = run(&server, &["inspect", "orders:42"]).await;
    assert!(output.status.success(), "{output:?}");
    let text = stdout(&output);
    assert!(
        text.contains(&format!("holder      {}", guard.owner_id())),
        "{text}"
    );
    assert!(
        text.contains(&format!("token       {}", guard.token().value())),
        "{text}"
    );
    assert!(text.contains("queue       3 waiting"), "{text}");
    assert_eq!(text.matches("alive (").count(), 2, "{text}");
    assert_eq!(text.matches("DEAD (no heartbeat)").count(), 1, "{text}");

    // --limit lists fewer waiters but still counts them all.
    let view = json(&run(&server, &["inspect", "orders:42", "--json", "--limit", "1"]).await);
    assert_eq!(view["waiters"].as_array().unwrap().len(), 1);
    assert_eq!(view["queue_len"], 3);

    guard.release().await.unwrap();
    for task in queued {
        task.await.unwrap();
    }
    let view = json(&run(&server, &["inspect", "orders:42", "--json"]).await);
    assert_eq!(view["holder"], Value::Null);
    assert_eq!(view["token"], Value::Null);
}

#[tokio::test(flavor = "multi_thread")]
async fn list_finds_held_and_queued_locks_by_unescaped_name() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let odd = client.lock("a}b%c{d").await.unwrap();
    let plain = client.lock("jobs:nightly").await.unwrap();
    // Used and released: leaves counters behind, but no holder or waiter.
    client.lock("idle").await.unwrap().release().await.unwrap();
    // Waiters only (its holder's lease ran out): a queue key, no owner key.
    add_dead_waiter(&server, "orphaned-queue", 1);
    // Another namespace.
    let mut config = fairlock::ClientConfig::new(server.url());
    config.prefix = fairlock::KeyPrefix::new("other:").unwrap();
    let other = LockClient::with_config(config).await.unwrap();
    let elsewhere = other.lock("elsewhere").await.unwrap();

    let output = run(&server, &["list", "--json"]).await;
    assert!(output.status.success(), "{output:?}");
    let report = json(&output);
    assert_eq!(report["complete"], true);
    let locks: HashMap<String, Value> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["name"].as_str().unwrap().to_owned(), l.clone()))
        .collect();
    let names: BTreeSet<&str> = locks.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from(["a}b%c{d", "jobs:nightly", "orphaned-queue"])
    );
    assert_eq!(locks["a}b%c{d"]["holder"], odd.owner_id());
    assert_eq!(locks["a}b%c{d"]["token"], odd.token().value());
    assert_eq!(locks["orphaned-queue"]["holder"], Value::Null);
    assert_eq!(locks["orphaned-queue"]["queue_len"], 1);

    let text = stdout(&run(&server, &["list"]).await);
    assert!(text.contains("a}b%c{d"), "{text}");
    assert!(text.contains(plain.owner_id()), "{text}");
    assert!(!text.contains("idle"), "{text}");

    let report = json(&run(&server, &["list", "--json", "--prefix", "other:"]).await);
    let names: Vec<&str> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["elsewhere"]);

    // --limit caps the output and says the list may be incomplete.
    let report = json(&run(&server, &["list", "--json", "--limit", "1"]).await);
    assert_eq!(report["locks"].as_array().unwrap().len(), 1);
    assert_eq!(report["complete"], false);

    drop((odd, plain, elsewhere));
}

/// The `list --json` entries, by their `name`.
fn listed_by_name(output: &Output) -> HashMap<String, Value> {
    json(output)["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["name"].as_str().unwrap().to_owned(), l.clone()))
        .collect()
}

/// A lock whose name is not UTF-8 is listed under an escaped form
/// (`b"job\xff"`), with its exact bytes as hex in the JSON, and is not
/// confused with the UTF-8 name its lossy rendering spells (`job\u{fffd}`).
/// Before, `list` inspected the lossy rendering, found it free and left the
/// held lock out.
#[tokio::test(flavor = "multi_thread")]
async fn list_shows_a_non_utf8_name_escaped_with_its_exact_bytes() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let binary = client.lock(b"job\xff".as_slice()).await.unwrap();
    let text = client.lock("job\u{fffd}").await.unwrap();

    let output = run(&server, &["list", "--json"]).await;
    assert!(output.status.success(), "{output:?}");
    let locks = listed_by_name(&output);
    let names: BTreeSet<&str> = locks.keys().map(String::as_str).collect();
    assert_eq!(names, BTreeSet::from(["b\"job\\xff\"", "job\u{fffd}"]));
    let listed = &locks["b\"job\\xff\""];
    assert_eq!(listed["name_hex"], "6a6f62ff");
    assert_eq!(listed["holder"], binary.owner_id());
    assert_eq!(listed["token"], binary.token().value());
    assert_eq!(locks["job\u{fffd}"]["name_hex"], Value::Null);
    assert_eq!(locks["job\u{fffd}"]["holder"], text.owner_id());

    let output = run(&server, &["list"]).await;
    assert!(output.status.success(), "{output:?}");
    let shown = stdout(&output);
    let row = shown
        .lines()
        .find(|line| line.starts_with("b\"job\\xff\""))
        .unwrap_or_else(|| panic!("no row for the binary name: {shown}"));
    assert!(row.ends_with(binary.owner_id()), "{shown}");
    drop((binary, text));
}

/// A held lock named with 200 bytes of 0xff: its lossy rendering is 600
/// bytes, over the name limit, and `list` used to fail on it as a whole
/// (exit 1). Now it is listed, escaped, next to the other locks.
#[tokio::test(flavor = "multi_thread")]
async fn list_survives_a_long_non_utf8_name() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let long = client.lock(vec![0xff_u8; 200]).await.unwrap();
    let plain = client.lock("plain").await.unwrap();

    let output = run(&server, &["list", "--json"]).await;
    assert!(output.status.success(), "{output:?}");
    let locks = listed_by_name(&output);
    let escaped = format!("b\"{}\"", "\\xff".repeat(200));
    let names: BTreeSet<&str> = locks.keys().map(String::as_str).collect();
    assert_eq!(names, BTreeSet::from([escaped.as_str(), "plain"]));
    assert_eq!(locks[&escaped]["name_hex"], "ff".repeat(200));
    assert_eq!(locks[&escaped]["holder"], long.owner_id());
    assert_eq!(locks["plain"]["holder"], plain.owner_id());
    drop((long, plain));
}

/// `fairlock` with arguments that need not be UTF-8.
async fn run_bytes(server: &RedisServer, args: &[&[u8]]) -> Output {
    use std::os::unix::ffi::OsStrExt as _;
    let args = args.iter().map(|arg| std::ffi::OsStr::from_bytes(arg));
    tokio::time::timeout(RUN_LIMIT, fairlock(server).args(args).output())
        .await
        .expect("fairlock did not finish")
        .expect("fairlock did not start")
}

/// `inspect`, `watch`, `release` and `lock` take a name as the raw bytes of
/// their argument (in a shell, `$'job\xff'`), so a lock named with bytes
/// that are not UTF-8 can be reached, and show it as `list` does. Before,
/// clap refused such an argument ("invalid UTF-8 was detected", exit 2).
#[tokio::test(flavor = "multi_thread")]
async fn subcommands_take_a_non_utf8_name_as_raw_argument_bytes() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let name: &[u8] = b"job\xff";
    let binary = client.lock(name).await.unwrap();
    // The name its lossy rendering spells: never touched below.
    let text = client.lock("job\u{fffd}").await.unwrap();

    let output = run_bytes(&server, &[b"inspect", name, b"--json"]).await;
    assert!(output.status.success(), "{output:?}");
    let view = json(&output);
    assert_eq!(view["name"], "b\"job\\xff\"");
    assert_eq!(view["name_hex"], "6a6f62ff");
    assert_eq!(view["holder"], binary.owner_id());
    let output = run_bytes(&server, &[b"inspect", name]).await;
    assert!(
        stdout(&output).starts_with("lock        b\"job\\xff\"\n"),
        "{output:?}"
    );

    let output = run_bytes(&server, &[b"watch", name, b"--count", b"1", b"--json"]).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["holder"], binary.owner_id());

    let output = run_bytes(
        &server,
        &[
            b"release",
            b"--force",
            name,
            b"--holder",
            binary.owner_id().as_bytes(),
            b"--json",
        ],
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    let report = json(&output);
    assert_eq!(report["name"], "b\"job\\xff\"");
    assert_eq!(report["released"], true);
    assert_eq!(client.inspect(name).await.unwrap().owner, None);
    assert_eq!(
        client
            .inspect("job\u{fffd}")
            .await
            .unwrap()
            .owner
            .as_deref(),
        Some(text.owner_id())
    );

    // The child gets the exact bytes in FAIRLOCK_LOCK.
    let output = run_bytes(
        &server,
        &[
            b"lock",
            name,
            b"--",
            b"sh",
            b"-c",
            b"printf %s \"$FAIRLOCK_LOCK\"",
        ],
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(output.stdout, name);
    drop((binary, text));
}

/// On a Redis Cluster `list` scans every primary: a lock held in each
/// primary's slots is listed, and the list says it is complete. Before, it
/// scanned whichever node fred picked and said complete all the same.
#[tokio::test(flavor = "multi_thread")]
async fn list_covers_every_primary_of_a_cluster() {
    let cluster = fairlock_testkit::RedisCluster::start().unwrap();
    let client = LockClient::connect(&cluster.url()).await.unwrap();
    let mut names = BTreeSet::new();
    for primary in cluster.primaries().unwrap() {
        let name = (0..)
            .map(|i| format!("listed:{i}"))
            .find(|name| {
                let slot = fairlock_testkit::key_slot(format!("{{{name}}}").as_bytes());
                cluster.slot_owner(slot).unwrap() == primary
            })
            .unwrap();
        names.insert(name);
    }
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.lock(name.as_str()).await.unwrap());
    }
    let output = tokio::time::timeout(
        RUN_LIMIT,
        Command::new(env!("CARGO_BIN_EXE_fairlock"))
            .env("REDIS_URL", cluster.url())
            .args(["list", "--json"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("fairlock did not finish")
    .expect("fairlock did not start");
    assert!(output.status.success(), "{output:?}");
    let report = json(&output);
    assert_eq!(report["complete"], true);
    let listed: BTreeSet<String> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, names, "one lock on each primary");
    drop(guards);
}

#[tokio::test(flavor = "multi_thread")]
async fn release_force_frees_only_the_named_holder_and_is_idempotent() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let first = client.lock("stuck").await.unwrap();

    // A holder that does not hold it: refused, nothing changed.
    let wrong = format!("{:032x}.{:016x}.30000", 1u128, 1u64);
    let output = run(
        &server,
        &["release", "--force", "stuck", "--holder", &wrong],
    )
    .await;
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("refused"),
        "{output:?}"
    );
    assert!(!first.is_lost());
    assert_eq!(
        client.inspect("stuck").await.unwrap().owner.as_deref(),
        Some(first.owner_id())
    );

    // The holder as inspect shows it: freed, and the holder is told.
    let output = run(
        &server,
        &[
            "release",
            "--force",
            "stuck",
            "--holder",
            first.owner_id(),
            "--json",
        ],
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["released"], true);
    tokio::time::timeout(Duration::from_secs(10), first.lost())
        .await
        .expect("holder not told");
    assert_eq!(client.inspect("stuck").await.unwrap().owner, None);

    // Again: already free, success, nothing released.
    let output = run(
        &server,
        &[
            "release",
            "--force",
            "stuck",
            "--holder",
            first.owner_id(),
            "--json",
        ],
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["released"], false);

    // The holder changed since the operator looked: refused, by owner id and
    // by bare nonce alike, and the new holder keeps the lock.
    let second = client.lock("stuck").await.unwrap();
    let first_nonce = first.owner_id().split('.').next().unwrap().to_owned();
    for stale in [first.owner_id(), first_nonce.as_str()] {
        let output = run(&server, &["release", "--force", "stuck", "--holder", stale]).await;
        assert_eq!(output.status.code(), Some(3), "{output:?}");
    }
    assert!(!second.is_lost());
    assert_eq!(
        client.inspect("stuck").await.unwrap().owner.as_deref(),
        Some(second.owner_id())
    );

    // A bare nonce of the current holder frees it.
    let second_nonce = second.owner_id().split('.').next().unwrap().to_owned();
    let output = run(
        &server,
        &["release", "--force", "stuck", "--holder", &second_nonce],
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    tokio::time::timeout(Duration::from_secs(10), second.lost())
        .await
        .expect("holder not told");

    // Without --holder: whoever holds it, once; then a no-op.
    let third = client.lock("stuck").await.unwrap();
    let output = run(&server, &["release", "--force", "stuck"]).await;
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout(&output).contains("released \"stuck\""),
        "{}",
        stdout(&output)
    );
    tokio::time::timeout(Duration::from_secs(10), third.lost())
        .await
        .expect("holder not told");
    let output = run(&server, &["release", "--force", "stuck", "--json"]).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["released"], false);

    // --force is required.
    let output = run(&server, &["release", "stuck"]).await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    drop((first, second, third));
}

#[tokio::test(flavor = "multi_thread")]
async fn lock_passes_exit_code_through_and_exports_the_token() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let before = client.lock("deploy").await.unwrap();
    let before_token = before.token().value();
    before.release().await.unwrap();

    let file = scratch_file("env");
    let script = format!(
        "echo \"$FAIRLOCK_TOKEN $FAIRLOCK_HOLDER\" > {}; exit 42",
        file.display()
    );
    let output = run(&server, &["lock", "deploy", "--", "sh", "-c", &script]).await;
    assert_eq!(output.status.code(), Some(42), "{output:?}");
    let seen = std::fs::read_to_string(&file).unwrap();
    let (token, holder) = seen.trim().split_once(' ').unwrap();
    let token: u64 = token.parse().unwrap();
    assert!(
        token > before_token,
        "fencing tokens increase: {token} after {before_token}"
    );
    assert!(
        fairlock::FencingToken::new(token, holder).is_some(),
        "holder id {holder:?}"
    );
    // Released after the child exited.
    assert_eq!(client.inspect("deploy").await.unwrap().owner, None);

    let output = run(&server, &["lock", "deploy", "--lease", "10s", "--", "true"]).await;
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let output = run(&server, &["lock", "deploy", "--", "/nonexistent/command"]).await;
    assert_eq!(output.status.code(), Some(127), "{output:?}");
    assert_eq!(client.inspect("deploy").await.unwrap().owner, None);
    let _ = std::fs::remove_file(file);
}

/// Ctrl-C (SIGINT) or SIGTERM while `fairlock lock` waits: exit 130 or
/// 143, the command not run, and its queue entry gone when it exits.
/// Before, the cancel was left to a background task that the exit cut
/// short (and SIGTERM was not handled), so the entry stayed queued until
/// the process's liveness ran out and the next waiter waited ~5 s longer.
#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_waiting_lock_leaves_the_queue() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let guard = client.lock("interrupted").await.unwrap();
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let file = scratch_file("interrupted");
        let script = format!("touch {}", file.display());
        let mut child = fairlock(&server)
            .args(["lock", "interrupted", "--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("fairlock starts");
        until(&client, "interrupted", |s| s.queue_len == 1).await;
        let pid = child.id().expect("running") as libc::pid_t;
        // SAFETY: signals a child process this test started and still owns.
        unsafe {
            libc::kill(pid, signal);
        }
        let status = tokio::time::timeout(RUN_LIMIT, child.wait())
            .await
            .expect("fairlock exits")
            .expect("status");
        assert_eq!(status.code(), Some(code), "signal {signal}");
        assert!(!file.exists(), "the command ran without the lock");
        let state = client.inspect("interrupted").await.unwrap();
        assert_eq!(
            state.queue_len, 0,
            "signal {signal}: the waiter left the queue"
        );
    }
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn lock_wait_timeout_exits_73_without_running_the_command() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let guard = client.lock("busy").await.unwrap();
    let file = scratch_file("wait");
    let script = format!("touch {}", file.display());
    let output = run(
        &server,
        &["lock", "busy", "--wait", "300ms", "--", "sh", "-c", &script],
    )
    .await;
    assert_eq!(output.status.code(), Some(73), "{output:?}");
    assert!(!file.exists(), "the command ran without the lock");
    let state = client.inspect("busy").await.unwrap();
    assert_eq!(state.owner.as_deref(), Some(guard.owner_id()));
    assert_eq!(state.queue_len, 0, "the timed-out waiter left the queue");
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_loss_signals_the_child_and_exits_75() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let file = scratch_file("lost");
    let ready = scratch_file("lost-ready");
    // The child exits 0 on SIGTERM: the exit code must still say "lost".
    // It writes `ready` once its trap is installed.
    let script = format!(
        "trap 'kill $!; echo terminated > {}; exit 0' TERM; touch {}; sleep 30 & wait",
        file.display(),
        ready.display()
    );
    let child = fairlock(&server)
        .args(["lock", "batch", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    until(&client, "batch", |s| s.owner.is_some()).await;
    // Until sh has installed its trap, however slow the machine.
    let deadline = std::time::Instant::now() + RUN_LIMIT;
    while !ready.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the child never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(client.force_release("batch").await.unwrap());

    let output = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(75), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("lost the lease"),
        "{output:?}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "terminated");
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(ready);
}

#[tokio::test(flavor = "multi_thread")]
async fn racing_processes_never_interleave_and_all_exit_0() {
    const PROCESSES: usize = 10;
    let server = RedisServer::start().unwrap();
    let file = scratch_file("race");
    let script = format!(
        "echo start $$ >> {f}; sleep 0.05; echo end $$ >> {f}",
        f = file.display()
    );
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            fairlock(&server)
                .args(["lock", "race", "--", "sh", "-c", &script])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let output = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{output:?}");
    }
    let log = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2 * PROCESSES, "{log}");
    let mut pids = BTreeSet::new();
    for pair in lines.chunks(2) {
        let pid = pair[0]
            .strip_prefix("start ")
            .unwrap_or_else(|| panic!("interleaved:\n{log}"));
        assert_eq!(pair[1], format!("end {pid}"), "interleaved:\n{log}");
        assert!(pids.insert(pid), "ran twice:\n{log}");
    }
    let _ = std::fs::remove_file(file);
}

/// Ctrl-C while a snapshot's call is in flight (a stalled server) ends
/// `fairlock watch` too, with exit 0. It was lost before: the signal was
/// only listened for between snapshots, so the watch went on after the
/// stall and a second Ctrl-C was needed. And it ends at once: the
/// client's shutdown after Ctrl-C is bounded (1 s); it used to wait out
/// the held call's timeout, here 10 minutes, far past the hang guard.
#[tokio::test(flavor = "multi_thread")]
async fn watch_ends_on_ctrl_c_during_a_stalled_call() {
    use tokio::io::AsyncBufReadExt;
    let server = RedisServer::start().unwrap();
    let mut child = fairlock(&server)
        .args([
            "watch",
            "stalled",
            "--interval",
            "50ms",
            "--json",
            "--timeout",
            "600s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("fairlock starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    // Watching: the first snapshot is out.
    let first = tokio::time::timeout(RUN_LIMIT, lines.next_line())
        .await
        .expect("a first snapshot")
        .expect("read stdout");
    assert!(first.is_some(), "no snapshot");
    // Every call stalls (the snapshot's script, which Redis counts as a
    // write, is held by a pause of writes; lifted by hand at the end), and
    // the watch's next snapshot is caught in it: wait (bounded) until Redis
    // holds a call. Before, a 500 ms sleep under a 3 s pause of all
    // commands stood for this; a loaded machine could signal before the
    // call was sent, or after the pause had ended, and the test passed
    // without its case.
    server
        .cmd_ok(&["CLIENT", "PAUSE", "30000", "WRITE"])
        .unwrap();
    tokio::time::timeout(RUN_LIMIT, async {
        while held_calls(&server) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the watch's next snapshot is held by the pause");
    let pid = child.id().expect("running") as libc::pid_t;
    // SAFETY: signals a child process this test started and still owns.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    // Drain the rest of its output while waiting for it to exit (the
    // pause lasts 30 s, the held call's timeout 10 minutes: only the
    // bounded shutdown ends it within the hang guard).
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let status = tokio::time::timeout(RUN_LIMIT, child.wait())
        .await
        .expect("fairlock watch exits on the one Ctrl-C")
        .expect("status");
    assert_eq!(status.code(), Some(0));
    let _ = drain.await;
    server.cmd_ok(&["CLIENT", "UNPAUSE"]).unwrap();
}

/// How many connections of `server` have a command held by `CLIENT
/// PAUSE` (postponed: flag `b` in `CLIENT LIST`).
fn held_calls(server: &RedisServer) -> usize {
    let list = server.cmd_ok(&["CLIENT", "LIST"]).unwrap();
    list.as_str()
        .expect("CLIENT LIST text")
        .lines()
        .filter(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix("flags="))
                .is_some_and(|flags| flags.contains('b'))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_redraws_each_interval() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let guard = client
        .lock_with("watched", LockOptions::new().lease(Duration::from_secs(60)))
        .await
        .unwrap();
    let output = run(
        &server,
        &[
            "watch",
            "watched",
            "--interval",
            "100ms",
            "--count",
            "3",
            "--json",
        ],
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    let text = stdout(&output);
    let frames: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(frames.len(), 3, "{text}");
    assert!(frames.iter().all(|f| f["holder"] == guard.owner_id()));
    // Each frame is a new snapshot of the server clock.
    assert!(
        frames
            .windows(2)
            .all(|w| w[0]["now_ms"].as_u64() < w[1]["now_ms"].as_u64()),
        "{text}"
    );

    let output = run(
        &server,
        &["watch", "watched", "--interval", "100ms", "--count", "2"],
    )
    .await;
    assert_eq!(stdout(&output).matches(guard.owner_id()).count(), 2);

    // A zero interval is a usage error (exit 2), not a panic (101).
    let output = run(&server, &["watch", "watched", "--interval", "0ms"]).await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("zero"));
}

#[tokio::test(flavor = "multi_thread")]
async fn url_with_acl_user_works_and_unreachable_redis_exits_69() {
    let server = RedisServer::start().unwrap();
    server
        .cmd_ok(&[
            "ACL", "SETUSER", "ops", "on", ">s3cret", "~*", "&*", "+@all",
        ])
        .unwrap();
    let port = server.port();
    let good = format!("redis://ops:s3cret@127.0.0.1:{port}");
    let output = run(&server, &["--url", &good, "inspect", "x", "--json"]).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["holder"], Value::Null);

    let bad = format!("redis://ops:wrong@127.0.0.1:{port}");
    let output = run(&server, &["--url", &bad, "--timeout", "1s", "inspect", "x"]).await;
    assert!(!output.status.success(), "{output:?}");
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("wrong"),
        "password leaked: {output:?}"
    );

    let output = run(
        &server,
        &[
            "--url",
            "redis://127.0.0.1:1",
            "--timeout",
            "500ms",
            "inspect",
            "x",
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(69), "{output:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn fixed_lease_running_out_kills_a_child_that_ignores_sigterm() {
    let server = RedisServer::start().unwrap();
    let pid_file = scratch_file("stubborn");
    // SIGTERM stays ignored across exec: only the SIGKILL after --grace ends
    // it. The 2 s lease leaves the shell time to set its trap first.
    let script = format!(
        "trap '' TERM; echo $$ > {}; exec sleep 30",
        pid_file.display()
    );
    let output = run(
        &server,
        &[
            "lock", "stubborn", "--lease", "2s", "--grace", "200ms", "--", "sh", "-c", &script,
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(75), "{output:?}");
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    assert!(
        !PathBuf::from(format!("/proc/{}", pid.trim())).exists(),
        "the child outlived fairlock"
    );
    let _ = std::fs::remove_file(pid_file);
}
