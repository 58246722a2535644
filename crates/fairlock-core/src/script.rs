//! The Lua scripts, assembled from `scripts/` at compile time.
//!
//! Redis scripts cannot include each other, so each script is sent as the
//! shared helpers of `scripts/includes/common.lua` followed by its own body.

use std::sync::OnceLock;

/// One Lua script: its name, its full source, and its SHA1 for `EVALSHA`.
#[derive(Debug)]
pub struct Script {
    name: &'static str,
    source: &'static str,
    sha1: OnceLock<String>,
}

impl Script {
    const fn new(name: &'static str, source: &'static str) -> Self {
        Self {
            name,
            source,
            sha1: OnceLock::new(),
        }
    }

    /// The script's name, the file name without `.lua`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The full source sent by `SCRIPT LOAD`.
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// The lowercase hex SHA1 of [`Script::source`], as `EVALSHA` wants it.
    pub fn sha1(&self) -> &str {
        self.sha1
            .get_or_init(|| sha1_smol::Sha1::from(self.source).digest().to_string())
    }
}

macro_rules! script {
    ($name:literal) => {
        Script::new(
            $name,
            concat!(
                include_str!("../scripts/includes/common.lua"),
                "\n",
                include_str!(concat!("../scripts/", $name, ".lua"))
            ),
        )
    };
}

/// `acquire.lua`: take a free lock or join the queue.
pub static ACQUIRE: Script = script!("acquire");
/// `release.lua`: free the lock and hand it to the next live waiter.
pub static RELEASE: Script = script!("release");
/// `renew.lua`: set the owner's lease.
pub static RENEW: Script = script!("renew");
/// `heartbeat.lua`: keep one process's waiters on one lock alive.
pub static HEARTBEAT: Script = script!("heartbeat");
/// `cancel.lua`: leave the queue, passing on a grant that raced the cancel.
pub static CANCEL: Script = script!("cancel");
/// `force_release.lua`: admin release, whoever holds the lock.
pub static FORCE_RELEASE: Script = script!("force_release");
/// `inspect.lua`: read-only snapshot of a lock.
pub static INSPECT: Script = script!("inspect");

/// Every script, for preloading with `SCRIPT LOAD`.
pub static ALL_SCRIPTS: [&Script; 7] = [
    &ACQUIRE,
    &RELEASE,
    &RENEW,
    &HEARTBEAT,
    &CANCEL,
    &FORCE_RELEASE,
    &INSPECT,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_has_a_header_and_a_distinct_sha() {
        let mut shas = std::collections::HashSet::new();
        for script in ALL_SCRIPTS {
            assert!(
                script
                    .source()
                    .contains(&format!("-- {}.lua:", script.name())),
                "{} lacks its header",
                script.name()
            );
            assert_eq!(script.sha1().len(), 40);
            assert!(shas.insert(script.sha1().to_owned()));
        }
    }
}
