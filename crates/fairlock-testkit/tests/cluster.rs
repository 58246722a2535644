//! Self-tests of [`RedisCluster`]: the cluster the topology tests rely on
//! really covers every slot, really moves a slot with its keys, and really
//! fails over. Each test starts its own cluster, so they run in parallel.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use fairlock_testkit::{cmd_at, key_slot, RedisCluster, Resp, ServerKind};

#[test]
fn starts_with_all_slots_covered_and_one_replica_per_primary() {
    let cluster = RedisCluster::start().unwrap();
    assert_eq!(cluster.covered_slots().unwrap(), 16384);
    // FAIRLOCK_TEST_SERVER picks the binary every node runs.
    for node in cluster.nodes() {
        assert_eq!(
            node.version().unwrap().kind,
            ServerKind::from_env().unwrap()
        );
    }
    let primaries = cluster.primaries().unwrap();
    assert_eq!(primaries.len(), 3, "{primaries:?}");
    for primary in &primaries {
        assert_eq!(cluster.replicas_of(primary).unwrap().len(), 1);
    }
    assert!(cluster.url().starts_with("redis-cluster://127.0.0.1:"));
    assert_eq!(cluster.url().matches("node=").count(), 5);
    // Our slot function agrees with the server's, hash tags included.
    for key in [
        "a",
        "lock:{orders}:owner",
        "{}x",
        "x{}{y}",
        "{user1000}.following",
    ] {
        let server = cluster.nodes()[0]
            .cmd(&["CLUSTER", "KEYSLOT", key])
            .unwrap()
            .as_int()
            .unwrap();
        assert_eq!(i64::from(key_slot(key.as_bytes())), server, "{key}");
    }
    // A write to the owner of its slot succeeds; elsewhere it is MOVED.
    let key = "lock:{orders}:owner";
    let owner = cluster.slot_owner(key_slot(key.as_bytes())).unwrap();
    assert_eq!(
        cmd_at(&owner, &["SET", key, "v"]).unwrap(),
        Resp::Simple("OK".into())
    );
    let other = primaries.iter().find(|p| **p != owner).unwrap();
    let moved = cmd_at(other, &["GET", key]).unwrap();
    assert!(
        matches!(&moved, Resp::Error(e) if e.starts_with("MOVED")),
        "{moved:?}"
    );
}

#[test]
fn slot_migration_moves_the_keys_and_the_slot() {
    let cluster = RedisCluster::start().unwrap();
    let slot = key_slot(b"{mig}");
    let from = cluster.slot_owner(slot).unwrap();
    for i in 0..150 {
        let key = format!("{{mig}}:{i}");
        cmd_at(&from, &["SET", &key, &i.to_string()]).unwrap();
    }
    let to = cluster.other_primary(&from).unwrap();
    // Writes keep flowing on both primaries during the migration, as
    // waiters' heartbeats would: the helper must still see replicas settle
    // although primary and replica offsets are rarely equal at one instant.
    let stop = AtomicBool::new(false);
    let writes: u64 = thread::scope(|scope| {
        let writers: Vec<_> = ["{w1}", "{w2}", "{w3}"]
            .into_iter()
            .map(|key| {
                let primary = cluster.slot_owner(key_slot(key.as_bytes())).unwrap();
                let (node, stop) = (cluster.node(&primary).unwrap(), &stop);
                scope.spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let _ = node.cmd(&["INCR", key]);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        assert_eq!(cluster.migrate_slot(slot, &to).unwrap(), 150);
        stop.store(true, Ordering::Relaxed);
        writers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    assert!(writes > 0);
    assert_eq!(cluster.slot_owner(slot).unwrap(), to);
    assert_eq!(cluster.covered_slots().unwrap(), 16384);
    assert_eq!(
        cmd_at(&to, &["GET", "{mig}:149"]).unwrap().as_str(),
        Some("149")
    );
    let moved = cmd_at(&from, &["GET", "{mig}:149"]).unwrap();
    assert!(
        matches!(&moved, Resp::Error(e) if e.starts_with("MOVED")),
        "{moved:?}"
    );
    // Every node, replicas included, routes the slot to the new owner.
    for addr in cluster.addrs() {
        let reply = cmd_at(&addr, &["GET", "{mig}:0"]).unwrap();
        if addr != to {
            let Resp::Error(e) = &reply else {
                panic!("{addr}: {reply:?}")
            };
            assert!(e.ends_with(&to), "{addr}: {e}");
        }
    }
}

#[test]
fn manual_failover_promotes_the_replica() {
    let cluster = RedisCluster::start().unwrap();
    let slot = key_slot(b"{fo}");
    let primary = cluster.slot_owner(slot).unwrap();
    cmd_at(&primary, &["SET", "{fo}", "kept"]).unwrap();
    let replica = cluster.replicas_of(&primary).unwrap()[0].clone();
    assert_eq!(cluster.failover(&primary).unwrap(), replica);
    assert_eq!(cluster.slot_owner(slot).unwrap(), replica);
    // The old primary is now the new primary's replica, and the write survived.
    assert_eq!(
        cluster.replicas_of(&replica).unwrap(),
        vec![primary.clone()]
    );
    assert_eq!(
        cmd_at(&replica, &["GET", "{fo}"]).unwrap().as_str(),
        Some("kept")
    );
}

#[test]
fn killed_primary_is_replaced_by_its_replica() {
    let mut cluster = RedisCluster::start().unwrap();
    let slot = key_slot(b"{kill}");
    let primary = cluster.slot_owner(slot).unwrap();
    let replica = cluster.replicas_of(&primary).unwrap()[0].clone();
    assert_eq!(cluster.kill_primary(&primary).unwrap(), replica);
    assert_eq!(cluster.slot_owner(slot).unwrap(), replica);
    assert_eq!(cluster.covered_slots().unwrap(), 16384);
    // The killed node comes back as a replica of the promoted one.
    cluster.restart_node(&primary).unwrap();
    assert_eq!(cluster.replicas_of(&replica).unwrap(), vec![primary]);
}
