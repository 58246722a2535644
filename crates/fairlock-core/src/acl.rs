//! Asking Redis whether the calling user may publish grants
//! (`publish_check.lua`).
//!
//! Channel rules in an ACL apply to `SUBSCRIBE` and `PUBLISH` alike, but a
//! user may be given one command and not the other (`-publish`). A user
//! that can subscribe to its grants but not publish them would connect,
//! and every grant its releases hand to another process would go unheard
//! (Redis refuses the message; `includes/publish.lua` takes that as a
//! message nobody received, so the script still ends well), waiting for
//! that process's next heartbeat. The client asks this at connect and
//! refuses such a user there.

use crate::calls::ScriptCall;
use crate::reply::{ProtocolError, Reply};
use crate::script::Script;

/// `publish_check.lua`: whether the user may publish on a grant channel.
pub static PUBLISH_CHECK: Script = Script::new(
    "publish_check",
    include_str!("../scripts/publish_check.lua"),
);

/// The publish command a grant goes out with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishCommand {
    /// `PUBLISH`, on a single server (and behind Sentinel).
    Publish,
    /// `SPUBLISH`, sharded pub/sub on a cluster.
    Spublish,
}

/// Whether the calling user may run `command` on `channel`: the reply is
/// `true` if its ACL allows it. Read-only; needs Redis 7.0 or Valkey
/// (`redis.acl_check_cmd`); an older server answers the call with an error.
#[derive(Debug, Clone, Copy)]
pub struct PublishCheck<'a> {
    /// How grants are published.
    pub command: PublishCommand,
    /// A grant channel of another process.
    pub channel: &'a str,
}

impl ScriptCall for PublishCheck<'_> {
    const SCRIPT: &'static Script = &PUBLISH_CHECK;
    type Output = bool;

    fn args(&self) -> Vec<String> {
        let command = match self.command {
            PublishCommand::Publish => "PUBLISH",
            PublishCommand::Spublish => "SPUBLISH",
        };
        vec![command.to_owned(), self.channel.to_owned()]
    }

    fn decode(reply: Reply) -> Result<bool, ProtocolError> {
        match reply {
            Reply::Int(1) => Ok(true),
            Reply::Int(0) => Ok(false),
            other => Err(ProtocolError {
                script: PUBLISH_CHECK.name(),
                detail: format!("expected 0 or 1, got {other:?}"),
            }),
        }
    }
}
