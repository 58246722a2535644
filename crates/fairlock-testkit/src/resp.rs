//! A tiny blocking RESP2 codec and admin client: encodes commands as arrays of
//! bulk strings and decodes the five RESP2 reply types. Tests inspect and
//! steer servers through it, never through the library under test, so a bug
//! in fairlock's client cannot hide itself.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::TestkitError;

/// Largest bulk string / array we are willing to decode (Redis' own limit is 512 MiB).
const MAX_LEN: i64 = 512 * 1024 * 1024;
/// Deepest array nesting we are willing to decode.
const MAX_DEPTH: usize = 64;
/// Connect/read/write timeout of the admin client.
pub(crate) const CMD_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends one command to the Redis server at `addr` over a fresh connection
/// (5 s connect, read and write timeouts) and returns the reply.
///
/// `addr` is `host:port`; a `redis://host:port[/db]` URL without credentials
/// is accepted too (the db number is ignored).
///
/// # Errors
///
/// As [`RedisServer::cmd`](crate::RedisServer::cmd).
pub fn cmd_at(addr: &str, args: &[&str]) -> Result<Resp, TestkitError> {
    let host_port = addr.strip_prefix("redis://").unwrap_or(addr);
    let host_port = host_port.split('/').next().unwrap_or(host_port);
    Conn::connect(host_port, CMD_TIMEOUT)?.request(args)
}

/// A decoded RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// Simple string, e.g. `+OK` or `+PONG`.
    Simple(String),
    /// Error reply, e.g. `-ERR unknown command`. Redis errors are returned as
    /// `Ok(Resp::Error(..))` by the client functions, not as `Err`.
    Error(String),
    /// Integer reply, e.g. `:42`.
    Int(i64),
    /// Bulk string; `None` is the null bulk string (`$-1`).
    Bulk(Option<Vec<u8>>),
    /// Array; `None` is the null array (`*-1`).
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The integer value of an [`Resp::Int`] reply, or of a simple/bulk string
    /// that parses as an `i64`; `None` otherwise.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Resp::Int(i) => Some(*i),
            Resp::Simple(_) | Resp::Bulk(Some(_)) => self.as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// The text of a [`Resp::Simple`] reply or of a non-null [`Resp::Bulk`]
    /// reply that is valid UTF-8; `None` otherwise.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Resp::Simple(s) => Some(s),
            Resp::Bulk(Some(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The raw bytes of a non-null [`Resp::Bulk`] reply.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Resp::Bulk(Some(b)) => Some(b),
            _ => None,
        }
    }

    /// The elements of a non-null [`Resp::Array`] reply.
    pub fn as_array(&self) -> Option<&[Resp]> {
        match self {
            Resp::Array(Some(items)) => Some(items),
            _ => None,
        }
    }

    /// `true` for the null bulk string (`$-1`) and the null array (`*-1`).
    pub fn is_nil(&self) -> bool {
        matches!(self, Resp::Bulk(None) | Resp::Array(None))
    }

    /// `true` for an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub(crate) fn encode_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one complete reply from `r`.
pub(crate) fn read_reply<R: BufRead>(r: &mut R) -> Result<Resp, TestkitError> {
    read_value(r, 0)
}

fn protocol(msg: impl Into<String>) -> TestkitError {
    TestkitError::Protocol(msg.into())
}

/// Reads one `\r\n`-terminated line and returns it without the terminator.
fn read_line<R: BufRead>(r: &mut R) -> Result<Vec<u8>, TestkitError> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(TestkitError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed by redis-server",
        )));
    }
    if !line.ends_with(b"\r\n") {
        return Err(TestkitError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed in the middle of a reply",
        )));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn parse_int(bytes: &[u8]) -> Result<i64, TestkitError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| {
            protocol(format!(
                "invalid integer {:?}",
                String::from_utf8_lossy(bytes)
            ))
        })
}

