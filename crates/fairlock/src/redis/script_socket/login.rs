//! Opening a script socket: the TCP (and TLS) connection, then the login
//! the URL asks for, answered before the socket takes a call.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::pipe::BUFFER;
use super::SocketTarget;
use crate::grant_stream::GrantStream;
use crate::resp2;

/// Opens the connection: TCP (and TLS), then `AUTH` and `SELECT` as the
/// URL asks (or a `PING`), in one write, and reads their answers.
pub(super) async fn open(target: &SocketTarget<'_>) -> Result<(GrantStream, Vec<u8>), String> {
    let endpoint = target.endpoint;
    let address = endpoint
        .address()
        .ok_or_else(|| "no server address".to_owned())?;
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
    if answers == 0 {
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
            Some((Ok(_), used)) => {
                buf.drain(..used);
                answers -= 1;
            }
            Some((Err(error), _)) => return Err(format!("Redis refused the login: {error}")),
            None => {
                if stream.read_buf(&mut buf).await.map_err(io)? == 0 {
                    return Err("Redis closed the connection".to_owned());
                }
            }
        }
    }
    Ok((stream, buf))
}
