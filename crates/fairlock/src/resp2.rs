//! The RESP2 frames fairlock's own connections write and read.
//!
//! The grant connection (see `grant_connection.rs`) only ever sends `AUTH`,
//! `SUBSCRIBE` and `PING`, and reads their answers and the messages of
//! its one channel. Frames are read in place from the connection's
//! buffer: a message hands out slices of it, so a grant costs no copy and
//! no allocation. The script socket (`script_socket/`) sends `EVALSHA`
//! and reads a script's whole reply ([`reply`]).

use std::io::Write;
use std::str;

use fairlock_core::Reply;

/// Refuse a frame announcing more than this (a bulk string or an array),
/// and one still incomplete after this many bytes: no answer or message
/// on fairlock's own connections comes near it (a grant message is a few
/// hundred bytes), so a larger one means the stream is not what it should
/// be. Without the second bound, a line that never ends, or an array of
/// millions of items, made the reader buffer without limit and parse the
/// frame again from its start after every read.
const MAX_FRAME: usize = 1024 * 1024;

/// What [`reply`] read: a script's reply (or its error's text) and how
/// many bytes it took; `Ok(None)` while incomplete.
type ReplyRead = Result<Option<(Result<Reply, String>, usize)>, Malformed>;

/// `Ok(None)` (incomplete) for a frame starting at the head of `buf`,
/// unless more than [`MAX_FRAME`] bytes of it are there already.
fn incomplete<T>(buf: &[u8]) -> Result<Option<T>, Malformed> {
    if buf.len() > MAX_FRAME {
        return Err(Malformed("a frame still incomplete after a mebibyte"));
    }
    Ok(None)
}

/// How deep arrays may nest (none of ours do).
const MAX_DEPTH: usize = 4;

/// One frame, borrowed from the buffer it was read from.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    /// `+...`: a simple string (`+OK` after `AUTH`).
    Simple(&'a [u8]),
    /// `-...`: an error, whole (`NOPERM ...`, `WRONGPASS ...`).
    Error(&'a [u8]),
    /// A pub/sub message: `["message", channel, payload]`, or a sharded
    /// one, `["smessage", channel, payload]`.
    Message {
        /// The channel it came on.
        channel: &'a [u8],
        /// What was published.
        payload: &'a [u8],
    },
    /// The confirmation of a `SUBSCRIBE` or `SSUBSCRIBE`:
    /// `["subscribe", channel, count]`, `["ssubscribe", channel, count]`.
    Subscribed(&'a [u8]),
    /// A sharded subscription the server ended: `["sunsubscribe", channel,
    /// count]` (on a cluster, when the channel's slot left the node).
    Unsubscribed(&'a [u8]),
    /// The answer to `HELLO 2`, a flat list of fields and values
    /// beginning with `"server"`: the server's `role` ("master" or
    /// "replica"), if it said.
    Hello {
        /// The value of the `role` field.
        role: Option<&'a [u8]>,
    },
    /// Any other frame (a PING's `["pong", ""]`, an integer, ...).
    Other,
}

/// A value inside a frame, when complete: its bytes (for a bulk string, a
/// simple string or an integer; `None` for a null or an array) and where
/// the next value begins. `Ok(None)` while incomplete.
type Value<'a> = Result<Option<(Option<&'a [u8]>, usize)>, Malformed>;

/// A stream that is not RESP2 as Redis writes it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) &'static str);

/// Reads the frame at the start of `buf`: `Ok(None)` if it is not complete
/// yet, or the frame and how many bytes it took.
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Frame<'_>, usize)>, Malformed> {
    match parse_started(buf)? {
        Some(frame) => Ok(Some(frame)),
        None => incomplete(buf),
    }
}

/// [`parse`] without the bound on an incomplete frame.
fn parse_started(buf: &[u8]) -> Result<Option<(Frame<'_>, usize)>, Malformed> {
    let Some((head, mut at)) = line(buf, 0) else {
        return Ok(None);
    };
    let (&kind, rest) = head.split_first().ok_or(Malformed("empty line"))?;
    let frame = match kind {
        b'+' => Frame::Simple(rest),
        b'-' => Frame::Error(rest),
        b':' => Frame::Other,
        b'$' => match bulk(buf, rest, at)? {
            Some((_, end)) => {
                at = end;
                Frame::Other
            }
            None => return Ok(None),
        },
        b'*' => {
            let count = length(rest)?;
            // The first three items, when they are bulk strings or integers,
            // and the item after a "role" (HELLO's answer).
            let mut items: [Option<&[u8]>; 3] = [None; 3];
            let (mut role, mut after_role) = (None, false);
            for slot in 0..count.unwrap_or(0) {
                let Some((item, end)) = value(buf, at, 1)? else {
                    return Ok(None);
                };
                if let Some(place) = items.get_mut(slot) {
                    *place = item;
                }
                if std::mem::replace(&mut after_role, item == Some(b"role")) {
                    role = item;
                }
                at = end;
            }
            match (count, items) {
                (Some(3), [Some(b"message" | b"smessage"), Some(channel), Some(payload)]) => {
                    Frame::Message { channel, payload }
                }
                (Some(3), [Some(b"subscribe" | b"ssubscribe"), Some(channel), Some(_)]) => {
                    Frame::Subscribed(channel)
                }
                (Some(3), [Some(b"sunsubscribe"), Some(channel), Some(_)]) => {
                    Frame::Unsubscribed(channel)
                }
                (Some(_), [Some(b"server"), ..]) => Frame::Hello { role },
                _ => Frame::Other,
            }
        }
        _ => return Err(Malformed("unknown frame type")),
    };
    Ok(Some((frame, at)))
}

/// The line starting at `at` (without its CRLF) and where the next begins.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], at + end + 2))
}

