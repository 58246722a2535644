//! The Lua scripts, assembled from `scripts/` at compile time.
//!
//! Redis scripts cannot include each other, so each script is sent as the
//! shared helpers of `scripts/includes/common.lua` followed by its own body;
//! acquire and release put their fast path (`scripts/fast_paths/`) first.

use std::sync::OnceLock;

/// One Lua script: its name, its full source, and its SHA1 for `EVALSHA`.
#[derive(Debug)]
pub struct Script {
    name: &'static str,
    source: &'static str,
    sha1: OnceLock<String>,
}

impl Script {
    pub(crate) const fn new(name: &'static str, source: &'static str) -> Self {
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

/// Borrowed parts of a script, static or built at run time.
#[derive(Debug, Clone, Copy)]
pub struct ScriptSource<'a> {
    /// A name for error messages.
    pub name: &'a str,
    /// The full source.
    pub source: &'a str,
    /// Its lowercase hex SHA1.
    pub sha1: &'a str,
}

impl Script {
    /// The parts needed to run it.
    pub fn as_source(&self) -> ScriptSource<'_> {
        ScriptSource {
            name: self.name,
            source: self.source,
            sha1: self.sha1(),
        }
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

/// A script with a fast path: `fast_paths/<name>.lua` (which answers the
/// common case before the shared helpers are defined, since Redis defines
/// them again on every call), then common.lua, then its body.
macro_rules! script_with_fast_path {
    ($name:literal) => {
        Script::new(
            $name,
            concat!(
                include_str!(concat!("../scripts/fast_paths/", $name, ".lua")),
                "\n",
                include_str!("../scripts/includes/common.lua"),
                "\n",
                include_str!(concat!("../scripts/", $name, ".lua"))
            ),
        )
    };
}

/// `acquire.lua`: take a free lock or join the queue.
pub static ACQUIRE: Script = script_with_fast_path!("acquire");
/// `release.lua`: free the lock and hand it to the next live waiter.
pub static RELEASE: Script = script_with_fast_path!("release");
/// `renew.lua`: set the owner's lease.
pub static RENEW: Script = script!("renew");
/// `heartbeat.lua`: keep one process's waiters alive on a batch of locks.
pub static HEARTBEAT: Script = script!("heartbeat");
/// `cancel.lua`: leave the queue, passing on a grant that raced the cancel.
pub static CANCEL: Script = script!("cancel");
/// `force_release.lua`: admin release, whoever holds the lock.
pub static FORCE_RELEASE: Script = script!("force_release");
/// `inspect.lua`: read-only snapshot of a lock.
pub static INSPECT: Script = script!("inspect");

/// A permit script: common.lua, then includes/permits.lua, then its body.
macro_rules! permit_script {
    ($name:literal) => {
        Script::new(
            $name,
            concat!(
                include_str!("../scripts/includes/common.lua"),
                "\n",
                include_str!("../scripts/includes/permits.lua"),
                "\n",
                include_str!(concat!("../scripts/", $name, ".lua"))
            ),
        )
    };
}

/// `permit_acquire.lua`: take a permit or join the permit set's queue.
pub static PERMIT_ACQUIRE: Script = permit_script!("permit_acquire");
/// `permit_release.lua`: give a permit back and grant the waiters that fit.
pub static PERMIT_RELEASE: Script = permit_script!("permit_release");
/// `permit_cancel.lua`: leave a permit queue, giving back a raced grant.
pub static PERMIT_CANCEL: Script = permit_script!("permit_cancel");
/// `permit_heartbeat.lua`: keep one process's waiters on a permit set alive.
pub static PERMIT_HEARTBEAT: Script = permit_script!("permit_heartbeat");
/// `permit_renew.lua`: renew or check permits of several sets.
pub static PERMIT_RENEW: Script = permit_script!("permit_renew");

/// Every permit script (semaphore and read-write lock), for preloading.
pub static PERMIT_SCRIPTS: [&Script; 5] = [
    &PERMIT_ACQUIRE,
    &PERMIT_RELEASE,
    &PERMIT_CANCEL,
    &PERMIT_HEARTBEAT,
    &PERMIT_RENEW,
];

/// `fenced_write.lua`: a write applied only with a fresh enough token.
pub static FENCED_WRITE: Script = Script::new(
    "fenced_write",
    concat!(
        include_str!("../scripts/includes/fence_check.lua"),
        "\n",
        include_str!("../scripts/fenced_write.lua")
    ),
);

/// Every script, for preloading with `SCRIPT LOAD`.
pub static ALL_SCRIPTS: [&Script; 8] = [
    &FENCED_WRITE,
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
        for script in ALL_SCRIPTS.iter().chain(&PERMIT_SCRIPTS) {
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
