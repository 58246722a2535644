//! The fair read-write lock (issue 13): no reader beside a writer, never
//! two writers, strict FIFO (a waiting writer blocks later readers, so a
//! stream of readers never starves it; the readers at the head are granted
//! together), a write token above every read token before it, and a
//! writer that gives up letting the readers behind it in. Invariants
//! only, never wall-clock timings.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fairlock::{LockOptions, Permit};
use fairlock_core::{LockKeys, PermitFamily};
use fairlock_tests::*;

/// A bound for waits that must end; never reached unless a grant is lost.
const LIVENESS: Duration = Duration::from_secs(20);

fn rw_keys(name: &str) -> LockKeys {
    permit_keys(name, PermitFamily::ReadWrite)
}

async fn until_queued(server: &RedisServer, name: &str, count: i64) {
    wait_for_zcard(server, rw_keys(name).queue(), count).await;
}

/// Readers and writers inside their holds, checked and changed atomically.
#[derive(Default)]
struct Inside {
    readers: usize,
    writers: usize,
    most_readers: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_writers_hold_alone_under_a_swarm() {
    let server = server();
    let name = "swarm";
    let inside = Arc::new(Mutex::new(Inside::default()));
    let mut tasks = Vec::new();
    for (c, client) in clients(&server, 4).await.into_iter().enumerate() {
        for t in 0..3 {
            let rw = client.rw_lock(name).expect("rw");
            let inside = Arc::clone(&inside);
            let writer = (c + t) % 3 == 0;
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let hold = if writer {
                        rw.write().await
                    } else {
                        rw.read().await
                    }
                    .expect("hold");
                    {
                        let mut now = inside.lock().expect("inside");
                        assert_eq!(now.writers, 0, "a holder beside a writer");
                        if writer {
                            assert_eq!(now.readers, 0, "a writer beside readers");
                            now.writers += 1;
                        } else {
                            now.readers += 1;
                            now.most_readers = now.most_readers.max(now.readers);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    {
                        let mut now = inside.lock().expect("inside");
                        if writer {
                            now.writers -= 1;
                        } else {
                            now.readers -= 1;
                        }
                    }
                    hold.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        within("the swarm", task).await.expect("task");
    }
    assert!(
        inside.lock().expect("inside").most_readers >= 2,
        "readers shared the lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_blocks_later_readers_and_the_readers_behind_it_go_together() {
    let server = server();
    let client = client(&server).await;
    let others = clients(&server, 2).await;
    let name = "fifo";
    let keys = rw_keys(name);
    let rw = client.rw_lock(name).expect("rw");
    let first_read = rw.read().await.expect("read");
    let second_read = rw.try_read().await.expect("try").expect("readers share");
    let read_tokens = [first_read.token().value(), second_read.token().value()];

    let writer = {
        let rw = others[0].rw_lock(name).expect("rw");
        tokio::spawn(async move { rw.write().await.expect("write") })
    };
    until_queued(&server, name, 1).await;
    // Readers that come after the writer wait behind it: no barging.
    assert!(rw.try_read().await.expect("try").is_none());
    let mut readers = Vec::new();
    for i in 0..5i64 {
        let rw = others[(i % 2) as usize].rw_lock(name).expect("rw");
        readers.push(tokio::spawn(async move {
            let read: Permit = rw.read().await.expect("read");
            read
        }));
        until_queued(&server, name, i + 2).await;
    }
    first_read.release().await.expect("release");
    assert_eq!(zcard(&server, keys.queue()), 6, "one reader still holds");
    second_read.release().await.expect("release");
    let write = within("the writer", writer).await.expect("writer");
    assert_eq!(zcard(&server, keys.owner()), 1, "the writer holds alone");
    assert_eq!(zcard(&server, keys.queue()), 5, "the readers wait behind");
    let write_token = write.token().value();
    assert!(read_tokens.iter().all(|&read| write_token > read));

    write.release().await.expect("release");
    // One release granted all five readers at the head together.
    assert_eq!(zcard(&server, keys.owner()), 5);
    assert_eq!(zcard(&server, keys.queue()), 0);
    let mut reads = Vec::new();
    for reader in readers {
        reads.push(within("a reader", reader).await.expect("reader"));
    }
    for read in &reads {
        assert!(read.token().value() > write_token, "tokens increase");
    }
    for read in reads {
        read.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_tokens_exceed_the_read_tokens_before_them() {
    let server = server();
    let client = client(&server).await;
    let rw = client.rw_lock("tokens").expect("rw");
    let mut last_read = 0;
    for _ in 0..3 {
        let a = rw.read().await.expect("read");
        let b = rw.read().await.expect("read");
        last_read = last_read.max(a.token().value()).max(b.token().value());
        a.release().await.expect("release");
        b.release().await.expect("release");
        let write = rw.write().await.expect("write");
        assert!(write.token().value() > last_read);
        last_read = write.token().value();
        write.release().await.expect("release");
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_is_not_starved_by_a_stream_of_readers() {
    let server = server();
    let readers_client = client(&server).await;
    let writer_client = fairlock_tests::client(&server).await;
    let name = "stream";
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut stream = Vec::new();
    for _ in 0..4 {
        let rw = readers_client.rw_lock(name).expect("rw");
        let (stop, reads) = (Arc::clone(&stop), Arc::clone(&reads));
        stream.push(tokio::spawn(async move {
            // Overlapping reads: at every moment some reader holds.
            while !stop.load(Ordering::SeqCst) {
                let read = rw.read().await.expect("read");
                reads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(4)).await;
                read.release().await.expect("release");
            }
        }));
    }
    while reads.load(Ordering::SeqCst) < 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rw = writer_client.rw_lock(name).expect("rw");
    // A wait timeout only to turn starvation into a failure, not a timing.
    let write = rw
        .write_with(LockOptions::new().wait_timeout(LIVENESS))
        .await
        .expect("the writer got its turn");
    let during = reads.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        reads.load(Ordering::SeqCst),
        during,
        "no read while the writer holds"
    );
    write.release().await.expect("release");
    stop.store(true, Ordering::SeqCst);
    for reader in stream {
        within("a reader", reader).await.expect("reader");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_lets_the_readers_behind_it_in() {
    let server = server();
    let client = client(&server).await;
    let other = fairlock_tests::client(&server).await;
    let name = "give-up";
    let rw = client.rw_lock(name).expect("rw");
    let read = rw.read().await.expect("read");
    let writer = {
        let rw = other.rw_lock(name).expect("rw");
        tokio::spawn(async move {
            rw.write_with(LockOptions::new().wait_timeout(Duration::from_secs(3)))
                .await
        })
    };
    until_queued(&server, name, 1).await;
    let late_reader = {
        let rw = other.rw_lock(name).expect("rw");
        tokio::spawn(async move { rw.read().await.expect("read") })
    };
    until_queued(&server, name, 2).await;
    let gave_up = within("the writer", writer).await.expect("writer");
    assert!(matches!(gave_up, Err(fairlock::Error::WaitTimeout { .. })));
    // Its cancel granted the reader behind it, beside the first reader.
    let late = within("the late reader", late_reader)
        .await
        .expect("reader");
    assert_eq!(zcard(&server, rw_keys(name).owner()), 2);
    late.release().await.expect("release");
    read.release().await.expect("release");
}

/// Readers of one process whose grants all went unheard (its grant
/// connection was cut off when the writer released, so every message
/// reached nobody and each grant got only the short waiter TTL as lease)
/// are all found at the next heartbeat and keep the very grants they were
/// given. The heartbeat looks for grants at the process's oldest waiter;
/// before, it found one holding reader per interval, and the later
/// readers' short leases ran out first: they lost their grants and queued
/// again, with new tokens (40 readers, 100 ms heartbeats, 2 s waiter TTL:
/// all 40 checking at once have 2 s, one per heartbeat would need 4 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_whose_grants_went_unheard_all_keep_them() {
    unheard_readers_keep_their_grants("unheard", false).await;
}

/// The same while a release of the readers' process (of another lock) is
/// in flight all along: its reply is held back by a proxy until every
/// reader has its grant, longer than the unheard grants' 2 s leases. The check of the oldest waiter's grant
/// once waited for the process to have no release on its way (21 of 40
/// readers kept their grants with one held in flight); it must not depend
/// on releases at all, or a busy process's readers lose theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_keep_their_unheard_grants_while_a_release_of_their_process_is_in_flight() {
    unheard_readers_keep_their_grants("unheard-busy", true).await;
}

/// 40 readers of one process queue behind a writer of another; the
/// writer releases while the readers' process hears no message, and each
/// reader must get the very grant (token) the release gave it. With
/// `release_in_flight`, the readers' process reaches Redis through a proxy
/// that holds back the reply to its release of another lock until every
/// reader has its grant (longer than the readers' unheard leases), and
/// that release is checked to be still in flight then.
async fn unheard_readers_keep_their_grants(name: &str, release_in_flight: bool) {
    const READERS: usize = 40;
    let server = server();
    // Only a release held in flight needs the proxy in between.
    let proxy = if release_in_flight {
        Some(switch_proxy::SwitchProxy::start(server.port()).await)
    } else {
        None
    };
    // The unheard grants' lease is the releasing process's waiter TTL.
    let config = |url: String| {
        fairlock::ClientConfig::builder(url)
            .heartbeat_interval(Duration::from_millis(100))
            .waiter_timeout(Duration::from_secs(2))
            .watchdog_lease(Duration::from_secs(3))
            .command_timeout(Duration::from_secs(10))
            .build()
            .expect("config")
    };
    let writer_client = fairlock::LockClient::with_config(config(server.url()))
        .await
        .expect("connect");
    let readers_url = proxy
        .as_ref()
        .map_or_else(|| server.url(), switch_proxy::SwitchProxy::url);
    let readers_client = fairlock::LockClient::with_config(config(readers_url))
        .await
        .expect("connect");
    let busy = "busy";
    let mut releasing = None;
    if proxy.is_some() {
        // A first cycle loads the release script: its SHA then marks the
        // release below.
        let guard = readers_client.lock(busy).await.expect("lock");
        guard.release().await.expect("release");
    }
    let (writer, readers) =
        readers_behind_a_writer(&server, &writer_client, &readers_client, name, READERS).await;
    if let Some(proxy) = &proxy {
        let guard = readers_client.lock(busy).await.expect("lock");
        // Held until the readers are found (before, for a fixed 6 s, which
        // a loaded machine finding 40 readers could overrun).
        proxy.hold_reply_until_passed(
            <fairlock_core::Release as fairlock_core::ScriptCall>::SCRIPT.sha1(),
        );
        releasing = Some(tokio::spawn(guard.release()));
        // It ran in Redis; its reply is held back.
        wait_for_owner(&server, busy, false).await;
        assert!(proxy.reply_dropped(), "the release went through the proxy");
    }

    let cut_off = cut_off_subscribers(&server);
    writer.release().await.expect("release");
    let grants = server
        .cmd_ok(&["HGETALL", &rw_keys(name).all()[4]])
        .expect("HGETALL grants");
    let granted: std::collections::HashMap<String, u64> = grants
        .as_array()
        .expect("array")
        .chunks(2)
        .filter_map(|pair| {
            let owner_id = pair[0].as_str()?.to_owned();
            let token = pair[1].as_str()?.parse().ok()?;
            Some((owner_id, token))
        })
        .collect();
    let mut permits = Vec::new();
    for reader in readers {
        let permit = granted_read(reader).await;
        assert_eq!(
            granted.get(permit.owner_id()).copied(),
            Some(permit.token().value()),
            "a reader kept the grant the writer's release gave it"
        );
        permits.push(permit);
    }
    if let (Some(releasing), Some(proxy)) = (releasing, &proxy) {
        assert!(
            !releasing.is_finished(),
            "the other release was in flight while the readers were found"
        );
        proxy.pass_held_reply();
        within("the held release", releasing)
            .await
            .expect("task")
            .expect("release");
    }
    drop(cut_off);
    for permit in permits {
        permit.release().await.expect("release");
    }
}

/// Readers granted together whose grant messages were lost on their way
/// (their process's subscriber connection gone silent, which Redis still
/// counts as listening: every grant keeps its full lease and none is
/// marked unheard) are all found by the first heartbeat after the
/// release: every probe found holding while its task waits untold checks
/// its grant. Before, only the oldest did, one reader per heartbeat
/// interval: as many heartbeats ran before the last reader's check as
/// there were readers (6), where one or two are due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_whose_grant_messages_were_lost_are_found_by_one_heartbeat() {
    const READERS: usize = 6;
    let name = "lost-in-transit";
    let server = server();
    let proxy = silent_proxy::SilentProxy::start(server.port()).await;
    let config = fairlock::ClientConfig::builder(proxy.url())
        .heartbeat_interval(Duration::from_millis(200))
        .waiter_timeout(Duration::from_secs(2))
        .command_timeout(Duration::from_secs(10))
        .build()
        .expect("config");
    let readers_client = fairlock::LockClient::with_config(config)
        .await
        .expect("connect");
    let writer_client = client(&server).await;
    let (writer, readers) =
        readers_behind_a_writer(&server, &writer_client, &readers_client, name, READERS).await;
    proxy.silence_subscribers();
    // The heartbeat script loaded: each heartbeat call is then one
    // `EVALSHA` in the log (the first call's load would add two, one
    // refused `NOSCRIPT` on the script socket and one through fred).
    let heartbeat = <fairlock_core::PermitHeartbeat as fairlock_core::ScriptCall>::SCRIPT;
    server
        .cmd_ok(&["SCRIPT", "LOAD", heartbeat.source()])
        .expect("SCRIPT LOAD");
    log_every_command(&server);
    writer.release().await.expect("release");
    let mut permits = Vec::new();
    for reader in readers {
        let permit = granted_read(reader).await;
        permits.push(permit);
    }
    let heartbeat = heartbeat.sha1();
    let acquire = <fairlock_core::PermitAcquire as fairlock_core::ScriptCall>::SCRIPT.sha1();
    let scripts: Vec<&str> = commands_run(&server)
        .iter()
        .filter(|args| args.first().map(String::as_str) == Some("EVALSHA"))
        .filter_map(|args| match args.get(1).map(String::as_str) {
            Some(sha) if sha == heartbeat => Some("heartbeat"),
            Some(sha) if sha == acquire => Some("acquire"),
            _ => None,
        })
        .collect();
    let last_check = scripts
        .iter()
        .rposition(|&script| script == "acquire")
        .expect("the readers checked their grants");
    let heartbeats = scripts[..last_check]
        .iter()
        .filter(|&&script| script == "heartbeat")
        .count();
    assert!(
        heartbeats <= 2,
        "{heartbeats} heartbeats before the last of {READERS} readers checked its grant: {scripts:?}"
    );
    drop(writer_client);
    for permit in permits {
        permit.release().await.expect("release");
    }
}

/// The permit of a read task, which must be granted (bounded).
async fn granted_read(reader: tokio::task::JoinHandle<fairlock::Result<Permit>>) -> Permit {
    tokio::time::timeout(LIVENESS, reader)
        .await
        .expect("granted")
        .expect("task")
        .expect("read")
}

/// `writer_client` holds `name` for writing, and `readers` read tasks of
/// `readers_client` queue behind it (all queued when this returns).
async fn readers_behind_a_writer(
    server: &RedisServer,
    writer_client: &fairlock::LockClient,
    readers_client: &fairlock::LockClient,
    name: &str,
    readers: usize,
) -> (
    Permit,
    Vec<tokio::task::JoinHandle<fairlock::Result<Permit>>>,
) {
    let writer = writer_client
        .rw_lock(name)
        .expect("rw lock")
        .write()
        .await
        .expect("write");
    let rw = readers_client.rw_lock(name).expect("rw lock");
    let tasks = (0..readers)
        .map(|_| {
            let rw = rw.clone();
            tokio::spawn(async move { rw.read().await })
        })
        .collect();
    until_queued(server, name, readers as i64).await;
    (writer, tasks)
}

/// With `replica_acks`, a release whose reply is lost with its connection
/// is sent again on a new connection, and its `WAIT` then runs on that
/// connection: it counts only that connection's writes, so the client
/// sends the release again where it now writes and waits for the replicas
/// to confirm that. A lock release did so already; a permit release
/// answered `NotReplicated`, because a permit set did not remember its
/// releases and could not tell a release that ran from a permit never
/// held. Before the fix the resend already failed, with `NotOwner`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_release_whose_reply_was_lost_is_confirmed() {
    let server = server();
    let _replica = online_replica_of(&server).await;
    let (proxy, client) = client_behind_proxy(&server, |config| {
        config.waiter_timeout = Duration::from_secs(5);
        config.replica_acks = Some(fairlock::ReplicaAcks::new(1, Duration::from_millis(1500)));
    })
    .await;
    let name = "acked";
    let rw = client.rw_lock(name).expect("rw lock");
    // Loads the release script: the marked command is then the release.
    rw.write()
        .await
        .expect("write")
        .release()
        .await
        .expect("release");
    let write = rw.write().await.expect("write");

    proxy.drop_reply_to(<fairlock_core::PermitRelease as fairlock_core::ScriptCall>::SCRIPT.sha1());
    let released = within("the release", write.release()).await;
    assert!(proxy.reply_dropped(), "the release's reply was not dropped");
    assert!(
        matches!(released, Ok(())),
        "the release sent again after a reconnect: {released:?}"
    );
    assert_eq!(zcard(&server, rw_keys(name).owner()), 0, "the hold is gone");
    let read = within("a reader after the release", rw.read())
        .await
        .expect("read");
    read.release().await.expect("release");
    client.shutdown().await;
}
