//! A TCP proxy on 127.0.0.1 between one worker and the lock server, which
//! the runner can slow down or cut, to inject network faults without root
//! or `tc`.
//!
//! A partition here behaves like a real one for the client: nothing is
//! refused or reset, bytes just stop flowing (they wait in the proxy) until
//! the link heals, so the client's own timeouts are what notice it. When
//! the server side closes (a Redis restart), the client side is closed
//! too, and the client's reconnect comes through the proxy again.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// The state of the link the proxy carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Bytes pass at once.
    Open,
    /// Every chunk waits this long before it is passed on.
    Delayed(Duration),
    /// Nothing passes (and no new upstream connection is made) until the
    /// state changes.
    Partitioned,
}

/// A running proxy; dropping it (or [`Proxy::shutdown`]) closes every
/// connection it carries.
pub struct Proxy {
    addr: SocketAddr,
    link: watch::Sender<Link>,
    listener: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (link, watch) = watch::channel(Link::Open);
        let listener = tokio::spawn(accept_loop(listener, upstream, watch));
        Ok(Self {
            addr,
            link,
            listener,
        })
    }

    /// `redis://127.0.0.1:<port>` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Changes the link for every connection, current and future.
    pub fn set(&self, link: Link) {
        self.link.send_replace(link);
    }

    /// Stops accepting and closes every connection.
    pub fn shutdown(&self) {
        self.listener.abort();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Accepts clients; the connections live in a set owned by this task, so
/// aborting it closes them all.
async fn accept_loop(listener: TcpListener, upstream: SocketAddr, link: watch::Receiver<Link>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    connections.spawn(carry(client, upstream, link.clone()));
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Waits while the link is partitioned.
async fn wait_open(link: &mut watch::Receiver<Link>) -> Link {
    loop {
        let state = *link.borrow_and_update();
        if state != Link::Partitioned {
            return state;
        }
        if link.changed().await.is_err() {
            return Link::Open;
        }
    }
}

/// Carries one client connection until either side closes.
async fn carry(client: TcpStream, upstream: SocketAddr, mut link: watch::Receiver<Link>) {
    wait_open(&mut link).await;
    let connect = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(upstream)).await;
    let Ok(Ok(server)) = connect else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // When one direction ends, the other is dropped: both sockets close.
    tokio::select! {
        _ = pump(client_read, server_write, link.clone()) => {}
        _ = pump(server_read, client_write, link) => {}
    }
}

/// Copies one direction, obeying the link state for every chunk.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut link: watch::Receiver<Link>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Link::Delayed(delay) = wait_open(&mut link).await {
            tokio::time::sleep(delay).await;
            // A partition may have started during the delay.
            wait_open(&mut link).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn passes_bytes_holds_them_while_partitioned_then_heals() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
        let mut buf = [0u8; 4];
        conn.write_all(b"ping").await.unwrap();
        conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");

        proxy.set(Link::Partitioned);
        conn.write_all(b"lost").await.unwrap();
        let held = tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await;
        assert!(held.is_err(), "bytes crossed a partition");

        proxy.set(Link::Delayed(Duration::from_millis(10)));
        conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"lost");

        proxy.shutdown();
        let closed = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    }
}