fn read_value<R: BufRead>(r: &mut R, depth: usize) -> Result<Resp, TestkitError> {
    if depth > MAX_DEPTH {
        return Err(protocol("reply nested too deeply"));
    }
    let line = read_line(r)?;
    let (&kind, rest) = line
        .split_first()
        .ok_or_else(|| protocol("empty reply line"))?;
    match kind {
        b'+' => Ok(Resp::Simple(String::from_utf8_lossy(rest).into_owned())),
        b'-' => Ok(Resp::Error(String::from_utf8_lossy(rest).into_owned())),
        b':' => Ok(Resp::Int(parse_int(rest)?)),
        b'$' => {
            let len = parse_int(rest)?;
            if len == -1 {
                return Ok(Resp::Bulk(None));
            }
            if !(0..=MAX_LEN).contains(&len) {
                return Err(protocol(format!("invalid bulk length {len}")));
            }
            let len = usize::try_from(len).map_err(|_| protocol("bulk length overflow"))?;
            let mut buf = vec![0u8; len + 2];
            r.read_exact(&mut buf)?;
            if !buf.ends_with(b"\r\n") {
                return Err(protocol("bulk string not terminated by CRLF"));
            }
            buf.truncate(len);
            Ok(Resp::Bulk(Some(buf)))
        }
        b'*' => {
            let len = parse_int(rest)?;
            if len == -1 {
                return Ok(Resp::Array(None));
            }
            if !(0..=MAX_LEN).contains(&len) {
                return Err(protocol(format!("invalid array length {len}")));
            }
            let len = usize::try_from(len).map_err(|_| protocol("array length overflow"))?;
            let mut items = Vec::with_capacity(len.min(1024));
            for _ in 0..len {
                items.push(read_value(r, depth + 1)?);
            }
            Ok(Resp::Array(Some(items)))
        }
        other => Err(protocol(format!(
            "unsupported reply type byte {:?} (only RESP2 is supported)",
            other as char
        ))),
    }
}

