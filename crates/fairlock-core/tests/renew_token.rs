//! A renewal item with a token holds only that grant: a waiter confirming
//! a grant it took (found by a heartbeat, or announced to nobody) must
//! learn that its owner id now holds a later grant, so that its guard
//! never carries an older token than the one Redis holds. Without a token
//! any grant of the owner id is held (the watchdog's renewals).

mod support;

use fairlock_core::{
    AcquireMode, KeyPrefix, LockKeys, LockName, OwnerId, PermitAcquire, PermitFamily,
    PermitOwnerId, PermitRenewBatch, PermitRenewItem, PermitRequest, RenewBatch, RenewItem,
    RenewStatus, Reply, ScriptCall, Timings,
};
use fairlock_testkit::RedisServer;

use support::{acquire_wait, load_scripts, run_script};

fn prefix() -> KeyPrefix {
    KeyPrefix::new("renew:").expect("prefix")
}

/// The token of a grant reply `{1, token}`.
fn granted(reply: Reply) -> u64 {
    match reply {
        Reply::Array(fields) => match fields.as_slice() {
            [Reply::Int(1), Reply::Int(token), ..] => u64::try_from(*token).expect("token"),
            other => panic!("not a grant: {other:?}"),
        },
        other => panic!("not a grant: {other:?}"),
    }
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cmd_ok(&["PTTL", key])
        .expect("PTTL")
        .as_int()
        .expect("an integer")
}

fn renew_lock(
    server: &RedisServer,
    keys: &LockKeys,
    owner_id: &str,
    token: Option<u64>,
) -> RenewStatus {
    let batch = RenewBatch {
        items: vec![RenewItem {
            owner_key: keys.owner(),
            owner_id,
            lease_ms: 90_000,
            token,
        }],
    };
    let reply =
        run_script(server, RenewBatch::script(), &[keys.owner()], &batch.args()).expect("renew");
    RenewBatch::decode(reply).expect("statuses")[0]
}

/// A server with the scripts loaded and lock `name` granted to an owner
/// id of process `tag` (16 hex digits): its keys, the owner id and the
/// grant's token.
fn a_held_lock(name: &str, tag: &str) -> (RedisServer, LockKeys, OwnerId, u64) {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let keys = LockKeys::new(&prefix(), &LockName::new(name).expect("name"));
    let owner = OwnerId::new(&tag.repeat(2), tag, 30_000);
    let token =
        granted(acquire_wait(&server, &keys, owner.as_str(), "renew:notify:").expect("acquire"));
    (server, keys, owner, token)
}

#[test]
fn a_lock_renewal_with_a_token_holds_only_that_grant() {
    let (server, keys, owner, token) = a_held_lock("tokened", "00000000000000ab");

    assert_eq!(
        renew_lock(&server, &keys, owner.as_str(), Some(token - 1)),
        RenewStatus::Lost,
        "an older grant of the same owner id is not the one held"
    );
    assert!(
        pttl(&server, keys.owner()) <= 30_000,
        "and its lease is not set"
    );
    assert_eq!(
        renew_lock(&server, &keys, owner.as_str(), Some(token)),
        RenewStatus::Held
    );
    assert!(pttl(&server, keys.owner()) > 30_000, "the lease is set");
    assert_eq!(
        renew_lock(&server, &keys, owner.as_str(), None),
        RenewStatus::Held,
        "without a token, any grant of the owner id"
    );
}

#[test]
fn a_permit_renewal_with_a_token_holds_only_that_grant() {
    let server = RedisServer::start().expect("redis-server");
    load_scripts(&server);
    let keys = LockKeys::permits(
        &prefix(),
        &LockName::new("tokened-permits").expect("name"),
        PermitFamily::Semaphore,
    );
    let owner = PermitOwnerId::new(
        &"cd".repeat(16),
        "00000000000000cd",
        30_000,
        PermitRequest::Shared(1),
    )
    .expect("owner id");
    let timings = Timings::default();
    let call = PermitAcquire {
        owner_id: owner.as_str(),
        mode: AcquireMode::Wait,
        timings: &timings,
        channel_prefix: "renew:notify:",
        rejoin: None,
    };
    let key_list: Vec<&str> = keys.all().iter().map(String::as_str).collect();
    let token = granted(
        run_script(&server, PermitAcquire::SCRIPT, &key_list, &call.args()).expect("acquire"),
    );
    let renew = |token: Option<u64>| {
        let batch = PermitRenewBatch {
            items: vec![PermitRenewItem {
                keys: &keys,
                owner_id: owner.as_str(),
                lease_ms: 90_000,
                token,
            }],
        };
        let reply = run_script(
            &server,
            PermitRenewBatch::script(),
            &batch.keys(),
            &batch.args(),
        )
        .expect("permit renew");
        PermitRenewBatch::decode(reply).expect("statuses")[0]
    };
    assert_eq!(renew(Some(token - 1)), RenewStatus::Lost);
    assert_eq!(renew(Some(token)), RenewStatus::Held);
    assert_eq!(renew(None), RenewStatus::Held);
}

/// A token longer than 18 digits (past 2^63, never issued) is refused
/// before any lease is set.
#[test]
fn a_renewal_token_past_18_digits_is_refused() {
    let (server, keys, owner, _) = a_held_lock("long-token", "00000000000000ef");
    let batch = RenewBatch {
        items: vec![RenewItem {
            owner_key: keys.owner(),
            owner_id: owner.as_str(),
            lease_ms: 90_000,
            token: Some(u64::MAX),
        }],
    };
    let refused = run_script(
        &server,
        RenewBatch::script(),
        &[keys.owner()],
        &batch.args(),
    );
    assert!(
        matches!(&refused, Err(message) if message.contains("token")),
        "refused: {refused:?}"
    );
    assert!(pttl(&server, keys.owner()) <= 30_000, "no lease set");
}
