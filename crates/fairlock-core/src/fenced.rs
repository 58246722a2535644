//! Fenced writes: protecting a resource that lives in Redis with the
//! lock's fencing tokens.
//!
//! The resource keeps, in its own fence key, the newest token that wrote to
//! it. A write carrying an older token is refused atomically in the same
//! script, so a holder that was paused past its lease cannot overwrite the
//! work of the holder after it. Put the fence key and the written keys
//! under one hash tag (e.g. `{stock:42}:fence`, `{stock:42}:count`) so the
//! script can run on Redis Cluster.

use crate::reply::{Fields, ProtocolError, Reply};
use crate::script::{ScriptSource, FENCED_WRITE};

/// One operation on a resource key.
///
/// Fence the reads that decide a write, too: a fenced read records the
/// token, so a holder whose lease ran out cannot write after a newer holder
/// has read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedOp<'a> {
    /// `SET target value`.
    Set(&'a str),
    /// `HSET target field value`.
    HSet(&'a str, &'a str),
    /// `INCRBY target delta`. Not idempotent: if the connection drops
    /// and the Redis client resends it, it is applied twice. Prefer `Set`
    /// of a value computed under the lock when exactly-once matters.
    IncrBy(i64),
    /// `GET target`.
    Get,
    /// `HGET target field`.
    HGet(&'a str),
}

/// `fenced_write.lua`: KEYS are the resource's fence key and the target.
#[derive(Debug, Clone, Copy)]
pub struct FencedWrite<'a> {
    /// The writer's fencing token.
    pub token: u64,
    /// The writer's owner id: an equal token is accepted only from it.
    pub holder: &'a str,
    /// The write.
    pub op: FencedOp<'a>,
}

/// What a fenced write answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FencedReply {
    /// The write was applied; the write command's reply.
    Applied(Reply),
    /// Refused: a newer token has written to the resource. Nothing changed.
    Stale {
        /// The newest token the resource has seen.
        newest: u64,
    },
}

impl FencedWrite<'_> {
    /// The script it runs.
    pub fn script() -> ScriptSource<'static> {
        FENCED_WRITE.as_source()
    }

    /// ARGV, in the order of the script's header.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![self.token.to_string(), self.holder.to_owned()];
        match self.op {
            FencedOp::Set(value) => args.extend(["set".to_owned(), value.to_owned()]),
            FencedOp::HSet(field, value) => {
                args.extend(["hset".to_owned(), field.to_owned(), value.to_owned()])
            }
            FencedOp::IncrBy(delta) => args.extend(["incrby".to_owned(), delta.to_string()]),
            FencedOp::Get => args.push("get".to_owned()),
            FencedOp::HGet(field) => args.extend(["hget".to_owned(), field.to_owned()]),
        }
        args
    }
}

/// Reads the reply of a fenced write or fenced script.
pub fn decode_fenced(name: &'static str, reply: Reply) -> Result<FencedReply, ProtocolError> {
    let mut f = Fields::new(name, reply)?;
    match f.int()? {
        1 => Ok(FencedReply::Applied(f.next().unwrap_or(Reply::Nil))),
        0 => Ok(FencedReply::Stale { newest: f.uint()? }),
        other => Err(f.unknown_status(other)),
    }
}

/// A user-supplied Lua script run only with a fresh enough token.
///
/// The body is ordinary Redis Lua: it sees its own keys as `KEYS[1..]` and
/// its own arguments as `ARGV[1..]`; fairlock passes the fence key, the
/// token and the holder id in front of them and checks them before the body runs. Whatever
/// the body returns becomes [`FencedReply::Applied`].
///
/// ```
/// let script = fairlock_core::FencedScript::new(
///     "redis.call('HSET', KEYS[1], 'state', ARGV[1]); return redis.call('INCR', KEYS[2])",
/// );
/// assert_eq!(script.sha1().len(), 40);
/// ```
#[derive(Debug, Clone)]
pub struct FencedScript {
    source: String,
    sha1: String,
}

impl FencedScript {
    /// Wraps `body` with the fence check.
    pub fn new(body: &str) -> Self {
        let source = format!(
            "{}\nlocal refused = fence_check()\nif refused then return refused end\n\
             local KEYS = {{unpack(KEYS, 2)}}\nlocal ARGV = {{unpack(ARGV, 3)}}\n\
             return {{1, (function()\n{}\nend)()}}\n",
            include_str!("../scripts/includes/fence_check.lua"),
            body
        );
        let sha1 = sha1_smol::Sha1::from(&source).digest().to_string();
        Self { source, sha1 }
    }

    /// The parts needed to run it.
    pub fn as_source(&self) -> ScriptSource<'_> {
        ScriptSource {
            name: "fenced user script",
            source: &self.source,
            sha1: &self.sha1,
        }
    }

    /// The SHA1 of the wrapped script.
    pub fn sha1(&self) -> &str {
        &self.sha1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_args_and_replies() {
        let write = FencedWrite {
            token: 9,
            holder: "h",
            op: FencedOp::HSet("f", "v"),
        };
        assert_eq!(write.args(), ["9", "h", "hset", "f", "v"]);
        assert_eq!(
            decode_fenced("t", Reply::Array(vec![Reply::Int(0), Reply::Int(12)])),
            Ok(FencedReply::Stale { newest: 12 })
        );
        assert_eq!(
            decode_fenced(
                "t",
                Reply::Array(vec![Reply::Int(1), Reply::Str("OK".into())])
            ),
            Ok(FencedReply::Applied(Reply::Str("OK".into())))
        );
    }
}
