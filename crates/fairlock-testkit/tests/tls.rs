//! Self-tests of the TLS topologies, [`RedisCluster::start_tls`] and
//! [`SentinelGroup::start_tls`]: asked over TLS (with `redis-cli --tls`,
//! trusting the test's authority), the cluster names its nodes' TLS ports and
//! the sentinels name the primary's TLS port, also after a fail-over; and the
//! kit's own helpers, which talk plain TCP, keep working on them.

use std::process::Command;

use fairlock_testkit::install::ensure_cli;
use fairlock_testkit::{cmd_at, key_slot, RedisCluster, SentinelGroup, ServerKind, TlsFiles};

/// The port of `127.0.0.1:<port>`.
fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// `redis-cli --tls` against `addr`, trusting only the test's authority;
/// the reply's lines (redis-cli prints one element a line when its output
/// is not a terminal).
fn tls_cli(files: &TlsFiles, addr: &str, args: &[&str]) -> Vec<String> {
    let out = Command::new(ensure_cli(ServerKind::Redis).unwrap())
        .args(["--tls", "--cacert"])
        .arg(files.ca())
        .args(["-h", "127.0.0.1", "-p", &port_of(addr).to_string()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "redis-cli {args:?} on {addr}: {out:?}"
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The ports of a `CLUSTER SLOTS` reply: the element after each `127.0.0.1`.
fn ports_after_ip(lines: &[String]) -> Vec<u16> {
    lines
        .windows(2)
        .filter(|w| w[0] == "127.0.0.1")
        .map(|w| w[1].parse().unwrap())
        .collect()
}

#[test]
fn tls_cluster_sends_tls_ports_to_tls_clients() {
    let files = TlsFiles::generate().unwrap();
    let mut cluster = RedisCluster::start_tls(&files).unwrap();
    assert_eq!(cluster.covered_slots().unwrap(), 16384);
    // Redis whatever FAIRLOCK_TEST_SERVER says.
    for node in cluster.nodes() {
        assert_eq!(node.version().unwrap().kind, ServerKind::Redis);
    }
    let tls_addrs: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.tls_addr().unwrap())
        .collect();
    let url = cluster.tls_url().unwrap();
    assert_eq!(
        url,
        format!(
            "rediss-cluster://{}?{}",
            tls_addrs[0],
            tls_addrs[1..]
                .iter()
                .map(|a| format!("node={a}"))
                .collect::<Vec<_>>()
                .join("&")
        )
    );

    // Over TLS, CLUSTER SLOTS names every slot range's primary (and the
    // replicas it lists) by TLS port; plain clients still get plain ports.
    let tls_ports: Vec<u16> = tls_addrs.iter().map(|a| port_of(a)).collect();
    let mut primaries: Vec<u16> = cluster
        .primaries()
        .unwrap()
        .iter()
        .map(|p| cluster.node(p).unwrap().tls_port().unwrap())
        .collect();
    primaries.sort_unstable();
    let slots = tls_cli(&files, &tls_addrs[0], &["CLUSTER", "SLOTS"]);
    let ports = ports_after_ip(&slots);
    assert!(ports.iter().all(|p| tls_ports.contains(p)), "{slots:?}");
    let mut named: Vec<u16> = ports
        .iter()
        .copied()
        .filter(|p| primaries.contains(p))
        .collect();
    named.sort_unstable();
    assert_eq!(named, primaries, "{slots:?}");
    let shards = tls_cli(&files, &tls_addrs[0], &["CLUSTER", "SHARDS"]);
    assert_eq!(
        shards.iter().filter(|l| *l == "tls-port").count(),
        6,
        "{shards:?}"
    );

    // A MOVED over TLS names the owner's TLS port; the kit's plain admin
    // connection is sent the plain one.
    let key = "{tls}:k";
    let owner = cluster.slot_owner(key_slot(key.as_bytes())).unwrap();
    let owner_tls = cluster.node(&owner).unwrap().tls_addr().unwrap();
    let other = cluster.nodes().iter().find(|n| n.addr() != owner).unwrap();
    let moved = tls_cli(&files, &other.tls_addr().unwrap(), &["GET", key]);
    assert!(moved[0].ends_with(&owner_tls), "{moved:?}");
    let moved = other.cmd(&["GET", key]).unwrap();
    assert!(
        moved.as_str().is_none() && format!("{moved:?}").contains(&owner),
        "{moved:?}"
    );

    // Slot migration (MIGRATE goes over TLS with tls-cluster) moves the
    // keys; a node's TLS address names it as well as its plain one.
    cmd_at(&owner, &["SET", key, "v"]).unwrap();
    let to = cluster.other_primary(&owner).unwrap();
    let to_tls = cluster.node(&to).unwrap().tls_addr().unwrap();
    assert_eq!(
        cluster
            .migrate_slot(key_slot(key.as_bytes()), &to_tls)
            .unwrap(),
        1
    );
    assert_eq!(cluster.slot_owner(key_slot(key.as_bytes())).unwrap(), to);
    assert_eq!(tls_cli(&files, &to_tls, &["GET", key]), ["v"]);

    // A restarted replica comes back on both of its ports.
    let replica = cluster.replicas_of(&to_tls).unwrap()[0].clone();
    let replica_tls = cluster.node(&replica).unwrap().tls_addr().unwrap();
    cluster.kill_node(&replica_tls).unwrap();
    cluster.restart_node(&replica).unwrap();
    assert_eq!(
        cluster.node(&replica).unwrap().tls_addr().unwrap(),
        replica_tls
    );
    assert_eq!(tls_cli(&files, &replica_tls, &["PING"]), ["PONG"]);
    assert_eq!(cluster.replicas_of(&to).unwrap(), [replica]);
}

/// `SENTINEL get-master-addr-by-name`, asked over TLS.
fn primary_by_tls(files: &TlsFiles, sentinel: &str, group: &SentinelGroup) -> String {
    let reply = tls_cli(
        files,
        sentinel,
        &["SENTINEL", "get-master-addr-by-name", group.master_name()],
    );
    assert_eq!(reply.len(), 2, "{reply:?}");
    format!("{}:{}", reply[0], reply[1])
}

#[test]
fn tls_sentinels_name_tls_ports_through_a_failover() {
    let files = TlsFiles::generate().unwrap();
    let group = SentinelGroup::start_tls(1, &files).unwrap();
    let (primary, replica) = (&group.nodes()[0], &group.nodes()[1]);
    let (primary_tls, replica_tls) = (primary.tls_addr().unwrap(), replica.tls_addr().unwrap());
    let sentinels = group.sentinel_tls_addrs();
    assert_eq!(sentinels.len(), 3);
    assert_eq!(
        group.tls_url().unwrap(),
        format!(
            "rediss-sentinel://{}?sentinelServiceName={}&node={}&node={}",
            sentinels[0],
            group.master_name(),
            sentinels[1],
            sentinels[2]
        )
    );
    for sentinel in &sentinels {
        assert_eq!(primary_by_tls(&files, sentinel, &group), primary_tls);
    }
    assert_eq!(group.primary_addr().unwrap(), primary_tls);
    assert_eq!(group.replica_addrs().unwrap(), [replica_tls.as_str()]);
    // The replica replicates over TLS.
    let info = replica.info("replication").unwrap();
    assert_eq!(info["master_port"], primary.tls_port().unwrap().to_string());
    assert_eq!(info["master_link_status"], "up");

    assert_eq!(group.failover().unwrap(), replica_tls);
    for sentinel in &sentinels {
        assert_eq!(primary_by_tls(&files, sentinel, &group), replica_tls);
    }
    assert_eq!(group.node(&replica_tls).unwrap().addr(), replica.addr());
    // (The old primary turns replica at the sentinels' next INFO round, up
    // to 10 s later: not waited for here, see the next test.)
}

#[test]
fn tls_sentinels_replace_a_killed_primary() {
    let files = TlsFiles::generate().unwrap();
    let mut group = SentinelGroup::start_tls(1, &files).unwrap();
    let old = group.primary_addr().unwrap();
    let replica = group.replica_addrs().unwrap()[0].clone();
    assert_eq!(group.kill_primary().unwrap(), replica);
    assert_eq!(
        primary_by_tls(&files, &group.sentinel_tls_addrs()[1], &group),
        replica
    );
    // The old primary comes back, by its TLS address, as a replica.
    group.restart_node(&old).unwrap();
    assert_eq!(group.replica_addrs().unwrap(), [old.as_str()]);
    assert_eq!(tls_cli(&files, &old, &["ROLE"])[0], "slave");
    // It replicates from the new primary's TLS port.
    let info = group.node(&old).unwrap().info("replication").unwrap();
    assert_eq!(info["master_port"], port_of(&replica).to_string());
    assert_eq!(info["master_link_status"], "up");
}
