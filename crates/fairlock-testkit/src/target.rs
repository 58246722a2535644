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

    /// The URL to print: [`url`](Self::url) with any password replaced by
    /// `***`.
    pub fn shown_url(&self) -> String {
        redacted(&self.url())
    }

    /// One line for a program's output saying which Redis it uses (no
    /// password shown).
    pub fn describe(&self) -> String {
        match self {
            RedisTarget::Local(server) => format!(
                "redis: throwaway redis-server on 127.0.0.1:{} (set REDIS_URL to use your own)",
                server.port()
            ),
            RedisTarget::External(url) => format!("redis: {} (from REDIS_URL)", redacted(url)),
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

/// `url` with the password of its user info and the value of every query
/// parameter whose name mentions a password replaced by `***`: a program's
/// output (or a CI log) must not show them.
fn redacted(url: &str) -> String {
    // The user info ends at the last '@': a password may hold '/', '?' or
    // '@' unencoded (a malformed URL is still printed before it fails).
    let with_user_hidden = match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
                None => url.to_owned(),
            },
            None => url.to_owned(),
        },
        None => url.to_owned(),
    };
    match with_user_hidden.split_once('?') {
        Some((base, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((key, _)) if key.to_ascii_lowercase().contains("password") => {
                        format!("{key}=***")
                    }
                    _ => param.to_owned(),
                })
                .collect();
            format!("{base}?{}", params.join("&"))
        }
        None => with_user_hidden,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cmd_at, Resp};

    #[test]
    fn the_description_never_shows_a_password() {
        for (url, shown) in [
            ("redis://:s3cret@127.0.0.1:6379", "redis://:***@127.0.0.1:6379"),
            ("rediss://app:s3cret@h:6380/0", "rediss://app:***@h:6380/0"),
            ("redis://app@h:6379", "redis://app@h:6379"),
            ("redis://h:6379/0", "redis://h:6379/0"),
            // Malformed (unencoded '/' or '?' in the password): printed
            // before the connect fails, so redacted all the same.
            ("redis://:ab/cd@h:6379", "redis://:***@h:6379"),
            ("redis://u:ab?cd@h", "redis://u:***@h"),
            ("redis://u:a@b:c@h:1/0", "redis://u:***@h:1/0"),
            (
                "redis-sentinel://h:26379?sentinelServiceName=m&sentinelPassword=s3cret&node=h2:26379",
                "redis-sentinel://h:26379?sentinelServiceName=m&sentinelPassword=***&node=h2:26379",
            ),
        ] {
            let target = RedisTarget::External(url.to_owned());
            assert_eq!(target.describe(), format!("redis: {shown} (from REDIS_URL)"));
            assert_eq!(target.shown_url(), shown);
            assert_eq!(target.url(), url, "only what is shown is redacted");
        }
    }

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
