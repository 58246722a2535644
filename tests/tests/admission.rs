//! Deadline-aware admission: a caller whose place in the queue cannot be
//! served within its wait timeout is told at once and leaves the queue.

use std::time::Duration;

use fairlock::{ClientConfig, Error, LockClient, LockOptions};
use fairlock_metrics::{CONTENDED_TOTAL, QUEUE_DEPTH};
use fairlock_tests::local_metrics::LocalMetrics;
use fairlock_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_would_miss_its_deadline_is_refused_at_once() {
    let server = server();
    // Slow heartbeats and renewals, so that the script calls counted below
    // are this caller's own however slow the machine (the watchdog renews
    // the holder's lease every 10 s).
    let config = ClientConfig::builder(server.url())
        .heartbeat_interval(Duration::from_secs(10))
        .waiter_timeout(Duration::from_secs(30))
        .watchdog_lease(Duration::from_secs(30))
        .build()
        .expect("config");
    let client = LockClient::with_config(config).await.expect("client");
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
    // The refused call runs in this test's own thread: a recorder of this
    // thread sees what it records, and nothing of the tasks spawned above.
    let metrics = LocalMetrics::install();
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
    // It did join the queue (then left it): contention and the depth it
    // found are recorded, so an overload admission sheds still shows on
    // the queue-depth gauge (before, neither was, the call counted only as
    // `refused`).
    assert_eq!(metrics.total(CONTENDED_TOTAL), 1.0);
    assert_eq!(metrics.total(QUEUE_DEPTH), 5.0);
    drop(metrics);
    // Two script calls: the enqueue that learned the position, the cancel
    // (plus at most one watchdog renewal, if its 10 s tick fell here).
    let scripts = calls(&server, "evalsha");
    assert!((2..=3).contains(&scripts), "{scripts} script calls");
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

/// A burst that queues before the lock has any pace estimate is not left
/// to wait out its budget: the first grant gives an estimate, and every
/// admission waiter re-checks with the position it joined at. Those that
/// cannot make it are refused then; those that can are granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_queued_before_any_estimate_is_refused_at_the_first_grant() {
    // Holds and budgets are long so that a loaded machine's delays stay
    // small beside them; only their ratios matter.
    const HOLD: Duration = Duration::from_secs(2);
    let server = server();
    let client = client(&server).await;
    let name = "burst";
    let holder = client.lock(name).await.expect("holder");
    // The pace-setter, at position 0: no admission, no timeout.
    let first = {
        let client = client.clone();
        tokio::spawn(async move {
            let guard = client.lock(name).await?;
            tokio::time::sleep(HOLD).await;
            guard.release().await
        })
    };
    wait_for_queue_len(&client, name, 1).await;
    // Six callers with admission at positions 1..=6. Position 1 has a
    // 30 s budget and is granted after about 4 s (26 s to spare for a
    // loaded machine); from position 2 on the budget is 5.8 s, and
    // (2 + 1) x 2 s is over it (the first estimate cannot be under the
    // pace-setter's 2 s hold). No estimate exists yet, so all of them are
    // admitted at first.
    let mut callers = Vec::new();
    for position in 1..=6u64 {
        let caller = client.clone();
        callers.push(tokio::spawn(async move {
            let budget = match position {
                1 => Duration::from_secs(30),
                _ => Duration::from_millis(5_800),
            };
            let options = LockOptions::new().wait_timeout(budget).admission(true);
            match caller.lock_with(name, options).await {
                Ok(guard) => {
                    tokio::time::sleep(HOLD).await;
                    guard.release().await.map(|()| None)
                }
                Err(error) => Ok(Some(error)),
            }
        }));
        wait_for_queue_len(&client, name, position + 1).await;
    }
    tokio::time::sleep(HOLD).await;
    holder.release().await.expect("release");
    first
        .await
        .expect("task")
        .expect("the pace-setter is granted");

    // About 2 s a grant: position 1 makes it (the holder's turn and the
    // pace-setter's, 4 s), 2 and later cannot (6 s and more) and are
    // refused when the first estimate arrives. Position 2 was once
    // admitted and timed out: the estimate left out the holder's turn.
    let mut ends = Vec::new();
    for caller in callers {
        ends.push(caller.await.expect("task").expect("release"));
    }
    assert!(ends[0].is_none(), "position 1 is granted: {:?}", ends[0]);
    for (i, end) in ends.iter().enumerate().skip(1) {
        assert!(
            matches!(
                end,
                Some(Error::WouldMissDeadline { position, .. }) if *position == i as u64 + 1
            ),
            "position {} is refused on the first estimate: {end:?}",
            i + 1
        );
    }
}

