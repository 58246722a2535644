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
///
/// Values and fields are bytes, so binary values pass unchanged; the
/// constructors take anything that is bytes (`&str`, `String`, `&[u8]`,
/// `Vec<u8>`, byte literals):
///
/// ```
/// use fairlock_core::FencedOp;
/// assert_eq!(FencedOp::set("order-7"), FencedOp::Set(b"order-7"));
/// assert_eq!(FencedOp::hset("f", b"\xff\x00"), FencedOp::HSet(b"f", &[0xff, 0]));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedOp<'a> {
    /// `SET target value`.
    Set(&'a [u8]),
    /// `HSET target field value`.
    HSet(&'a [u8], &'a [u8]),
    /// `INCRBY target delta`. Not idempotent: if the connection drops
    /// and the Redis client resends it, it is applied twice. Prefer `Set`
    /// of a value computed under the lock when exactly-once matters.
    IncrBy(i64),
    /// `GET target`.
    Get,
    /// `HGET target field`.
    HGet(&'a [u8]),
}

impl<'a> FencedOp<'a> {
    /// `SET target value`.
    pub fn set<V: AsRef<[u8]> + ?Sized>(value: &'a V) -> Self {
        Self::Set(value.as_ref())
    }

    /// `HSET target field value`.
    pub fn hset<F, V>(field: &'a F, value: &'a V) -> Self
    where
        F: AsRef<[u8]> + ?Sized,
        V: AsRef<[u8]> + ?Sized,
    {
        Self::HSet(field.as_ref(), value.as_ref())
    }

    /// `HGET target field`.
    pub fn hget<F: AsRef<[u8]> + ?Sized>(field: &'a F) -> Self {
        Self::HGet(field.as_ref())
    }
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

    /// ARGV, in the order of the script's header, as bytes: values are
    /// passed to Redis unchanged.
    pub fn args(&self) -> Vec<Vec<u8>> {
        let mut args = vec![
            self.token.to_string().into_bytes(),
            self.holder.as_bytes().to_vec(),
        ];
        match self.op {
            FencedOp::Set(value) => args.extend([b"set".to_vec(), value.to_vec()]),
            FencedOp::HSet(field, value) => {
                args.extend([b"hset".to_vec(), field.to_vec(), value.to_vec()])
            }
            FencedOp::IncrBy(delta) => {
                args.extend([b"incrby".to_vec(), delta.to_string().into_bytes()])
            }
            FencedOp::Get => args.push(b"get".to_vec()),
            FencedOp::HGet(field) => args.extend([b"hget".to_vec(), field.to_vec()]),
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
/// token and the holder id in front of them and checks them before the body
/// runs. Whatever the body returns becomes [`FencedReply::Applied`]; the
/// token is recorded after the body has returned, so a body that raises an
/// error leaves the fence as it was (but what it wrote before the error
/// stays: Redis does not roll a script back).
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
            "{}\nlocal refused, fence_record = fence_check()\nif refused then return refused end\n\
             local KEYS = {{unpack(KEYS, 2)}}\nlocal ARGV = {{unpack(ARGV, 3)}}\n\
             local result = (function()\n{}\nend)()\nfence_record()\nreturn {{1, result}}\n",
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
            op: FencedOp::hset("f", b"v\xff"),
        };
        assert_eq!(
            write.args(),
            [&b"9"[..], b"h", b"hset", b"f", b"v\xff"].map(<[u8]>::to_vec)
        );
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
