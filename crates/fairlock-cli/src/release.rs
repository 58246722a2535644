//! `fairlock release --force NAME [--holder ID]`: the administrator's way
//! out of a stuck lock.
//!
//! Both forms free exactly one grant, so running the command twice (or a
//! resend by the client) never frees the next holder: without `--holder`
//! the client reads the holder and frees that grant; with it, only that
//! holder is freed, and a lock held by someone else by now is refused
//! (exit code 3). A lock that is already free is success either way: the
//! command is idempotent.

use fairlock::LockClient;
use serde::Serialize;

use crate::exit::{Failure, HOLDER_CHANGED};
use crate::name::{hex_if_binary, quoted, shown};
use crate::output::emit;

#[derive(Serialize)]
struct ReleaseReport<'a> {
    /// The lock name if UTF-8, else escaped as `b"..."` (see
    /// [`crate::name`]).
    name: String,
    /// The exact bytes of a name that is not UTF-8, as hex.
    name_hex: Option<String>,
    /// Whether a holder was evicted by this call.
    released: bool,
    /// The holder the caller asked for, if any.
    expected_holder: Option<&'a str>,
    /// The holder after the call (the next waiter if the lock was handed on).
    holder_now: Option<String>,
}

/// Force-releases `name`, from `holder` only if given.
pub async fn release(
    client: &LockClient,
    name: &[u8],
    holder: Option<&str>,
    json: bool,
) -> Result<(), Failure> {
    let released = match holder {
        Some(holder) => match expand_nonce(client, name, holder).await? {
            Some(expected) => client.force_release_from(name, &expected).await?,
            // A bare nonce of nobody holding the lock now: nothing to free.
            None => false,
        },
        None => client.force_release(name).await?,
    };
    let holder_now = client.inspect(name).await?.owner;
    // In messages: `"orders:42"` as before, or `b"job\xff"`.
    let quoted = quoted(name);
    let report = ReleaseReport {
        name: shown(name),
        name_hex: hex_if_binary(name),
        released,
        expected_holder: holder,
        holder_now,
    };
    emit(json, &report, || {
        let now = match &report.holder_now {
            Some(now) => format!("holder now {now}"),
            None => "it is free now".to_owned(),
        };
        match (released, holder) {
            (true, _) => format!("released {quoted}; {now}\n"),
            (false, None) => format!("{quoted} was free: nothing to release\n"),
            (false, Some(_)) if report.holder_now.is_none() => {
                format!("{quoted} was free: nothing to release (already released)\n")
            }
            (false, Some(holder)) => {
                format!("not released: {quoted} is not held by {holder}; {now}\n")
            }
        }
    })?;
    match (released, holder, &report.holder_now) {
        (false, Some(holder), Some(now)) => Err(Failure::new(
            HOLDER_CHANGED,
            format!(
                "refused: {quoted} is held by {now}, not by {holder}; nothing was changed (inspect it again and retry with the current holder)"
            ),
        )),
        _ => Ok(()),
    }
}

/// `--holder` as the script takes it. A bare nonce (32 hex digits, as
/// `inspect` shows under `nonce`) is expanded to the exact grant it
/// names now, `<owner id> <token>`, or `None` if it is not the holder's
/// now; an owner id, or an owner id and token, is passed as given. Either
/// way only that grant can be freed.
async fn expand_nonce(
    client: &LockClient,
    name: &[u8],
    holder: &str,
) -> Result<Option<String>, Failure> {
    if holder.contains(['.', ' ']) {
        return Ok(Some(holder.to_owned()));
    }
    let state = client.inspect(name).await?;
    Ok(match state.owner {
        Some(owner_id) if owner_id.split('.').next() == Some(holder) => {
            Some(format!("{owner_id} {}", state.token))
        }
        _ => None,
    })
}
