//! Where examples and benchmarks connect: a server the user names with
//! `REDIS_URL`, or a throwaway one, so `cargo run --example` works on a
//! machine with nothing configured.

use crate::{RedisServer, TestkitError};

/// Where examples and benchmarks should connect: an external server given by
/// `REDIS_URL`, or a throwaway local [`RedisServer`].
#[derive(Debug)]
pub enum RedisTarget {
    /// An externally managed server (the value of `REDIS_URL`).
    External(String),
    /// A throwaway server started by this process; stopped when dropped.
    Local(RedisServer),
}

impl RedisTarget {
    /// Uses `REDIS_URL` if it is set and non-empty; otherwise starts a
    /// throwaway `redis-server` (keep the returned value alive while using it).
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`] when no `REDIS_URL` is set.
    pub fn from_env_or_start() -> Result<RedisTarget, TestkitError> {
        RedisTarget::from_url_or_start(std::env::var("REDIS_URL").ok())
    }

    fn from_url_or_start(url: Option<String>) -> Result<RedisTarget, TestkitError> {
        match url.filter(|u| !u.trim().is_empty()) {
            Some(url) => Ok(RedisTarget::External(url.trim().to_string())),
            None => Ok(RedisTarget::Local(RedisServer::start()?)),
        }
    }

    /// The URL to connect to.
    pub fn url(&self) -> String {
        match self {
            RedisTarget::External(url) => url.clone(),
            RedisTarget::Local(server) => server.url(),
        }
    }

    /// One line for a program's output saying which Redis it uses.
    pub fn describe(&self) -> String {
        match self {
            RedisTarget::Local(server) => format!(
                "redis: throwaway redis-server on 127.0.0.1:{} (set REDIS_URL to use your own)",
                server.port()
            ),
            RedisTarget::External(url) => format!("redis: {url} (from REDIS_URL)"),
        }
    }

    /// The local server, if one was started.
    pub fn local(&self) -> Option<&RedisServer> {
        match self {
            RedisTarget::External(_) => None,
            RedisTarget::Local(server) => Some(server),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cmd_at, Resp};

    #[test]
    fn target_external_or_local() {
        let ext = RedisTarget::from_url_or_start(Some("redis://example:6379".into())).unwrap();
        assert_eq!(ext.url(), "redis://example:6379");
        assert!(ext.local().is_none());
        for url in [None, Some(String::new()), Some("  ".into())] {
            let local = RedisTarget::from_url_or_start(url).unwrap();
            let server = local.local().unwrap();
            assert_eq!(local.url(), server.url());
            assert_eq!(
                cmd_at(&local.url(), &["PING"]).unwrap(),
                Resp::Simple("PONG".into())
            );
        }
    }
}
