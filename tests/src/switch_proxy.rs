//! A TCP proxy in front of one test redis-server that can be pointed at
//! another and cut every connection it carries: what a client behind one
//! address (a virtual IP, a DNS name, a load balancer) sees when the
//! server behind that address is replaced. The client reconnects to the
//! same address and reaches the new server.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::copy;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The proxy; it stops, and closes what it carries, when dropped.
pub struct SwitchProxy {
    port: u16,
    target: Arc<AtomicU16>,
    flows: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl SwitchProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `target_port`.
    pub async fn start(target_port: u16) -> SwitchProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        let target = Arc::new(AtomicU16::new(target_port));
        let flows: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let (target, flows) = (Arc::clone(&target), Arc::clone(&flows));
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let port = target.load(Ordering::SeqCst);
                    let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await else {
                        continue;
                    };
                    let flow = tokio::spawn(async move {
                        let (mut from_client, mut to_client) = client.into_split();
                        let (mut from_server, mut to_server) = server.into_split();
                        // Either direction ending ends the flow; dropping
                        // the halves closes both sockets.
                        tokio::select! {
                            _ = copy(&mut from_client, &mut to_server) => {}
                            _ = copy(&mut from_server, &mut to_client) => {}
                        }
                    });
                    flows.lock().expect("flows").push(flow);
                }
            }
        });
        SwitchProxy {
            port,
            target,
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

    /// Closes every connection open through the proxy.
    pub fn cut(&self) {
        for flow in self.flows.lock().expect("flows").drain(..) {
            flow.abort();
        }
    }
}

impl Drop for SwitchProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
