//! A TCP proxy in front of a test redis-server that can make the pub/sub
//! connections behind it go silent: bytes are dropped both ways while both
//! sockets stay open, like a network cut that closes nothing (a NAT that
//! forgot the flow, a peer that died without a FIN). Only a keep-alive
//! notices that.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One proxied connection: whether it subscribed, whether it is silenced.
struct Flow {
    subscribed: AtomicBool,
    silenced: AtomicBool,
}

/// The proxy; it stops when dropped.
pub struct SilentProxy {
    port: u16,
    flows: Arc<Mutex<Vec<Arc<Flow>>>>,
    subscribed: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl SilentProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `target_port`.
    pub async fn start(target_port: u16) -> SilentProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        let flows: Arc<Mutex<Vec<Arc<Flow>>>> = Arc::default();
        let subscribed = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn({
            let flows = Arc::clone(&flows);
            let subscribed = Arc::clone(&subscribed);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target_port)).await else {
                        continue;
                    };
                    let flow = Arc::new(Flow {
                        subscribed: AtomicBool::new(false),
                        silenced: AtomicBool::new(false),
                    });
                    flows.lock().expect("flows").push(Arc::clone(&flow));
                    let (from_client, to_client) = client.into_split();
                    let (from_server, to_server) = server.into_split();
                    tokio::spawn(pump(
                        from_client,
                        to_server,
                        Arc::clone(&flow),
                        Some(Arc::clone(&subscribed)),
                    ));
                    tokio::spawn(pump(from_server, to_client, flow, None));
                }
            }
        });
        SilentProxy {
            port,
            flows,
            subscribed,
            accept,
        }
    }

    /// A `redis://` URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Silences every connection that has subscribed so far.
    pub fn silence_subscribers(&self) {
        for flow in self.flows.lock().expect("flows").iter() {
            if flow.subscribed.load(Ordering::SeqCst) {
                flow.silenced.store(true, Ordering::SeqCst);
            }
        }
    }

    /// How many connections sent a SUBSCRIBE so far.
    pub fn subscribed_connections(&self) -> usize {
        self.subscribed.load(Ordering::SeqCst)
    }
}

impl Drop for SilentProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Whether `chunk` holds a `SUBSCRIBE` (or `SSUBSCRIBE`, `PSUBSCRIBE`)
/// command: the command's name as a RESP bulk string. A script's text that
/// merely mentions subscribers (every fairlock script does, in a comment)
/// is not one.
pub(crate) fn sends_subscribe(chunk: &[u8]) -> bool {
    const NAMES: [&[u8]; 3] = [
        b"$9\r\nSUBSCRIBE\r\n",
        b"$10\r\nSSUBSCRIBE\r\n",
        b"$10\r\nPSUBSCRIBE\r\n",
    ];
    NAMES.iter().any(|name| {
        chunk
            .windows(name.len())
            .any(|window| window.eq_ignore_ascii_case(name))
    })
}

/// Copies one direction of a flow; from the client, notes a SUBSCRIBE
/// (counted in `subscribed`). A silenced flow's bytes are read and dropped.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    flow: Arc<Flow>,
    subscribed: Option<Arc<AtomicUsize>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(count) = &subscribed {
            let chunk = &buf[..n];
            if !flow.subscribed.load(Ordering::SeqCst) && sends_subscribe(chunk) {
                flow.subscribed.store(true, Ordering::SeqCst);
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
        if flow.silenced.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sends_subscribe;

    #[test]
    fn a_subscribe_command_is_told_from_a_script_that_mentions_subscribers() {
        assert!(sends_subscribe(b"*2\r\n$9\r\nsubscribe\r\n$3\r\nabc\r\n"));
        assert!(sends_subscribe(b"*2\r\n$10\r\nSSUBSCRIBE\r\n$3\r\nabc\r\n"));
        assert!(!sends_subscribe(
            b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n$24\r\n-- one subscriber wakes\r\n"
        ));
    }
}
