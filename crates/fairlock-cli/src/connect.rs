//! Where the command line finds Redis, and the client it builds from the
//! global options. Every subcommand connects through here, so `--url`,
//! `$REDIS_URL`, TLS and ACL credentials work the same everywhere.

use fairlock::{ClientConfig, KeyPrefix, LockClient};

use crate::args::GlobalArgs;
use crate::exit::{Failure, FAILURE};

/// The URL used when neither `--url` nor `$REDIS_URL` is given.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// `--url`, else `$REDIS_URL`, else [`DEFAULT_URL`].
pub fn redis_url(global: &GlobalArgs) -> String {
    global
        .url
        .clone()
        .or_else(|| {
            std::env::var("REDIS_URL")
                .ok()
                .filter(|url| !url.is_empty())
        })
        .unwrap_or_else(|| DEFAULT_URL.to_owned())
}

/// The client configuration the global options describe.
pub fn client_config(global: &GlobalArgs) -> Result<ClientConfig, Failure> {
    let mut config = ClientConfig::new(redis_url(global));
    config.prefix = KeyPrefix::new(global.prefix.clone())
        .map_err(|e| Failure::new(FAILURE, format!("--prefix: {e}")))?;
    config.connect_timeout = global.timeout;
    config.command_timeout = global.timeout;
    Ok(config)
}

/// Connects a lock client; fails within `--timeout` if Redis does not answer.
pub async fn lock_client(global: &GlobalArgs) -> Result<LockClient, Failure> {
    Ok(LockClient::with_config(client_config(global)?).await?)
}
