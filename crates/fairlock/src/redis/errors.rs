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

/// The URL without its password, for error messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{}:***{}", &url[..scheme + 3], user, &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
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
