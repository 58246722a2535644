//! fairlock behind Sentinel over TLS (`rediss-sentinel://`, the `tls`
//! feature): sentinels and data nodes listen for TLS with a certificate
//! authority made for the test and replicate and monitor over TLS
//! (`tls-replication yes`), so the sentinels name the primary's TLS port.
//! One test in this binary: it sets `SSL_CERT_FILE`, which the TLS setup
//! of every client in the process reads.

use std::time::Duration;

use fairlock::{ClientConfig, LockClient};
use fairlock_testkit::{SentinelGroup, TlsFiles};
use fairlock_tests::{hand_over, pubsub_only_client};

/// A grant reaches a waiter of a [`pubsub_only_client`] within this bound
/// only on a pub/sub connection. Not a speed assertion.
const HEARD: Duration = Duration::from_secs(20);

/// Waits (bounded) until `client`'s grant connection is subscribed on
/// `primary` alone, and says where it is.
async fn subscribed_on(client: &LockClient, primary: &str) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while client.grants_subscribed_at() != [primary] && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.grants_subscribed_at()
}

/// Grants come over TLS on fairlock's own connection to the primary the
/// sentinels name; after `SENTINEL FAILOVER` a client's connection moves to
/// the new primary, and there too a release's grant reaches a waiter of
/// another client on that connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_come_over_tls_from_the_primary_through_a_failover() {
    let files = TlsFiles::generate().expect("a CA and a server certificate");
    let group = SentinelGroup::start_tls(1, &files).expect("sentinel group with TLS");
    let url = group.tls_url().expect("TLS ports");
    // The only test of this binary, before any client exists.
    files.trust();
    let holder_client = pubsub_only_client(&url).await;
    let waiter_client = pubsub_only_client(&url).await;
    // The keep-alive check that moves a grant connection to a new primary
    // runs once per heartbeat interval.
    let mut config = ClientConfig::new(url.as_str());
    config.heartbeat_interval = Duration::from_secs(1);
    let follower = LockClient::with_config(config)
        .await
        .expect("TLS sentinel client");

    let primary = group.primary_addr().expect("primary");
    assert_eq!(
        subscribed_on(&waiter_client, &primary).await,
        std::slice::from_ref(&primary),
        "subscribed over TLS on the primary the sentinels name"
    );
    let holder = holder_client
        .lock("tls-sentinel")
        .await
        .expect("lock over TLS");
    let granted = hand_over(holder, &holder_client, &waiter_client, HEARD).await;
    granted.release().await.expect("release");

    let new_primary = group.failover().expect("failover");
    assert_ne!(new_primary, primary);
    group.wait_settled().expect("settled");
    assert_eq!(
        subscribed_on(&follower, &new_primary).await,
        std::slice::from_ref(&new_primary),
        "the grant connection follows the new primary"
    );
    let new_waiter = pubsub_only_client(&url).await;
    assert_eq!(
        subscribed_on(&new_waiter, &new_primary).await,
        std::slice::from_ref(&new_primary)
    );
    let holder = tokio::time::timeout(HEARD, holder_client.lock("tls-sentinel"))
        .await
        .expect("lock on the new primary")
        .expect("holder");
    let granted = hand_over(holder, &holder_client, &new_waiter, HEARD).await;
    granted.release().await.expect("release");
    for client in [holder_client, waiter_client, follower, new_waiter] {
        client.shutdown().await;
    }
}
