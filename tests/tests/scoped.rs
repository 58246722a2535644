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

async fn wait_until_held(client: &fairlock::LockClient, name: &str) {
    for _ in 0..1000 {
        if client.inspect(name).await.expect("inspect").owner.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{name} was never held");
}
