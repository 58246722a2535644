//! A holder's release is not queued behind its own process's waiters.
//!
//! Commands on one connection are answered in order. When a burst of
//! callers enqueued on the same connection a holder releases on, the
//! release ran only after every enqueue sent before it: at 10,000 HTTP
//! buyers the lock changed hands once per backlog and the seckill sold a
//! handful of items. Holders now have their own command connection.
//!
//! The evidence is in the tickets: tickets and tokens come from one
//! counter in Redis, so a waiter whose ticket is above the token the
//! release handed on was enqueued after the release ran. With one lane
//! that is impossible for enqueues sent before the release.
//!
//! And a release that hands the lock to a task of its own process lets
//! that task run before the releasing task goes on: otherwise a releaser
//! that locks again at once (a loop over a hot lock) had its next acquire
//! script sent, and run by Redis, before the new holder's first command,
//! and every hold grew by that script's time.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fairlock::LockClient;
use fairlock_tests::*;

/// On the script sockets (the default on a single server and behind
/// Sentinel) each enqueue is written to the waiters' socket by its caller
/// at once, so the burst waits in Redis's input, not in the process: Redis
/// is kept busy by a script on another connection while the burst and then
/// the release are written, and once it reads again the release, alone on
/// the holders' socket, runs before the enqueues still unread on the
/// waiters'.
#[test]
fn a_release_overtakes_a_burst_of_enqueues_sent_before_it() {
    release_overtakes_a_burst(true);
}

/// The same through fred's connections (`direct_calls(false)`, as on a
/// cluster and with `replica_acks`), where the burst also waits in fred's
/// queue of the waiters' connection.
#[test]
fn a_release_overtakes_a_burst_of_enqueues_sent_before_it_through_fred() {
    release_overtakes_a_burst(false);
}

fn release_overtakes_a_burst(direct_calls: bool) {
    const BURST: usize = 2_000;
    let server = server();
    // A script that keeps Redis from reading any socket for a while (a
    // counted loop: Valkey freezes the time a script sees). It writes a
    // line to the server's log as it starts: no other client is answered
    // while it runs, so the log is how the test sees that it is running.
    let marker = "holder-lane busy script started";
    let busy = format!(
        "redis.log(redis.LOG_WARNING, '{marker}') \
         local n = 0 for i = 1, tonumber(ARGV[1]) do n = n + i end return 1"
    );
    // One thread: the burst's enqueues are all handed to the client before
    // the release is.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (grants, mut hog) = runtime.block_on(async {
        let mut config = fast_config(&server);
        config.direct_calls = direct_calls;
        let client = LockClient::with_config(config).await.expect("client");
        let holder = client.lock("burst").await.expect("holder");
        // Scripts loaded and both sockets open: a release and an
        // acquire of another lock.
        client
            .lock("warm")
            .await
            .expect("warm")
            .release()
            .await
            .expect("release");
        // The busy script is running before the burst starts. Before,
        // a thread was told to send it and the burst followed 30 ms
        // later: on a loaded machine the script could start after the
        // burst had been read, and the release then ran after it.
        let hog = start_busy_script(&server, &busy, marker).await;
        let grants = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..BURST {
            let (client, grants) = (client.clone(), grants.clone());
            tasks.push(tokio::spawn(async move {
                let guard = client.lock("burst").await.expect("granted");
                grants
                    .lock()
                    .expect("grants")
                    .push((guard.ticket(), guard.token().value()));
                guard.release().await.expect("release");
            }));
        }
        // Let every task run to its enqueue (each passes a few awaits
        // on the way; with the release on the waiters' lane, both
        // variants fail with this many rounds).
        for _ in 0..40 {
            tokio::task::yield_now().await;
        }
        holder.release().await.expect("release");
        for task in tasks {
            task.await.expect("task");
        }
        client.shutdown().await;
        let grants = grants.lock().expect("grants").clone();
        (grants, hog)
    });
    // The busy script ran to its end (no error in its place).
    let mut reply = [0u8; 4];
    hog.read_exact(&mut reply).expect("the busy script's reply");
    assert_eq!(&reply, b":1\r\n", "the busy script's reply");
    assert_eq!(grants.len(), BURST);
    let first_token = grants
        .iter()
        .map(|(_, token)| *token)
        .min()
        .expect("a grant");
    let enqueued_after_release = grants
        .iter()
        .filter(|(ticket, _)| ticket.is_some_and(|t| t > first_token))
        .count();
    assert!(
        enqueued_after_release > 0,
        "the release ran after all {BURST} enqueues sent before it"
    );
    // And the queue stayed fair: grants in ticket order.
    let mut by_token = grants.clone();
    by_token.sort_by_key(|(_, token)| *token);
    let tickets: Vec<u64> = by_token.iter().filter_map(|(ticket, _)| *ticket).collect();
    assert!(
        tickets.windows(2).all(|w| w[0] < w[1]),
        "out of ticket order"
    );
    eprintln!("{enqueued_after_release} of {BURST} enqueues ran after the release");
}

/// Writes `EVAL script 0 30000000` on a connection of its own and returns
/// (the connection, for the script's reply) once the script is running:
/// once `marker`, which the script logs as it starts, is in the server's
/// log (bounded: 20 s).
async fn start_busy_script(
    server: &RedisServer,
    script: &str,
    marker: &str,
) -> std::net::TcpStream {
    let mut hog = std::net::TcpStream::connect(server.addr()).expect("connect");
    let mut command = Vec::new();
    for arg in ["EVAL", script, "0", "30000000"] {
        command.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    hog.write_all(&[b"*4\r\n".as_slice(), &command].concat())
        .expect("send the busy script");
    let log = server.dir().join("redis.log");
    within("the busy script to start", async {
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(marker)
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    hog
}

/// Runs `body` on one thread: a task woken there runs only when the
/// running task gives the thread up.
fn on_one_thread<T>(body: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(body)
}

#[test]
fn the_next_holder_of_this_process_runs_before_release_returns() {
    let server = server();
    on_one_thread(async {
        let client = client(&server).await;
        let holder = client.lock("handed-on").await.expect("holder");
        let granted = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (client, granted) = (client.clone(), granted.clone());
            tokio::spawn(async move {
                let guard = client.lock("handed-on").await.expect("granted");
                granted.store(true, Ordering::SeqCst);
                guard.release().await.expect("release");
            })
        };
        while client.stats().queued == 0 {
            tokio::task::yield_now().await;
        }
        holder.release().await.expect("release");
        // Nothing else ran on this thread between the release's reply and
        // here but what the release let run.
        assert!(
            granted.load(Ordering::SeqCst),
            "release returned before the task it handed the lock to ran"
        );
        waiter.await.expect("waiter");
        client.shutdown().await;
    });
}