/// A length: `None` for `-1` (a null bulk string or array).
fn length(digits: &[u8]) -> Result<Option<usize>, Malformed> {
    if digits == b"-1" {
        return Ok(None);
    }
    let n: usize = str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or(Malformed("bad length"))?;
    if n > MAX_FRAME {
        return Err(Malformed("frame too large"));
    }
    Ok(Some(n))
}

/// A bulk string whose header was `$<digits>`, its data starting at `at`:
/// the data (`None` if null) and where the next frame begins, or `None`
/// while incomplete.
fn bulk<'a>(buf: &'a [u8], digits: &[u8], at: usize) -> Value<'a> {
    let Some(len) = length(digits)? else {
        return Ok(Some((None, at)));
    };
    let end = at + len;
    if buf.len() < end + 2 {
        return Ok(None);
    }
    if &buf[end..end + 2] != b"\r\n" {
        return Err(Malformed("bulk string without its CRLF"));
    }
    Ok(Some((Some(&buf[at..end]), end + 2)))
}

/// The value at `at` inside an array: its bytes if it is a bulk string, a
/// simple string or an integer, and where the next one begins; `None`
/// while incomplete.
fn value(buf: &[u8], at: usize, depth: usize) -> Value<'_> {
    let Some((head, next)) = line(buf, at) else {
        return Ok(None);
    };
    let (&kind, rest) = head.split_first().ok_or(Malformed("empty line"))?;
    match kind {
        b'$' => bulk(buf, rest, next),
        b':' | b'+' | b'-' => Ok(Some((Some(rest), next))),
        b'*' => {
            if depth >= MAX_DEPTH {
                return Err(Malformed("arrays nested too deep"));
            }
            let mut at = next;
            for _ in 0..length(rest)?.unwrap_or(0) {
                match value(buf, at, depth + 1)? {
                    Some((_, end)) => at = end,
                    None => return Ok(None),
                }
            }
            Ok(Some((None, at)))
        }
        _ => Err(Malformed("unknown frame type")),
    }
}

/// Appends a command (an array of bulk strings) to `out`.
pub(crate) fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    command_of(out, args.len(), args.iter().copied());
}

