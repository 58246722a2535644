//! What a connected client costs its process before any lock is taken.
//!
//! fred preallocates the buffer of each of a connection's ten event
//! channels (messages, reconnects, errors, ...). The subscriber connection
//! needs a deep message buffer for bursts of grants; the two command
//! connections have no listener at all. With the deep buffer on all three
//! connections a client cost 7.8 MB of heap; with it on the subscriber
//! only, 2.8 MB. On a single server the subscriber is no longer fred's but
//! fairlock's own grant connection (a socket and a 4 KiB read buffer):
//! 0.18 MB.
//!
//! Alone in its test binary: the figure is the process's heap, and a
//! test running beside it would allocate into it.

use fairlock_tests::*;

/// Far above the 0.18 MB a client costs on a single server, far below the
/// 2.8 MB it cost with fred's subscriber.
const CLIENT_HEAP_MAX: f64 = 1024.0 * 1024.0;
const CLIENTS: usize = 4;

/// Bytes in the process's allocated heap chunks, all arenas (glibc).
fn heap_bytes() -> f64 {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    info.uordblks as f64 + info.hblkhd as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connected_client_costs_under_a_mib_of_heap() {
    let server = server();
    // One client first: what every client shares (the runtime's and
    // fred's statics) is then in place before the measurement.
    let first = client(&server).await;
    let before = heap_bytes();
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(client(&server).await);
    }
    let per_client = (heap_bytes() - before) / CLIENTS as f64;
    eprintln!("{per_client:.0} B of heap per connected client");
    assert!(
        per_client <= CLIENT_HEAP_MAX,
        "a connected client costs {per_client:.0} B of heap"
    );
    // Still a working client: a lock taken and given back on each.
    for (i, client) in clients.iter().enumerate() {
        let guard = client
            .lock(format!("client-memory:{i}"))
            .await
            .expect("lock");
        guard.release().await.expect("release");
    }
    for client in clients {
        client.shutdown().await;
    }
    first.shutdown().await;
}
