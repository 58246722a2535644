//! Deadline-aware admission: a caller whose place in the queue cannot be
//! served within its wait timeout is told at once and leaves the queue.

use std::time::Duration;

use fairlock::{Error, LockOptions};
use fairlock_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_would_miss_its_deadline_is_refused_at_once() {
    let server = server();
    let client = client(&server).await;
    let name = "line";
    // Teach the client the lock's pace: a waiter at the head granted after
    // about 200 ms.
    for _ in 0..3 {
        let holder = client.lock(name).await.expect("holder");
        let waiter = spawn_lock(&client, name);
        wait_for_queue_len(&client, name, 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder.release().await.expect("release");
        waiter
            .await
            .expect("task")
            .expect("waiter")
            .release()
            .await
            .expect("release");
    }

    // Five callers ahead, about 200 ms each: a 300 ms budget cannot make it.
    let holder = client.lock(name).await.expect("holder");
    let mut ahead = Vec::new();
    for _ in 0..5 {
        let client = client.clone();
        // Each releases itself: they are granted in ticket order, which
        // need not be the order they were spawned in.
        ahead.push(tokio::spawn(async move {
            client.lock(name).await?.release().await
        }));
    }
    wait_for_queue_len(&client, name, 5).await;
    server.cmd(&["CONFIG", "RESETSTAT"]).expect("reset");
    let refused = client
        .lock_with(
            name,
            LockOptions::new()
                .wait_timeout(Duration::from_millis(300))
                .admission(true),
        )
        .await;
    match refused {
        Err(Error::WouldMissDeadline { position, .. }) => assert_eq!(position, 5),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Two script calls: the enqueue that learned the position, the cancel
    // (plus at most one heartbeat or watchdog round of the 100 ms timers).
    let scripts = calls(&server, "evalsha");
    assert!((2..=4).contains(&scripts), "{scripts} script calls");
    assert_eq!(
        client.inspect(name).await.expect("inspect").queue_len,
        5,
        "the refused caller left no entry"
    );
    // Without admission the same caller would have waited out its budget.
    let waited = client
        .lock_with(
            name,
            LockOptions::new().wait_timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(
        matches!(waited, Err(Error::WaitTimeout { .. })),
        "{waited:?}"
    );
    holder.release().await.expect("release");
    for task in ahead {
        task.await.expect("task").expect("granted and released");
    }
}
