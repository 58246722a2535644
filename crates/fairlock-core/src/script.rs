//! The Lua scripts, assembled from `scripts/` at compile time.
//!
//! Redis scripts cannot include each other, so each script is sent as the
//! shared helpers of `scripts/includes/common.lua` followed by its own body;
//! acquire and release put their fast path (`scripts/fast_paths/`, with the
//! one helper it uses, `fast_paths/draw.lua`) first.

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

/// A script assembled from files under `scripts/`, joined by newlines in
/// the order given: the includes its body uses first, then the body. Lock
/// and permit scripts start with `includes/key_family.lua` (each refuses
/// the other family's keys first) and `includes/publish.lua` (the one way
/// they send a message), then `includes/releases.lua` (a lock's record of
/// its last releases, which `common.lua` writes) and `includes/common.lua`;
/// acquire and release put their fast path (`fast_paths/draw.lua`, then
/// `fast_paths/<name>.lua`) before `common.lua`, so that it answers the
/// common cases before the shared helpers are defined (Redis defines them
/// again on every call); release's writes the record, so `releases.lua`
/// comes before it.
macro_rules! assembled {
    ($name:literal: $first:literal $(, $rest:literal)*) => {
        Script::new(
            $name,
            concat!(
                include_str!(concat!("../scripts/", $first))
                $(, "\n", include_str!(concat!("../scripts/", $rest)))*
            ),
        )
    };
}
pub(crate) use assembled;

/// `acquire.lua`: take a free lock or join the queue.
pub static ACQUIRE: Script = assembled!("acquire": "includes/key_family.lua", "includes/publish.lua", "fast_paths/draw.lua", "fast_paths/acquire.lua", "includes/releases.lua", "includes/common.lua", "acquire.lua");
/// `release.lua`: free the lock and hand it to the next live waiter.
pub static RELEASE: Script = assembled!("release": "includes/key_family.lua", "includes/publish.lua", "fast_paths/draw.lua", "includes/releases.lua", "fast_paths/release.lua", "includes/common.lua", "release.lua");
/// `renew.lua`: set the owner's lease.
pub static RENEW: Script = assembled!("renew": "includes/key_family.lua", "includes/publish.lua", "includes/releases.lua", "includes/common.lua", "renew.lua");
/// `heartbeat.lua`: keep one process's waiters alive on a batch of locks.
pub static HEARTBEAT: Script = assembled!("heartbeat": "includes/key_family.lua", "includes/publish.lua", "includes/releases.lua", "includes/common.lua", "heartbeat.lua");
/// `cancel.lua`: leave the queue, passing on a grant that raced the cancel.
pub static CANCEL: Script = assembled!("cancel": "includes/key_family.lua", "includes/publish.lua", "includes/releases.lua", "includes/common.lua", "cancel.lua");
/// `force_release.lua`: admin release, whoever holds the lock.
pub static FORCE_RELEASE: Script = assembled!("force_release": "includes/key_family.lua", "includes/publish.lua", "includes/releases.lua", "includes/common.lua", "force_release.lua");
/// `inspect.lua`: read-only snapshot of a lock.
pub static INSPECT: Script = assembled!("inspect": "includes/key_family.lua", "includes/publish.lua", "includes/releases.lua", "includes/common.lua", "inspect.lua");

/// A permit script: key_family.lua, publish.lua, releases.lua, common.lua,
/// then includes/permits.lua, then its body.
macro_rules! permit_script {
    ($name:literal, $body:literal) => {
        assembled!($name: "includes/key_family.lua", "includes/publish.lua", "includes/releases.lua", "includes/common.lua", "includes/permits.lua", $body)
    };
}

/// `permit_acquire.lua`: take a permit or join the permit set's queue.
pub static PERMIT_ACQUIRE: Script = permit_script!("permit_acquire", "permit_acquire.lua");
/// `permit_release.lua`: give a permit back and grant the waiters that fit.
pub static PERMIT_RELEASE: Script = permit_script!("permit_release", "permit_release.lua");
/// `permit_cancel.lua`: leave a permit queue, giving back a raced grant.
pub static PERMIT_CANCEL: Script = permit_script!("permit_cancel", "permit_cancel.lua");
/// `permit_heartbeat.lua`: keep one process's waiters on a permit set alive.
pub static PERMIT_HEARTBEAT: Script = permit_script!("permit_heartbeat", "permit_heartbeat.lua");
/// `permit_renew.lua`: renew or check permits of several sets.
pub static PERMIT_RENEW: Script = permit_script!("permit_renew", "permit_renew.lua");

/// Every permit script (semaphore and read-write lock), for preloading.
pub static PERMIT_SCRIPTS: [&Script; 5] = [
    &PERMIT_ACQUIRE,
    &PERMIT_RELEASE,
    &PERMIT_CANCEL,
    &PERMIT_HEARTBEAT,
    &PERMIT_RENEW,
];

/// `fenced_write.lua`: a write applied only with a fresh enough token.
pub static FENCED_WRITE: Script =
    assembled!("fenced_write": "includes/fence_check.lua", "fenced_write.lua");

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
