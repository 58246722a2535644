//! The reusable `Lock` handle and `with_lock`: the body runs under the lock,
//! is stopped the moment the lease is lost, and the lock is released on
//! every way out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fairlock::{Error, LockOptions};
use fairlock_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_locks_and_with_lock_releases_on_every_way_out() {
    let server = server();
    let client = client(&server).await;
    let handle = client.handle("scoped").expect("handle");
    assert_eq!(handle.name(), "scoped");
    assert!(
        client.handle("").is_err(),
        "the name is checked once, up front"
    );

    let token = handle
        .clone()
        .with_lock(|held| async move { held.token() })
        .await
        .expect("with_lock");
    assert!(token.value() > 0);
    assert_eq!(
        handle.inspect().await.expect("inspect").owner,
        None,
        "released"
    );

    // An error inside the body still releases.
    let out: fairlock::Result<Result<(), &str>> = client
        .with_lock("scoped", LockOptions::new(), |_| async {
            Err("the body failed")
        })
        .await;
    assert_eq!(out.expect("lock part"), Err("the body failed"));
    assert_eq!(handle.inspect().await.expect("inspect").owner, None);

    // A panicking body releases through the guard's drop.
    let panicking = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .with_lock("scoped", LockOptions::new(), |_| async { panic!("boom") })
                .await
        })
    };
    assert!(panicking.await.is_err());
    let again = tokio::time::timeout(Duration::from_secs(10), handle.lock())
        .await
        .expect("the lock came back after the panic")
        .expect("lock");
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_stops_the_body_when_the_lease_is_lost() {
    let server = server();
    let client = client(&server).await;
    let admin = fairlock_tests::client(&server).await;
    let finished = Arc::new(AtomicBool::new(false));
    let work = {
        let client = client.clone();
        let finished = Arc::clone(&finished);
        tokio::spawn(async move {
            client
                .with_lock("stoppable", LockOptions::new(), |_| async move {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    finished.store(true, Ordering::SeqCst);
                })
                .await
        })
    };
    wait_until_held(&admin, "stoppable").await;
    assert!(admin.force_release("stoppable").await.expect("force"));
    let result = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .expect("the body was stopped, not left running for 30 s")
        .expect("task");
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert!(!finished.load(Ordering::SeqCst));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_blocking_serves_sync_code() {
    let server = server();
    let client = client(&server).await;
    let inside = client.clone();
    let value = tokio::task::spawn_blocking(move || {
        inside.with_lock_blocking("sync", LockOptions::new(), |held| held.token().value())
    })
    .await
    .expect("thread")
    .expect("with_lock_blocking");
    assert!(value > 0);
    assert_eq!(client.inspect("sync").await.expect("inspect").owner, None);
}

/// Called on a worker thread of a multi-threaded runtime (an async task
/// calling into synchronous code that locks), `with_lock_blocking` moves
/// the wait off the worker (`block_in_place`) instead of panicking with
/// tokio's "Cannot start a runtime from within a runtime".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_blocking_on_a_worker_thread_blocks_in_place() {
    let server = server();
    let client = client(&server).await;
    let value = client
        .with_lock_blocking("sync-worker", LockOptions::new(), |held| {
            held.token().value()
        })
        .expect("with_lock_blocking on a worker thread");
    assert!(value > 0);
    assert_eq!(
        client.inspect("sync-worker").await.expect("inspect").owner,
        None
    );
}

/// From a `spawn_blocking` thread of a current-thread runtime (sync code
/// in an app on `#[tokio::main(flavor = "current_thread")]`),
/// `with_lock_blocking` waits on that thread: a runtime context is there,
/// but nothing else runs on the thread.
#[test]
fn with_lock_blocking_from_spawn_blocking_on_a_current_thread_runtime() {
    let server = server();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = client(&server).await;
        let inside = client.clone();
        let value = tokio::task::spawn_blocking(move || {
            inside.with_lock_blocking("sync-current", LockOptions::new(), |held| {
                held.token().value()
            })
        })
        .await
        .expect("thread")
        .expect("with_lock_blocking from spawn_blocking");
        assert!(value > 0);
        assert_eq!(
            client.inspect("sync-current").await.expect("inspect").owner,
            None
        );
        client.shutdown().await;
    });
}

async fn wait_until_held(client: &fairlock::LockClient, name: &str) {
    for _ in 0..1000 {
        if client.inspect(name).await.expect("inspect").owner.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{name} was never held");
}

/// A body that finished while its lease held gets its value back even if
/// the release then fails for a reason that says nothing about the lease
/// (here a timeout: Redis is paused for writes past the command timeout).
/// Before, the call failed with that error and the value was dropped, so a
/// caller retried work that had been done under a valid lease. The lock is
/// freed all the same (here by the release once Redis resumes; otherwise
/// when its lease runs out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_body_keeps_its_value_when_the_release_times_out() {
    let server = server();
    let config = fairlock::ClientConfig::builder(server.url())
        .command_timeout(Duration::from_millis(500))
        .heartbeat_interval(Duration::from_millis(100))
        .waiter_timeout(Duration::from_secs(1))
        .watchdog_lease(Duration::from_secs(3))
        .build()
        .expect("config");
    let client = fairlock::LockClient::with_config(config)
        .await
        .expect("connect");
    let value = client
        .with_lock("slow-release", LockOptions::new(), |_| async {
            server
                .cmd_ok(&["CLIENT", "PAUSE", "1500", "WRITE"])
                .expect("pause writes");
            42
        })
        .await;
    assert!(matches!(value, Ok(42)), "{value:?}");
    let other = fairlock_tests::client(&server).await;
    let next = within(
        "the lock after the slow release",
        other.lock("slow-release"),
    )
    .await
    .expect("lock");
    next.release().await.expect("release");
}
