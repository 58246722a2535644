//! Opening a script socket: the TCP (and TLS) connection, then the login
//! the URL asks for, answered before the socket takes a call; behind
//! Sentinel, a check that the server is the primary.

use fairlock_core::Reply;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::pipe::BUFFER;
use super::SocketTarget;
use crate::grant_stream::GrantStream;
use crate::resp2;

/// A connection opened and logged in: the stream, what was read past
/// the login's answers, and the address it went to.
pub(super) struct Opened {
    pub(super) stream: GrantStream,
    pub(super) buf: Vec<u8>,
    pub(super) address: String,
}

/// Opens the connection: TCP (and TLS), then `AUTH` and `SELECT` as the
/// URL asks (or a `PING`), in one write, and reads their answers.
///
/// Behind Sentinel a `ROLE` follows, and a server that does not answer
/// `master` is refused: the address is the one fred last reconnected to,
/// and right after a fail-over that can be the demoted primary, now a
/// replica, whose connections Sentinel closed a moment before fred
/// announced the new one. On a replica a script that writes is refused,
/// but one that only reads (a try-lock finding the lock held, a release
/// by a caller that no longer owns it) would answer from a copy that may
/// lag. fred checks its own connections the same way, so fairlock's user
/// behind Sentinel has `ROLE` already.
pub(super) async fn open(target: &SocketTarget<'_>) -> Result<Opened, String> {
    let endpoint = target.endpoint;
    let address = match target.node {
        Some(node) => node.to_owned(),
        None => endpoint
            .address()
            .ok_or_else(|| "no server address".to_owned())?,
    };
    let mut stream = GrantStream::connect(&address, endpoint.tls())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(BUFFER);
    let mut out = Vec::with_capacity(BUFFER);
    let mut answers = 0;
    match (&endpoint.username, &endpoint.password) {
        (Some(user), Some(password)) => {
            resp2::command(&mut out, &[b"AUTH", user.as_bytes(), password.as_bytes()]);
            answers += 1;
        }
        (None, Some(password)) => {
            resp2::command(&mut out, &[b"AUTH", password.as_bytes()]);
            answers += 1;
        }
        _ => {}
    }
    if let Some(database) = target.database.filter(|&db| db != 0) {
        resp2::command(&mut out, &[b"SELECT", database.to_string().as_bytes()]);
        answers += 1;
    }
    let check_role = endpoint.follows_primary();
    if check_role {
        resp2::command(&mut out, &[b"ROLE"]);
        answers += 1;
    } else if answers == 0 {
        // Answered before the socket takes a call: a server that refuses
        // the connection (at its `maxclients`, it writes an error and
        // closes) fails the connect, not the call.
        resp2::command(&mut out, &[b"PING"]);
        answers += 1;
    }
    let io = |e: std::io::Error| e.to_string();
    stream.write_all(&out).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    while answers > 0 {
        match resp2::reply(&buf).map_err(|m| m.0.to_owned())? {
            Some((Ok(answer), used)) => {
                buf.drain(..used);
                answers -= 1;
                // The last answer is the ROLE's, if asked.
                if check_role && answers == 0 {
                    role_is_primary(&answer)?;
                }
            }
            Some((Err(error), _)) => return Err(format!("Redis refused a login command: {error}")),
            None => {
                if stream.read_buf(&mut buf).await.map_err(io)? == 0 {
                    return Err("Redis closed the connection".to_owned());
                }
            }
        }
    }
    Ok(Opened {
        stream,
        buf,
        address,
    })
}

/// `Ok` if `ROLE` answered that the server is a primary.
fn role_is_primary(answer: &Reply) -> Result<(), String> {
    match answer {
        Reply::Array(fields) if matches!(fields.first(), Some(Reply::Str(role)) if role == "master") => {
            Ok(())
        }
        Reply::Array(fields) => Err(format!(
            "the server is not the primary (ROLE answered {:?}); fred has not yet reconnected to the new one",
            fields.first()
        )),
        other => Err(format!("ROLE answered {other:?}")),
    }
}
