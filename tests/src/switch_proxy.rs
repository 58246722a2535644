//! A TCP proxy in front of one test redis-server that can be pointed at
//! another and cut every connection it carries: what a client behind one
//! address (a virtual IP, a DNS name, a load balancer) sees when the
//! server behind that address is replaced. The client reconnects to the
//! same address and reaches the new server. It can also hold back every
//! reply for a while: a slow network, or a server slow to answer.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::silent_proxy::sends_subscribe;

/// One connection through the proxy: its copying task, and whether the
/// client sent a `SUBSCRIBE` on it.
struct Flow {
    task: JoinHandle<()>,
    subscribed: Arc<AtomicBool>,
}

/// The proxy; it stops, and closes what it carries, when dropped.
pub struct SwitchProxy {
    port: u16,
    target: Arc<AtomicU16>,
    reply_delay_ms: Arc<AtomicU64>,
    flows: Arc<Mutex<Vec<Flow>>>,
    accept: JoinHandle<()>,
}

impl SwitchProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `target_port`.
    pub async fn start(target_port: u16) -> SwitchProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        let target = Arc::new(AtomicU16::new(target_port));
        let reply_delay_ms = Arc::new(AtomicU64::new(0));
        let flows: Arc<Mutex<Vec<Flow>>> = Arc::default();
        let accept = tokio::spawn({
            let (target, flows) = (Arc::clone(&target), Arc::clone(&flows));
            let reply_delay_ms = Arc::clone(&reply_delay_ms);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let port = target.load(Ordering::SeqCst);
                    let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await else {
                        continue;
                    };
                    let subscribed = Arc::new(AtomicBool::new(false));
                    let noted = Arc::clone(&subscribed);
                    let delay = Arc::clone(&reply_delay_ms);
                    let task = tokio::spawn(async move {
                        let (from_client, to_client) = client.into_split();
                        let (mut from_server, mut to_server) = server.into_split();
                        let mut to_client = to_client;
                        // Either direction ending ends the flow; dropping
                        // the halves closes both sockets.
                        tokio::select! {
                            () = forward(from_client, &mut to_server, &noted) => {}
                            () = reply(&mut from_server, &mut to_client, &delay) => {}
                        }
                    });
                    flows.lock().expect("flows").push(Flow { task, subscribed });
                }
            }
        });
        SwitchProxy {
            port,
            target,
            reply_delay_ms,
            flows,
            accept,
        }
    }

    /// A `redis://` URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// New connections go to `target_port` from now on.
    pub fn switch_to(&self, target_port: u16) {
        self.target.store(target_port, Ordering::SeqCst);
    }

    /// Holds back each reply (each read from the server) this long before
    /// passing it on, on every connection, open or new.
    pub fn delay_replies(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.reply_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Closes every connection open through the proxy.
    pub fn cut(&self) {
        for flow in self.flows.lock().expect("flows").drain(..) {
            flow.task.abort();
        }
    }

    /// How many connections open through the proxy (or closed by their
    /// ends, not by [`SwitchProxy::cut`]) sent a `SUBSCRIBE`.
    pub fn subscribed_connections(&self) -> usize {
        self.flows
            .lock()
            .expect("flows")
            .iter()
            .filter(|flow| flow.subscribed.load(Ordering::SeqCst))
            .count()
    }

    /// Closes the connections that subscribed (pub/sub), leaving the
    /// others open.
    pub fn cut_subscribers(&self) {
        self.flows.lock().expect("flows").retain(|flow| {
            let subscribed = flow.subscribed.load(Ordering::SeqCst);
            if subscribed {
                flow.task.abort();
            }
            !subscribed
        });
    }
}

/// Copies the client's bytes to the server, noting a `SUBSCRIBE`.
async fn forward(mut from: OwnedReadHalf, to: &mut OwnedWriteHalf, subscribed: &AtomicBool) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if sends_subscribe(&buf[..n]) {
            subscribed.store(true, Ordering::SeqCst);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Copies the server's bytes to the client, each read held back by the
/// delay set then.
async fn reply(from: &mut OwnedReadHalf, to: &mut OwnedWriteHalf, delay_ms: &AtomicU64) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for SwitchProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
