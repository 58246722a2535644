//! Where fairlock's own grant connections connect: the URL's single
//! server, the primary the sentinels name (followed through fred's
//! reconnect announcements), or each cluster node serving a slot waited
//! in; with the URL's credentials and, for TLS, fred's own connector.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use fred::prelude::{Config, Server};
use fred::types::config::ServerConfig;
use tokio::sync::broadcast;

use crate::error::{Error, Result};
use crate::grant_stream::TlsSettings;

/// Where fairlock's own grant connection connects, with the URL's
/// credentials (those of the data nodes, not of the sentinels). No
/// `Debug`: it holds the password.
pub(crate) struct GrantEndpoint {
    target: GrantTarget,
    /// For `rediss://`: the TLS settings fred's command connections use.
    tls: Option<TlsSettings>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// How often a single server's URL was found to have moved (its
    /// server answered `READONLY`, `moved_primary.rs`).
    moves: AtomicU64,
}

/// Which server the grant connection subscribes on.
enum GrantTarget {
    /// The URL's single server, `host:port` as fred connects to it.
    Fixed(String),
    /// Behind Sentinel: the primary the waiters' command connection was
    /// last connected to. fred announces every (re)connect of that
    /// connection, the first one included, with the server it reached;
    /// the announcements are read when the address is asked for.
    Primary(Mutex<FollowPrimary>),
    /// On a cluster: the primary of each slot this process waits in, as
    /// fred's slot map names it (`sharded_grants.rs`).
    ClusterNodes,
}

/// The reconnect announcements of fred's waiters' command connection and
/// the last server they named.
struct FollowPrimary {
    reconnects: broadcast::Receiver<Server>,
    latest: Option<String>,
}

/// Which kind of grant endpoint a fred config allows, before any
/// connection exists.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum GrantPlace {
    Fixed(String),
    SentinelPrimary,
    ClusterNodes,
}