/// A blocking connection to one Redis server.
#[derive(Debug)]
pub(crate) struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connects to `addr` (`host:port`), trying every resolved address, and
    /// applies `timeout` as connect, read and write timeout.
    pub(crate) fn connect(addr: &str, timeout: Duration) -> Result<Conn, TestkitError> {
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        let mut last_err = io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr} did not resolve to any address"),
        );
        for sa in addrs {
            match TcpStream::connect_timeout(&sa, timeout) {
                Ok(stream) => return Conn::from_stream(stream, timeout),
                Err(e) => last_err = e,
            }
        }
        Err(TestkitError::Io(last_err))
    }

    /// Connects to `addr` with `timeout` as connect, read and write timeout.
    pub(crate) fn connect_addr(addr: SocketAddr, timeout: Duration) -> Result<Conn, TestkitError> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        Conn::from_stream(stream, timeout)
    }

    fn from_stream(stream: TcpStream, timeout: Duration) -> Result<Conn, TestkitError> {
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::new(stream),
        })
    }

    /// Sends several commands in one write and reads one reply per command.
    pub(crate) fn pipeline(&mut self, commands: &[&[&str]]) -> Result<Vec<Resp>, TestkitError> {
        let mut buf = Vec::new();
        for c in commands {
            buf.extend_from_slice(&encode_command(c));
        }
        self.reader.get_mut().write_all(&buf)?;
        let mut replies = Vec::with_capacity(commands.len());
        for _ in commands {
            replies.push(read_reply(&mut self.reader)?);
        }
        Ok(replies)
    }

    /// Sends one command and reads its reply.
    pub(crate) fn request(&mut self, args: &[&str]) -> Result<Resp, TestkitError> {
        self.send(args)?;
        self.read()
    }

    /// Writes one command. An error means it was not written completely,
    /// so the server cannot run it.
    pub(crate) fn send(&mut self, args: &[&str]) -> Result<(), TestkitError> {
        Ok(self.reader.get_mut().write_all(&encode_command(args))?)
    }

    /// Reads one reply.
    pub(crate) fn read(&mut self) -> Result<Resp, TestkitError> {
        read_reply(&mut self.reader)
    }

    /// `false` if the server has closed the connection (or sent something
    /// nobody asked for), as far as can be seen without blocking.
    pub(crate) fn is_open(&mut self) -> bool {
        if !self.reader.buffer().is_empty() {
            return false;
        }
        let stream = self.reader.get_ref();
        if stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        let idle =
            matches!(stream.peek(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        stream.set_nonblocking(false).is_ok() && idle
    }
}

/// Sends `args` over the connection in `slot` (opened to `addr` when there
/// is none, kept there for the next call) and returns the reply: the logic
/// of [`RedisServer::cmd`](crate::RedisServer::cmd).
///
/// A cached connection the server has closed is replaced before sending.
/// If a reused connection turns out dead anyway, the command is sent once
/// more on a new connection only when that cannot run it twice: writing
/// it failed, or it is [idempotent](is_idempotent).
pub(crate) fn request_reusing(
    slot: &mut Option<Conn>,
    addr: &str,
    args: &[&str],
) -> Result<Resp, TestkitError> {
    if slot.as_mut().is_some_and(|conn| !conn.is_open()) {
        *slot = None;
    }
    let mut retried = false;
    loop {
        let reused = slot.is_some();
        let conn = match slot {
            Some(conn) => conn,
            None => slot.insert(Conn::connect(addr, CMD_TIMEOUT)?),
        };
        // Only a reused connection can be stale, and it is replaced once.
        let may_retry = |e: &TestkitError| reused && !retried && is_dropped(e);
        if let Err(e) = conn.send(args) {
            *slot = None;
            if may_retry(&e) {
                retried = true;
                continue;
            }
            return Err(e);
        }
        match conn.read() {
            Ok(reply) => return Ok(reply),
            Err(e) => {
                *slot = None;
                // The server may have run it before the connection dropped.
                if may_retry(&e) && is_idempotent(args) {
                    retried = true;
                    continue;
                }
                return Err(e);
            }
        }
    }
}

/// `true` for the errors of a connection the server closed or reset.
fn is_dropped(e: &TestkitError) -> bool {
    matches!(e, TestkitError::Io(io) if matches!(
        io.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    ))
}

/// `true` for the admin commands that may run twice without harm: reads,
/// and writes that set a value rather than change it (`CONFIG SET`).
pub(crate) fn is_idempotent(args: &[&str]) -> bool {
    const READS: &[&str] = &[
        "PING",
        "ECHO",
        "INFO",
        "GET",
        "MGET",
        "STRLEN",
        "EXISTS",
        "TTL",
        "PTTL",
        "TYPE",
        "DBSIZE",
        "KEYS",
        "SCAN",
        "HGET",
        "HMGET",
        "HGETALL",
        "HLEN",
        "HEXISTS",
        "LLEN",
        "LRANGE",
        "LINDEX",
        "SCARD",
        "SMEMBERS",
        "SISMEMBER",
        "ZCARD",
        "ZSCORE",
        "ZRANGE",
        "ZRANK",
        "XLEN",
        "XRANGE",
        "XINFO",
        "OBJECT",
        "MEMORY",
        "ROLE",
        "TIME",
        "LASTSAVE",
        "DUMP",
        "COMMAND",
        "PUBSUB",
    ];
    const SUBCOMMANDS: &[(&str, &[&str])] = &[
        ("CONFIG", &["GET", "SET"]),
        (
            "CLUSTER",
            &[
                "INFO",
                "NODES",
                "MYID",
                "SLOTS",
                "SHARDS",
                "KEYSLOT",
                "GETKEYSINSLOT",
                "COUNTKEYSINSLOT",
                "REPLICAS",
                "SLAVES",
                "COUNT-FAILURE-REPORTS",
            ],
        ),
        (
            "SENTINEL",
            &[
                "GET-MASTER-ADDR-BY-NAME",
                "MASTERS",
                "MASTER",
                "REPLICAS",
                "SLAVES",
                "SENTINELS",
                "CKQUORUM",
                "MYID",
            ],
        ),
        ("CLIENT", &["LIST", "INFO", "ID", "GETNAME"]),
        ("ACL", &["LIST", "USERS", "GETUSER", "WHOAMI"]),
        ("SLOWLOG", &["GET", "LEN"]),
        ("SCRIPT", &["EXISTS"]),
        ("FUNCTION", &["LIST", "DUMP"]),
    ];
    let Some(first) = args.first() else {
        return false;
    };
    if READS.iter().any(|c| c.eq_ignore_ascii_case(first)) {
        return true;
    }
    SUBCOMMANDS.iter().any(|(cmd, subs)| {
        cmd.eq_ignore_ascii_case(first)
            && args
                .get(1)
                .is_some_and(|sub| subs.iter().any(|s| s.eq_ignore_ascii_case(sub)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;

    fn decode(bytes: &[u8]) -> Result<Resp, TestkitError> {
        read_reply(&mut &bytes[..])
    }

    #[test]
    fn encodes_array_of_bulk_strings() {
        assert_eq!(
            encode_command(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n".to_vec()
        );
    }

    #[test]
    fn decodes_all_resp2_types() {
        assert_eq!(decode(b"+OK\r\n").unwrap(), Resp::Simple("OK".into()));
        assert_eq!(
            decode(b"-ERR nope\r\n").unwrap(),
            Resp::Error("ERR nope".into())
        );
        assert_eq!(decode(b":-12\r\n").unwrap(), Resp::Int(-12));
        assert_eq!(
            decode(b"$5\r\nhe\r\nx\r\n").unwrap(),
            Resp::Bulk(Some(b"he\r\nx".to_vec()))
        );
        assert_eq!(decode(b"$0\r\n\r\n").unwrap(), Resp::Bulk(Some(vec![])));
        assert!(decode(b"$-1\r\n").unwrap().is_nil());
        assert!(decode(b"*-1\r\n").unwrap().is_nil());
        assert_eq!(decode(b"*0\r\n").unwrap(), Resp::Array(Some(vec![])));
        assert_eq!(
            decode(b"*3\r\n:1\r\n*1\r\n$1\r\na\r\n$-1\r\n").unwrap(),
            Resp::Array(Some(vec![
                Resp::Int(1),
                Resp::Array(Some(vec![Resp::Bulk(Some(b"a".to_vec()))])),
                Resp::Bulk(None),
            ]))
        );
    }

    #[test]
    fn rejects_malformed_replies() {
        assert!(matches!(decode(b"!3\r\n"), Err(TestkitError::Protocol(_))));
        assert!(matches!(
            decode(b":abc\r\n"),
            Err(TestkitError::Protocol(_))
        ));
        assert!(matches!(decode(b"$-2\r\n"), Err(TestkitError::Protocol(_))));
        assert!(matches!(
            decode(b"$2\r\nabcd"),
            Err(TestkitError::Protocol(_))
        ));
        assert!(matches!(decode(b"$5\r\nab"), Err(TestkitError::Io(_))));
        assert!(matches!(decode(b"+OK"), Err(TestkitError::Io(_))));
        assert!(matches!(decode(b""), Err(TestkitError::Io(_))));
    }

    #[test]
    fn helpers() {
        assert_eq!(Resp::Int(7).as_int(), Some(7));
        assert_eq!(Resp::Bulk(Some(b"42".to_vec())).as_int(), Some(42));
        assert_eq!(Resp::Simple("PONG".into()).as_str(), Some("PONG"));
        assert_eq!(Resp::Bulk(Some(b"v".to_vec())).as_str(), Some("v"));
        assert_eq!(Resp::Bulk(Some(vec![0xff])).as_str(), None);
        assert_eq!(Resp::Error("ERR".into()).as_str(), None);
        assert!(!Resp::Bulk(Some(vec![])).is_nil());
        assert!(Resp::Error("x".into()).is_error());
    }

    #[test]
    fn idempotent_commands() {
        assert!(is_idempotent(&["get", "n"]));
        assert!(is_idempotent(&["CONFIG", "GET", "save"]));
        assert!(is_idempotent(&["config", "set", "save", ""]));
        assert!(is_idempotent(&["CLUSTER", "NODES"]));
        assert!(!is_idempotent(&["INCR", "n"]));
        assert!(!is_idempotent(&["CLUSTER", "FAILOVER"]));
        assert!(!is_idempotent(&["MIGRATE", "127.0.0.1", "1", "", "0", "1"]));
        assert!(!is_idempotent(&["CONFIG"]));
        assert!(!is_idempotent(&[]));
    }

    /// A fake server: every connection gets the first `answered` commands
    /// answered with `+OK`; the next one is read and counted, and the
    /// connection is closed without a reply.
    fn dropping_server(answered: usize) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&seen);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let counter = Arc::clone(&counter);
                thread::spawn(move || {
                    let mut reader = BufReader::new(stream);
                    for i in 0.. {
                        if read_reply(&mut reader).is_err() {
                            return;
                        }
                        counter.fetch_add(1, Ordering::SeqCst);
                        if i >= answered {
                            return; // Closes without a reply.
                        }
                        let _ = reader.get_mut().write_all(b"+OK\r\n");
                    }
                });
            }
        });
        (addr, seen)
    }

    #[test]
    fn a_dropped_reply_is_resent_only_when_idempotent() {
        // Each connection answers one command and drops the second.
        let (addr, seen) = dropping_server(1);
        let mut slot = None;
        request_reusing(&mut slot, &addr, &["SET", "k", "v"]).unwrap();
        assert!(slot.is_some());
        // A write on the reused connection: run once, then an error.
        let err = request_reusing(&mut slot, &addr, &["INCR", "n"]).unwrap_err();
        assert!(is_dropped(&err), "{err:?}");
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        assert!(slot.is_none());
        request_reusing(&mut slot, &addr, &["SET", "k", "v"]).unwrap();
        // A read on the reused connection: sent again on a new one.
        let reply = request_reusing(&mut slot, &addr, &["GET", "k"]).unwrap();
        assert_eq!(reply, Resp::Simple("OK".into()));
        assert_eq!(seen.load(Ordering::SeqCst), 5);
        // A fresh connection that drops is not retried, even for a read.
        let (addr, seen) = dropping_server(0);
        let mut slot = None;
        assert!(request_reusing(&mut slot, &addr, &["GET", "k"]).is_err());
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_closed_cached_connection_is_noticed_before_sending() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut conn = Conn::connect_addr(addr, CMD_TIMEOUT).unwrap();
        let (server_side, _) = listener.accept().unwrap();
        assert!(conn.is_open());
        drop(server_side);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while conn.is_open() {
            assert!(std::time::Instant::now() < deadline, "close never seen");
            thread::sleep(Duration::from_millis(5));
        }
    }
}