/// Permits share the lock's acquire loop, admission included: a permit
/// request whose place cannot be served before its deadline is refused at
/// once and leaves the queue (it used to wait its timeout out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_request_that_would_miss_its_deadline_is_refused_at_once() {
    let server = server();
    let client = client(&server).await;
    let sem = client.semaphore("permit-line", 1).expect("semaphore");
    let queue = permit_keys("permit-line", fairlock_core::PermitFamily::Semaphore)
        .queue()
        .to_owned();
    // Teach the client the set's pace: a waiter at the head granted after
    // about 200 ms.
    for _ in 0..3 {
        let holder = sem.acquire().await.expect("holder");
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        wait_for_zcard(&server, &queue, 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder.release().await.expect("release");
        within("the waiter", waiter)
            .await
            .expect("task")
            .expect("waiter")
            .release()
            .await
            .expect("release");
    }

    // Five requests ahead, about 200 ms each: 300 ms cannot make it.
    let holder = sem.acquire().await.expect("holder");
    let mut ahead = Vec::new();
    for _ in 0..5 {
        let sem = sem.clone();
        ahead.push(tokio::spawn(
            async move { sem.acquire().await?.release().await },
        ));
    }
    wait_for_zcard(&server, &queue, 5).await;
    let budget = LockOptions::new().wait_timeout(Duration::from_millis(300));
    match sem.acquire_with(budget.admission(true)).await {
        Err(Error::WouldMissDeadline { position, .. }) => assert_eq!(position, 5),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        zcard(&server, &queue),
        5,
        "the refused request left no entry"
    );
    // Without admission the same request waits its budget out.
    let waited = sem.acquire_with(budget).await;
    assert!(
        matches!(waited, Err(Error::WaitTimeout { .. })),
        "{waited:?}"
    );
    holder.release().await.expect("release");
    for task in ahead {
        within("a request ahead", task)
            .await
            .expect("task")
            .expect("granted and released");
    }
}

/// On a set of several permits a turn of the queue grants as many
/// requests as fit at once, and admission counts turns, not places: with
/// 10 permits held together for about 2 s, the nine requests behind a
/// waiter at the head are all served at the next turn, within a 12 s
/// budget, and none is refused. Admission used to count one grant per
/// place, as for a lock, and refused the ones at places 6 to 9 (14 to
/// 20 s expected). The budget leaves 10 s for a stalled machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_on_a_set_of_several_permits_counts_turns_not_places() {
    let server = server();
    let client = client(&server).await;
    let sem = client.semaphore("wide-line", 10).expect("semaphore");
    let queue = permit_keys("wide-line", fairlock_core::PermitFamily::Semaphore)
        .queue()
        .to_owned();
    let mut holders = Vec::new();
    for _ in 0..10 {
        holders.push(sem.acquire().await.expect("holder"));
    }
    let head = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    wait_for_zcard(&server, &queue, 1).await;
    let mut behind = Vec::new();
    for place in 1..=9 {
        let sem = sem.clone();
        behind.push(tokio::spawn(async move {
            let budget = LockOptions::new().wait_timeout(Duration::from_secs(12));
            sem.acquire_with(budget.admission(true))
                .await?
                .release()
                .await
        }));
        wait_for_zcard(&server, &queue, place + 1).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The head is granted after about 2 s at place 0: the set's first
    // sample, which every admission waiter then checks against.
    holders.remove(0).release().await.expect("release");
    let first = within("the head", head)
        .await
        .expect("task")
        .expect("granted");
    for holder in holders {
        holder.release().await.expect("release");
    }
    for (place, task) in behind.into_iter().enumerate() {
        let served = within("a request behind the head", task)
            .await
            .expect("task");
        assert!(
            served.is_ok(),
            "place {} refused or not served: {served:?}",
            place + 1
        );
    }
    first.release().await.expect("release");
}