impl GrantPlace {
    /// Where fairlock's own grant connections can go for `config`: a single
    /// server, a Sentinel-managed primary or the nodes of a cluster, over
    /// plain TCP or TLS. `None` if fred's TLS connector is not the rustls
    /// one [`grant_tls`] takes (not with fairlock's `tls` feature; a TLS URL
    /// without it is refused by [`check_scheme`]).
    pub(super) fn of(config: &Config, tls: Option<&TlsSettings>) -> Option<Self> {
        if config.uses_tls() != tls.is_some() {
            return None;
        }
        match &config.server {
            ServerConfig::Centralized { server } => Some(Self::Fixed(address(server))),
            ServerConfig::Sentinel { .. } => Some(Self::SentinelPrimary),
            ServerConfig::Clustered { .. } => Some(Self::ClusterNodes),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

/// The TLS settings of fairlock's own grant connections: fred's rustls
/// connector (with the roots fred trusts). `None` without TLS.
#[cfg(feature = "tls")]
pub(super) fn grant_tls(config: &Config) -> Option<TlsSettings> {
    use fred::types::config::TlsConnector;
    match &config.tls.as_ref()?.connector {
        TlsConnector::Rustls(connector) => Some(TlsSettings {
            connector: connector.clone(),
        }),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

#[cfg(not(feature = "tls"))]
pub(super) fn grant_tls(_: &Config) -> Option<TlsSettings> {
    None
}

/// The URL schemes fairlock connects with: Redis's and Valkey's spellings
/// of a single server, a cluster and a Sentinel group, plain and TLS.
const SCHEMES: [&str; 12] = [
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis-cluster",
    "rediss-cluster",
    "valkey-cluster",
    "valkeys-cluster",
    "redis-sentinel",
    "rediss-sentinel",
    "valkey-sentinel",
    "valkeys-sentinel",
];

/// Checks a URL's scheme before anything connects. fred reads any scheme
/// it does not know as a plain single server, so a typo or an `http://`
/// would connect (or, to a TLS port, fail only after the connect timeout
/// as unreachable): such a scheme is refused here, naming those taken. A
/// TLS URL (`rediss://`, `rediss-cluster://`, `rediss-sentinel://`, or
/// Valkey's `valkeys` spellings) needs the `tls` feature: without it fred
/// would speak plain TCP to a TLS port and the connect would fail with
/// nothing that says why.
pub(crate) fn check_scheme(url: &str, redacted: &str) -> Result<()> {
    let scheme = match url.split_once("://") {
        Some((scheme, _)) => scheme.to_ascii_lowercase(),
        None => String::new(),
    };
    if !SCHEMES.contains(&scheme.as_str()) {
        return Err(Error::InvalidOptions(format!(
            "Redis URL {redacted} has scheme {scheme:?}, which is not Redis's or Valkey's: \
             expected redis://host:port (or rediss://, redis-cluster://, \
             redis-sentinel://, their TLS forms, or the valkey spellings)"
        )));
    }
    let tls = scheme.starts_with("rediss") || scheme.starts_with("valkeys");
    if tls && !cfg!(feature = "tls") {
        return Err(Error::InvalidOptions(format!(
            "Redis URL {redacted} asks for TLS, and this build of fairlock has no TLS: \
             enable its `tls` feature"
        )));
    }
    Ok(())
}

/// `host:port` of `server` as `TcpStream::connect` takes it: an IPv6 host
/// in brackets (a URL keeps them in the host, a sentinel names the bare
/// address).
pub(super) fn address(server: &Server) -> String {
    let host: &str = &server.host;
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{}", server.port)
    } else {
        format!("{host}:{}", server.port)
    }
}

impl GrantEndpoint {
    /// The endpoint for `place`, with the URL's TLS settings and
    /// credentials. Behind Sentinel it follows the announcements of
    /// `reconnects()` (fred's waiters' command connection).
    pub(super) fn new(
        place: GrantPlace,
        reconnects: impl FnOnce() -> broadcast::Receiver<Server>,
        tls: Option<TlsSettings>,
        username: Option<String>,
        password: Option<String>,
    ) -> Self {
        let target = match place {
            GrantPlace::Fixed(address) => GrantTarget::Fixed(address),
            GrantPlace::ClusterNodes => GrantTarget::ClusterNodes,
            GrantPlace::SentinelPrimary => GrantTarget::Primary(Mutex::new(FollowPrimary {
                reconnects: reconnects(),
                latest: None,
            })),
        };
        Self {
            target,
            tls,
            username,
            password,
            moves: AtomicU64::new(0),
        }
    }

    /// How often the URL was found to have moved: a grant connection
    /// opened before the last move is opened again (at the URL, which
    /// leads to the new primary).
    pub(crate) fn moves(&self) -> u64 {
        self.moves.load(Ordering::SeqCst)
    }

    /// The URL's server answered `READONLY`: it was demoted, and the URL
    /// may lead to a new primary.
    pub(super) fn moved(&self) {
        self.moves.fetch_add(1, Ordering::SeqCst);
    }

    /// How to wrap the connection in TLS, for `rediss://`.
    pub(crate) fn tls(&self) -> Option<&TlsSettings> {
        self.tls.as_ref()
    }

    /// Whether the grants come on one connection per cluster node (then
    /// [`GrantEndpoint::address`] is `None`; see
    /// [`RedisConnection::node_of_slot`](super::RedisConnection::node_of_slot)).
    pub(crate) fn is_sharded(&self) -> bool {
        matches!(self.target, GrantTarget::ClusterNodes)
    }

    /// Whether connections follow a Sentinel-managed primary: the address
    /// changes with fred's reconnects, and a server found there must still
    /// be checked to be a primary (`script_socket/login.rs`).
    pub(crate) fn follows_primary(&self) -> bool {
        matches!(self.target, GrantTarget::Primary(_))
    }

    /// The address to connect to now. `None` behind Sentinel before fred
    /// has reached a primary, and on a cluster.
    pub(crate) fn address(&self) -> Option<String> {
        match &self.target {
            GrantTarget::Fixed(address) => Some(address.clone()),
            GrantTarget::ClusterNodes => None,
            GrantTarget::Primary(follow) => {
                follow_latest(follow, |latest| latest.map(str::to_owned))
            }
        }
    }

    /// Whether a connection opened to `address` is still where
    /// [`GrantEndpoint::address`] leads: behind Sentinel, false once fred
    /// has announced a reconnect to another server (a fail-over); always
    /// true for a single server. Allocates nothing: the script sockets ask
    /// on every call.
    pub(crate) fn still_at(&self, address: &str) -> bool {
        match &self.target {
            GrantTarget::Primary(follow) => follow_latest(follow, |latest| latest == Some(address)),
            GrantTarget::Fixed(_) | GrantTarget::ClusterNodes => true,
        }
    }
}

/// `read` of the last server fred's reconnect announcements named, after
/// taking every announcement made since the last look.
fn follow_latest<T>(follow: &Mutex<FollowPrimary>, read: impl FnOnce(Option<&str>) -> T) -> T {
    let mut follow = follow.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        match follow.reconnects.try_recv() {
            Ok(server) => follow.latest = Some(address(&server)),
            // Missed announcements: the next ones are newer.
            Err(broadcast::error::TryRecvError::Lagged(_)) => {}
            Err(_) => break,
        }
    }
    read(follow.latest.as_deref())
}

#[cfg(test)]
mod tests {
    use fred::prelude::Server;

    use super::{address, GrantPlace};

    /// fairlock's own grant connection is opened for a single plain-TCP
    /// server at the address fred uses (an IPv6 host in brackets, which
    /// `to_socket_addrs` needs), for a Sentinel-managed primary and for the
    /// nodes of a cluster. A sentinel names an IPv6 primary without
    /// brackets.
    #[test]
    fn the_grant_connection_goes_where_fred_goes() {
        let place = |url: &str| {
            GrantPlace::of(
                &fred::prelude::Config::from_url(url).expect("valid URL"),
                None,
            )
        };
        let fixed = |address: &str| Some(GrantPlace::Fixed(address.to_owned()));
        assert_eq!(
            place("redis://user:pw@127.0.0.1:6380/2"),
            fixed("127.0.0.1:6380")
        );
        assert_eq!(place("redis://[::1]:6379"), fixed("[::1]:6379"));
        assert!("[::1]:6379".parse::<std::net::SocketAddr>().is_ok());
        assert_eq!(
            place("redis-sentinel://127.0.0.1:26379?sentinelServiceName=m"),
            Some(GrantPlace::SentinelPrimary)
        );
        assert_eq!(
            place("redis-cluster://127.0.0.1:7000"),
            Some(GrantPlace::ClusterNodes)
        );
        assert_eq!(address(&Server::new("::1", 6379)), "[::1]:6379");
        assert_eq!(address(&Server::new("10.0.0.2", 6379)), "10.0.0.2:6379");
    }

    /// With TLS, every topology gets fairlock's own grant connections, with
    /// fred's TLS connector.
    #[cfg(feature = "tls")]
    #[test]
    fn tls_grant_connections_go_to_every_topology() {
        let place = |url: &str| {
            let config = fred::prelude::Config::from_url(url).expect("valid URL");
            let tls = super::grant_tls(&config);
            assert!(tls.is_some(), "{url}: TLS settings");
            GrantPlace::of(&config, tls.as_ref())
        };
        assert_eq!(
            place("rediss://127.0.0.1:6380"),
            Some(GrantPlace::Fixed("127.0.0.1:6380".to_owned()))
        );
        assert_eq!(
            place("rediss-sentinel://127.0.0.1:26379?sentinelServiceName=m"),
            Some(GrantPlace::SentinelPrimary)
        );
        assert_eq!(
            place("rediss-cluster://127.0.0.1:7000"),
            Some(GrantPlace::ClusterNodes)
        );
    }

    /// A TLS URL is refused with a clear error in a build without TLS, and
    /// taken with it; a plain URL is taken either way.
    #[test]
    fn a_tls_url_needs_the_tls_feature() {
        for url in [
            "rediss://127.0.0.1:6380",
            "REDISS-CLUSTER://127.0.0.1:7000",
            "rediss-sentinel://127.0.0.1:26379?sentinelServiceName=m",
            "valkeys://127.0.0.1:6380",
        ] {
            let checked = super::check_scheme(url, url);
            if cfg!(feature = "tls") {
                assert!(checked.is_ok(), "{url}: {checked:?}");
            } else {
                assert!(
                    matches!(&checked, Err(crate::Error::InvalidOptions(why)) if why.contains("`tls` feature")),
                    "{url}: {checked:?}"
                );
            }
        }
        for url in [
            "redis://127.0.0.1:6379",
            "redis-cluster://h:1",
            "valkey://h:1",
            "Redis-Sentinel://h:1?sentinelServiceName=m",
        ] {
            assert!(super::check_scheme(url, url).is_ok(), "{url}");
        }
    }

    /// Schemes fred would read as a plain server are refused.
    #[test]
    fn a_scheme_that_is_not_redis_is_refused() {
        for url in [
            "http://h:1",
            "tcp://h:1",
            "redis+unix:///tmp/r.sock",
            "h:1",
            "reddis://h:1",
        ] {
            let checked = super::check_scheme(url, url);
            assert!(
                matches!(&checked, Err(crate::Error::InvalidOptions(why)) if why.contains("redis://host:port")),
                "{url}: {checked:?}"
            );
        }
    }
}
