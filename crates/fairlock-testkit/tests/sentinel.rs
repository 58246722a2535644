//! Self-tests of [`SentinelGroup`] and [`IndependentPrimaries`]: fail-over
//! really changes the primary the sentinels name, and a paused replica
//! really misses writes that a fail-over then loses.

use fairlock_testkit::{cmd_at, IndependentPrimaries, Resp, SentinelGroup};

fn primary_by_sentinel(group: &SentinelGroup, sentinel: usize) -> String {
    let reply = cmd_at(
        &group.sentinel_addrs()[sentinel],
        &["SENTINEL", "get-master-addr-by-name", group.master_name()],
    )
    .unwrap();
    let parts = reply.as_array().unwrap();
    format!(
        "{}:{}",
        parts[0].as_str().unwrap(),
        parts[1].as_str().unwrap()
    )
}

#[test]
fn sentinel_failover_changes_the_primary_and_keeps_writes() {
    let group = SentinelGroup::start(2).unwrap();
    assert_eq!(group.sentinel_addrs().len(), 3);
    assert!(group.url().starts_with("redis-sentinel://127.0.0.1:"));
    assert!(group.url().contains("sentinelServiceName=fairlock-primary"));
    let old = primary_by_sentinel(&group, 0);
    assert_eq!(group.replica_addrs().unwrap().len(), 2);
    cmd_at(&old, &["SET", "k", "v"]).unwrap();
    cmd_at(&old, &["WAIT", "2", "5000"]).unwrap();
    let new = group.failover().unwrap();
    assert_ne!(new, old);
    for sentinel in 0..3 {
        assert_eq!(primary_by_sentinel(&group, sentinel), new);
    }
    // Nothing acknowledged by both replicas was lost.
    assert_eq!(cmd_at(&new, &["GET", "k"]).unwrap().as_str(), Some("v"));
    let role = cmd_at(&new, &["ROLE"]).unwrap();
    assert_eq!(role.as_array().unwrap()[0].as_str(), Some("master"));
}

#[test]
fn killed_primary_with_a_lagging_replica_loses_the_writes_it_missed() {
    let mut group = SentinelGroup::start(1).unwrap();
    let old = group.primary_addr().unwrap();
    let replica = group.replica_addrs().unwrap()[0].clone();
    cmd_at(&old, &["SET", "before", "1"]).unwrap();
    cmd_at(&old, &["WAIT", "1", "5000"]).unwrap();
    group.pause_replication(&replica).unwrap();
    cmd_at(&old, &["SET", "during", "1"]).unwrap();
    // WAIT sees no replica acknowledge the write.
    assert_eq!(cmd_at(&old, &["WAIT", "1", "200"]).unwrap(), Resp::Int(0));
    assert!(cmd_at(&replica, &["GET", "during"]).unwrap().is_nil());

    let new = group.kill_primary().unwrap();
    assert_eq!(new, replica);
    assert_eq!(primary_by_sentinel(&group, 2), replica);
    assert_eq!(
        cmd_at(&new, &["GET", "before"]).unwrap().as_str(),
        Some("1")
    );
    assert!(cmd_at(&new, &["GET", "during"]).unwrap().is_nil());

    // The old primary comes back empty and is made a replica of the new one.
    group.resume_replication(&new).unwrap();
    group.restart_node(&old).unwrap();
    let role = cmd_at(&old, &["ROLE"]).unwrap();
    assert_eq!(role.as_array().unwrap()[0].as_str(), Some("slave"));
}

#[test]
fn independent_primaries_share_nothing() {
    let mut primaries = IndependentPrimaries::start(3).unwrap();
    let urls = primaries.urls();
    assert_eq!(urls.len(), 3);
    cmd_at(&urls[0], &["SET", "k", "v"]).unwrap();
    assert!(cmd_at(&urls[1], &["GET", "k"]).unwrap().is_nil());
    primaries.kill(&[0, 1]);
    assert_eq!(primaries.running(), 1);
    primaries.restart(0).unwrap();
    assert_eq!(primaries.running(), 2);
    assert!(cmd_at(&urls[0], &["GET", "k"]).unwrap().is_nil());
}
