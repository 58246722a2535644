//! The byte stream under fairlock's own grant connections: plain TCP, or
//! TLS over it for `rediss://`, `rediss-sentinel://` and `rediss-cluster://`
//! URLs (with the `tls` feature), opened with the TLS settings fred uses for
//! the command connections.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How to wrap the TCP connection in TLS: fred's rustls connector. The
/// server's certificate must carry the host of the address connected to,
/// as fred checks it (fairlock builds fred's configuration from the URL
/// alone, so no TLS host mapping renames a server).
#[cfg(feature = "tls")]
#[derive(Clone)]
pub(crate) struct TlsSettings {
    pub(crate) connector: tokio_rustls::TlsConnector,
}

/// Plain TCP or TLS; no TLS settings exist without the `tls` feature.
#[cfg(not(feature = "tls"))]
#[derive(Clone)]
pub(crate) enum TlsSettings {}

/// A connected stream, with `TCP_NODELAY` set: a grant's few bytes are
/// never held back.
pub(crate) enum GrantStream {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl GrantStream {
    /// Connects to `address` (`host:port`, an IPv6 host in brackets) and,
    /// with `tls`, completes the TLS handshake for the address's host.
    pub(crate) async fn connect(address: &str, tls: Option<&TlsSettings>) -> io::Result<Self> {
        #[cfg(feature = "tls")]
        let name = tls.map(|_| server_name(address)).transpose()?;
        let tcp = TcpStream::connect(address).await?;
        tcp.set_nodelay(true)?;
        match tls {
            None => Ok(Self::Plain(tcp)),
            #[cfg(feature = "tls")]
            Some(tls) => {
                let name = name.ok_or_else(|| io::Error::other("no TLS server name"))?;
                let stream = tls.connector.connect(name, tcp).await?;
                Ok(Self::Tls(Box::new(stream)))
            }
            #[cfg(not(feature = "tls"))]
            Some(never) => match *never {},
        }
    }
}

/// The name the certificate of the server at `address` must carry: its
/// host (a DNS name or an IP address, brackets removed).
#[cfg(feature = "tls")]
fn server_name(address: &str) -> io::Result<tokio_rustls::rustls::pki_types::ServerName<'static>> {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host} is not a TLS server name: {e}"),
        )
    })
}

impl AsyncRead for GrantStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for GrantStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_flush(cx),
            #[cfg(feature = "tls")]
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use tokio_rustls::rustls::pki_types::ServerName;

    use super::server_name;

    /// The certificate is checked against the host fred would check: an IP
    /// address as an address (IPv6 without its brackets), a name as a name.
    #[test]
    fn the_certificate_name_is_the_address_host() {
        let ip = |ip: IpAddr| Some(ServerName::IpAddress(ip.into()));
        assert_eq!(
            server_name("127.0.0.1:6380").ok(),
            ip(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        assert_eq!(
            server_name("[::1]:6379").ok(),
            ip(IpAddr::V6(Ipv6Addr::LOCALHOST))
        );
        assert_eq!(
            server_name("redis.example.com:6379").ok(),
            ServerName::try_from("redis.example.com").ok()
        );
        assert!(server_name("bad host!:1").is_err());
    }
}