/// Appends a command of `count` arguments, taken from `args`, to `out`
/// (no allocation beyond `out`'s growth).
pub(crate) fn command_of<'a>(
    out: &mut Vec<u8>,
    count: usize,
    args: impl Iterator<Item = &'a [u8]>,
) {
    // Writing to a Vec cannot fail.
    let _ = write!(out, "*{count}\r\n");
    for arg in args {
        let _ = write!(out, "${}\r\n", arg.len());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// A whole reply read from the start of `buf`: the reply (an error reply
/// as its text, `Err`) and how many bytes it took, or `Ok(None)` while it
/// is incomplete. Bulk strings that are UTF-8 become [`Reply::Str`], as
/// fred's do for `calls.rs`; others [`Reply::Bytes`].
#[allow(clippy::type_complexity)]
pub(crate) fn reply(buf: &[u8]) -> ReplyRead {
    match reply_started(buf)? {
        Some(reply) => Ok(Some(reply)),
        None => incomplete(buf),
    }
}

/// [`reply`] without the bound on an incomplete frame.
fn reply_started(buf: &[u8]) -> ReplyRead {
    let Some((head, next)) = line(buf, 0) else {
        return Ok(None);
    };
    if let Some(error) = head.strip_prefix(b"-") {
        return Ok(Some((
            Err(String::from_utf8_lossy(error).into_owned()),
            next,
        )));
    }
    Ok(owned(buf, 0, 0)?.map(|(reply, used)| (Ok(reply), used)))
}

/// The value at `at` as an owned [`Reply`], and where the next begins.
fn owned(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Reply, usize)>, Malformed> {
    let Some((head, next)) = line(buf, at) else {
        return Ok(None);
    };
    let (&kind, rest) = head.split_first().ok_or(Malformed("empty line"))?;
    let text = |bytes: &[u8]| Reply::from_bulk(bytes.to_vec());
    Ok(match kind {
        b'+' => Some((text(rest), next)),
        // An error inside an array: as Redis's clients give it, its text.
        b'-' => Some((text(rest), next)),
        b':' => {
            let n = str::from_utf8(rest)
                .ok()
                .and_then(|d| d.parse().ok())
                .ok_or(Malformed("bad integer"))?;
            Some((Reply::Int(n), next))
        }
        b'$' => bulk(buf, rest, next)?.map(|(data, end)| (data.map_or(Reply::Nil, text), end)),
        b'*' => {
            if depth >= MAX_DEPTH {
                return Err(Malformed("arrays nested too deep"));
            }
            let Some(count) = length(rest)? else {
                return Ok(Some((Reply::Nil, next)));
            };
            // Not trusting the count for the allocation: items arrive one by one.
            let mut items = Vec::with_capacity(count.min(64));
            let mut at = next;
            for _ in 0..count {
                match owned(buf, at, depth + 1)? {
                    Some((item, end)) => {
                        items.push(item);
                        at = end;
                    }
                    None => return Ok(None),
                }
            }
            Some((Reply::Array(items), at))
        }
        _ => return Err(Malformed("unknown frame type")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(mut buf: &[u8]) -> Vec<Frame<'_>> {
        let mut frames = Vec::new();
        while let Some((frame, used)) = parse(buf).expect("well-formed") {
            frames.push(frame);
            buf = &buf[used..];
        }
        assert!(buf.is_empty(), "left over: {buf:?}");
        frames
    }

    const STREAM: &[u8] = b"+OK\r\n*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n\
        *3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$11\r\nabc 42 k\r\nx\r\n\
        *2\r\n$4\r\npong\r\n$0\r\n\r\n-NOPERM no\r\n:7\r\n$-1\r\n*-1\r\n\
        *3\r\n$10\r\nssubscribe\r\n$2\r\nsh\r\n:1\r\n\
        *3\r\n$8\r\nsmessage\r\n$2\r\nsh\r\n$4\r\nx 1 \r\n\
        *3\r\n$12\r\nsunsubscribe\r\n$2\r\nsh\r\n:0\r\n";

    /// `HELLO 2`'s answer says the server's role; other arrays whose first
    /// item is "server" without one give `None`.
    #[test]
    fn hello_says_the_role() {
        let primary = b"*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n\
            $5\r\nproto\r\n:2\r\n$2\r\nid\r\n:7\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n\
            $4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n";
        assert_eq!(
            all(primary),
            [Frame::Hello {
                role: Some(b"master".as_slice())
            }]
        );
        let replica = b"*4\r\n$6\r\nserver\r\n$6\r\nvalkey\r\n$4\r\nrole\r\n$7\r\nreplica\r\n";
        assert_eq!(
            all(replica),
            [Frame::Hello {
                role: Some(b"replica".as_slice())
            }]
        );
        assert_eq!(
            all(b"*2\r\n$6\r\nserver\r\n$4\r\nrole\r\n"),
            [Frame::Hello { role: None }]
        );
    }

    #[test]
    fn the_frames_of_a_grant_connection_are_read() {
        assert_eq!(
            all(STREAM),
            vec![
                Frame::Simple(b"OK"),
                Frame::Subscribed(b"ch"),
                Frame::Message {
                    channel: b"ch",
                    payload: b"abc 42 k\r\nx",
                },
                Frame::Other,
                Frame::Error(b"NOPERM no"),
                Frame::Other,
                Frame::Other,
                Frame::Other,
                Frame::Subscribed(b"sh"),
                Frame::Message {
                    channel: b"sh",
                    payload: b"x 1 ",
                },
                Frame::Unsubscribed(b"sh"),
            ]
        );
    }

    /// A frame cut anywhere is incomplete, never misread: the reader waits
    /// for the rest.
    #[test]
    fn a_frame_cut_anywhere_waits_for_the_rest() {
        let message = b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nabc\r\n";
        for cut in 0..message.len() {
            assert_eq!(parse(&message[..cut]), Ok(None), "cut at {cut}");
        }
        let (frame, used) = parse(message).expect("ok").expect("complete");
        assert_eq!(used, message.len());
        assert_eq!(
            frame,
            Frame::Message {
                channel: b"ch",
                payload: b"abc"
            }
        );
    }

    #[test]
    fn a_nested_array_is_skipped_whole() {
        let buf = b"*2\r\n*2\r\n:1\r\n$1\r\na\r\n:2\r\n+OK\r\n";
        assert_eq!(all(buf), vec![Frame::Other, Frame::Simple(b"OK")]);
    }

    #[test]
    fn garbage_is_refused() {
        assert_eq!(parse(b"hello\r\n"), Err(Malformed("unknown frame type")));
        assert_eq!(parse(b"$x\r\n"), Err(Malformed("bad length")));
        assert_eq!(
            parse(b"$3\r\nabcd\r\n"),
            Err(Malformed("bulk string without its CRLF"))
        );
        assert_eq!(parse(b"$999999999\r\n"), Err(Malformed("frame too large")));
        assert_eq!(
            parse(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"),
            Err(Malformed("arrays nested too deep"))
        );
    }

    /// A script's reply is read whole, as fred reads it for `calls.rs`:
    /// integers, text, binary bulk strings, nulls, nested arrays; an error
    /// reply as its text; a cut reply waits for the rest.
    #[test]
    fn a_script_reply_is_read_whole() {
        let buf = b"*5\r\n:1\r\n$3\r\nabc\r\n$2\r\n\xff\x00\r\n$-1\r\n*2\r\n+OK\r\n:-7\r\n";
        let expected = Reply::Array(vec![
            Reply::Int(1),
            Reply::Str("abc".into()),
            Reply::Bytes(vec![0xff, 0]),
            Reply::Nil,
            Reply::Array(vec![Reply::Str("OK".into()), Reply::Int(-7)]),
        ]);
        assert_eq!(reply(buf), Ok(Some((Ok(expected), buf.len()))));
        for cut in 0..buf.len() {
            assert_eq!(reply(&buf[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(
            reply(b"-NOSCRIPT No matching script\r\n:1\r\n"),
            Ok(Some((Err("NOSCRIPT No matching script".into()), 30)))
        );
        assert_eq!(reply(b"*-1\r\n"), Ok(Some((Ok(Reply::Nil), 5))));
        assert_eq!(reply(b":x\r\n"), Err(Malformed("bad integer")));
        assert_eq!(
            reply(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"),
            Err(Malformed("arrays nested too deep"))
        );
    }

    /// A frame that never ends within a mebibyte (a line without its
    /// CRLF, an array announcing millions of items) is malformed, for
    /// both readers: before, each answered "incomplete" for ever, and the
    /// connection buffered without limit.
    #[test]
    fn a_frame_still_incomplete_after_a_mebibyte_is_malformed() {
        let mut endless_line = b"+".to_vec();
        endless_line.resize(MAX_FRAME + 1, b'A');
        let mut endless_array = b"*1000000\r\n".to_vec();
        while endless_array.len() <= MAX_FRAME {
            endless_array.extend_from_slice(b":1\r\n");
        }
        for buf in [&endless_line, &endless_array] {
            assert_eq!(
                parse(buf),
                Err(Malformed("a frame still incomplete after a mebibyte"))
            );
            assert_eq!(
                reply(buf),
                Err(Malformed("a frame still incomplete after a mebibyte"))
            );
            // Just under the bound, still only incomplete.
            assert_eq!(parse(&buf[..MAX_FRAME]), Ok(None));
            assert_eq!(reply(&buf[..MAX_FRAME]), Ok(None));
        }
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        command(&mut out, &[b"SUBSCRIBE", b"p:notify:ab"]);
        assert_eq!(out, b"*2\r\n$9\r\nSUBSCRIBE\r\n$11\r\np:notify:ab\r\n");
    }
}
