//! The byte stream under fairlock's own grant connection: plain TCP, or
//! TLS over it for `rediss://` URLs (with the `tls` feature), opened with
//! the TLS settings fred uses for the command connections.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How to wrap the TCP connection in TLS: fred's rustls connector and the
/// name the server's certificate must carry.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub(crate) struct TlsSettings {
    pub(crate) connector: tokio_rustls::TlsConnector,
    pub(crate) server_name: tokio_rustls::rustls::pki_types::ServerName<'static>,
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
    /// Connects to `address` (`host:port`) and, with `tls`, completes the
    /// TLS handshake.
    pub(crate) async fn connect(address: &str, tls: Option<&TlsSettings>) -> io::Result<Self> {
        let tcp = TcpStream::connect(address).await?;
        tcp.set_nodelay(true)?;
        match tls {
            None => Ok(Self::Plain(tcp)),
            #[cfg(feature = "tls")]
            Some(tls) => {
                let stream = tls.connector.connect(tls.server_name.clone(), tcp).await?;
                Ok(Self::Tls(Box::new(stream)))
            }
            #[cfg(not(feature = "tls"))]
            Some(never) => match *never {},
        }
    }
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
