//! Lock keys and fairlock scripts run straight on the server, for states a
//! well-behaved client never produces (a dead waiter, an expired holder).

use fairlock_core::{Acquire, AcquireMode, KeyPrefix, LockKeys, LockName, ScriptCall, Timings};
use fairlock_testkit::{RedisServer, Resp};

/// The five keys of lock `name` under the default prefix.
pub fn keys(name: &str) -> LockKeys {
    LockKeys::new(
        &KeyPrefix::default(),
        &LockName::new(name).expect("valid test lock name"),
    )
}

/// The keys of permit set `name` (a semaphore or a read-write lock).
pub fn permit_keys(name: &str, family: fairlock_core::PermitFamily) -> LockKeys {
    LockKeys::permits(
        &KeyPrefix::default(),
        &LockName::new(name).expect("valid test set name"),
        family,
    )
}

/// The cluster slot of lock `name`'s keys (default prefix).
pub fn lock_slot(name: &str) -> u16 {
    LockKeys::new(
        &KeyPrefix::default(),
        &LockName::new(name).expect("a valid lock name"),
    )
    .slot()
}

/// Runs a fairlock script with plain EVAL over the testkit's own admin
/// connection, bypassing the client: for crafting states like a waiter
/// that never heartbeats.
pub fn raw<C: ScriptCall>(server: &RedisServer, name: &str, call: &C) -> C::Output {
    raw_with_args::<C>(server, name, &call.args())
}

/// [`raw`] with the script's arguments given as they are, for arguments
/// the call type would never make (bad input the script must survive).
pub fn raw_with_args<C: ScriptCall>(
    server: &RedisServer,
    name: &str,
    args: &[String],
) -> C::Output {
    let keys = keys(name);
    let numkeys = keys.all().len().to_string();
    let mut cmd: Vec<&str> = vec!["EVAL", C::SCRIPT.source(), &numkeys];
    cmd.extend(keys.all().iter().map(String::as_str));
    cmd.extend(args.iter().map(String::as_str));
    let reply = server.cmd(&cmd).expect("raw script call");
    C::decode(to_reply(reply)).expect("raw script reply")
}

/// Converts the admin client's reply into a script reply.
pub fn to_reply(resp: Resp) -> fairlock_core::Reply {
    use fairlock_core::Reply;
    match resp {
        Resp::Int(i) => Reply::Int(i),
        Resp::Simple(s) => Reply::Str(s),
        Resp::Bulk(Some(b)) => Reply::from_bulk(b),
        Resp::Bulk(None) | Resp::Array(None) => Reply::Nil,
        Resp::Array(Some(items)) => Reply::Array(items.into_iter().map(to_reply).collect()),
        Resp::Error(e) => panic!("raw script failed: {e}"),
    }
}

/// An `acquire.lua` call of `owner_id` that waits in the queue, for tests
/// that run the scripts raw: its grants are published under
/// `test:nobody:`, where nobody listens unless the test does.
pub fn waiting_acquire<'a>(owner_id: &'a str, timings: &'a Timings) -> Acquire<'a> {
    Acquire {
        owner_id,
        mode: AcquireMode::Wait,
        timings,
        channel_prefix: "test:nobody:",
        rejoin: None,
    }
}
