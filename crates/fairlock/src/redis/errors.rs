//! fred's errors in fairlock's terms, and URLs without their passwords
//! for the messages that name them.

use std::time::Duration;

use fred::prelude::{Error as FredError, ErrorKind};

use crate::error::Error;

/// `reason`, with what to do when it is a server certificate this process
/// does not trust (a private certificate authority, as self-hosted TLS
/// setups use).
pub(super) fn with_certificate_hint(reason: &str) -> String {
    if reason.contains("UnknownIssuer") || reason.contains("InvalidCertificate") {
        format!(
            "{reason} (the server's TLS certificate is not trusted: add its certificate \
             authority to the system's store, or name its PEM file in SSL_CERT_FILE)"
        )
    } else {
        reason.to_owned()
    }
}

/// Turns a Redis error into fairlock's: each refusal a server can give
/// a lock call (a read-only replica, out of memory, a busy script, a
/// missing ACL permission, a foreign key type) gets its own variant with
/// advice, recognised by the error code Redis puts first, also when the
/// error was raised inside a script. Any other error raised inside a
/// script is [`Error::ScriptFailed`], never a generic [`Error::Redis`].
pub(super) fn classify(error: &FredError, operation: &str, timeout: Duration) -> Error {
    let details = error.details();
    let code = details.split_whitespace().next().unwrap_or_default();
    match code {
        "WRONGTYPE" => return Error::WrongType(details.to_owned()),
        "READONLY" => return Error::ReadOnly(details.to_owned()),
        "OOM" => return Error::OutOfMemory(details.to_owned()),
        "BUSY" => return Error::Busy(details.to_owned()),
        "NOPERM" => return Error::NoPermission(details.to_owned()),
        _ => {}
    }
    // Redis 7 appends "script: <sha>, on @user_script:<line>." to errors
    // raised inside a script; Redis 6 says "Error running script".
    if details.contains("@user_script") || details.contains("Error running script") {
        return Error::ScriptFailed {
            script: operation.to_owned(),
            detail: details.to_owned(),
        };
    }
    match error.kind() {
        ErrorKind::Timeout => Error::Timeout {
            operation: operation.to_owned(),
            timeout,
        },
        ErrorKind::Canceled => Error::Closed,
        _ => redis_error(operation, error.clone()),
    }
}

pub(super) fn redis_error(operation: &str, source: FredError) -> Error {
    Error::Redis {
        operation: operation.to_owned(),
        source,
    }
}

/// The URL without its passwords, for error messages and `Debug`: the
/// user info's and a `sentinelPassword` query parameter's.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|at| at + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    // The user info ends at the last `@` before the query (a password may
    // hold a `/`; a query value may hold an `@`).
    let query_at = rest.find('?').unwrap_or(rest.len());
    let mut redacted = String::with_capacity(url.len());
    redacted.push_str(&url[..scheme_end]);
    let host_from = match rest[..query_at].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            redacted.push_str(user);
            redacted.push_str(":***");
            at
        }
        None => 0,
    };
    redacted.push_str(&rest[host_from..query_at]);
    if let Some(query) = rest[query_at..].strip_prefix('?') {
        redacted.push('?');
        for (index, pair) in query.split('&').enumerate() {
            if index > 0 {
                redacted.push('&');
            }
            match pair.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("sentinelPassword") => {
                    redacted.push_str(key);
                    redacted.push_str("=***");
                }
                _ => redacted.push_str(pair),
            }
        }
    }
    redacted
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sentinel_password_in_the_query_is_redacted() {
        assert_eq!(
            super::redact(
                "redis-sentinel://:pw@h:1?sentinelServiceName=m&sentinelPassword=spw&node=h:2"
            ),
            "redis-sentinel://:***@h:1?sentinelServiceName=m&sentinelPassword=***&node=h:2"
        );
        assert_eq!(
            super::redact("redis-sentinel://h:1?sentinelPassword=s@w&sentinelServiceName=m"),
            "redis-sentinel://h:1?sentinelPassword=***&sentinelServiceName=m"
        );
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            super::redact("redis://u:secret@h:1/0"),
            "redis://u:***@h:1/0"
        );
        assert_eq!(
            super::redact("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }
}
