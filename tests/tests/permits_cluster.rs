//! Semaphores and read-write locks on a local Redis Cluster (3 primaries,
//! 1 replica each): one set on each primary, every key of a set in its
//! name's slot, handoffs woken by `SPUBLISH` on the set's own slot, and
//! the limit held under contention from several clients.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fairlock_core::{KeyPrefix, LockKeys, LockName, PermitFamily};
use fairlock_testkit::RedisCluster;
use fairlock_tests::cluster_client;

/// Hang guard.
const LONG: Duration = Duration::from_secs(30);

/// Set names whose keys land on each of the three primaries.
fn names_on_every_primary(cluster: &RedisCluster) -> Vec<String> {
    let primaries = cluster.primaries().expect("primaries");
    primaries
        .iter()
        .map(|primary| {
            (0..)
                .map(|i| format!("permits:{i}"))
                .find(|name| {
                    let keys = LockKeys::permits(
                        &KeyPrefix::default(),
                        &LockName::new(name.as_str()).expect("name"),
                        PermitFamily::Semaphore,
                    );
                    cluster.slot_owner(keys.slot()).ok().as_ref() == Some(primary)
                })
                .expect("a name on this primary")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_rw_locks_work_on_every_primary() {
    let cluster = RedisCluster::start().expect("cluster");
    let clients = vec![
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    ];
    let mut tasks = Vec::new();
    let mut bounds = Vec::new();
    for name in names_on_every_primary(&cluster) {
        let (active, most) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
        bounds.push(Arc::clone(&most));
        let inside = Arc::new(Mutex::new((0usize, 0usize)));
        for client in &clients {
            for t in 0..3 {
                let sem = client.semaphore(&name, 2).expect("semaphore");
                let (active, most) = (Arc::clone(&active), Arc::clone(&most));
                tasks.push(tokio::spawn(async move {
                    for _ in 0..6 {
                        let permit = sem.acquire().await.expect("permit");
                        let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        active.fetch_sub(1, Ordering::SeqCst);
                        permit.release().await.expect("release");
                    }
                }));
                let rw = client.rw_lock(&name).expect("rw lock");
                let inside = Arc::clone(&inside);
                let writer = t == 0;
                tasks.push(tokio::spawn(async move {
                    for _ in 0..6 {
                        let hold = if writer {
                            rw.write().await
                        } else {
                            rw.read().await
                        }
                        .expect("hold");
                        {
                            let mut now = inside.lock().expect("inside");
                            assert_eq!(now.1, 0, "a holder beside a writer");
                            if writer {
                                assert_eq!(now.0, 0, "a writer beside readers");
                                now.1 += 1;
                            } else {
                                now.0 += 1;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        {
                            let mut now = inside.lock().expect("inside");
                            if writer {
                                now.1 -= 1;
                            } else {
                                now.0 -= 1;
                            }
                        }
                        hold.release().await.expect("release");
                    }
                }));
            }
        }
    }
    for task in tasks {
        tokio::time::timeout(LONG, task)
            .await
            .expect("a handoff was lost")
            .expect("task");
    }
    for most in bounds {
        assert!(
            most.load(Ordering::SeqCst) <= 2,
            "more holders than permits"
        );
    }
    // Handoffs went by SPUBLISH in each set's own slot, never by PUBLISH.
    let (mut spublish, mut publish) = (0, 0);
    for node in cluster.nodes() {
        let stats = node.commandstats().expect("commandstats");
        spublish += stats.get("spublish").copied().unwrap_or(0);
        publish += stats.get("publish").copied().unwrap_or(0);
    }
    assert!(spublish > 0, "no SPUBLISH");
    assert_eq!(publish, 0, "a grant crossed the cluster bus");
}
