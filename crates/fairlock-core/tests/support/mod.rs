//! What the script-level tests share: running a fairlock script on a real
//! redis-server through the testkit's blocking admin client, and turning
//! the raw RESP reply into the [`Reply`] the call types decode.
//!
//! The tests drive the scripts directly (not through the async client), so
//! that every reply and every key can be checked against what the script
//! headers promise, one call at a time.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use fairlock_core::{
    Acquire, AcquireMode, LockKeys, Reply, Script, ScriptCall, Timings, ALL_SCRIPTS,
};
use fairlock_testkit::{RedisServer, Resp};

/// Converts a RESP reply into a [`Reply`]; a Redis error becomes `Err`.
pub fn to_reply(resp: Resp) -> Result<Reply, String> {
    Ok(match resp {
        Resp::Int(i) => Reply::Int(i),
        Resp::Simple(text) => Reply::Str(text),
        Resp::Bulk(Some(bytes)) => Reply::from_bulk(bytes),
        Resp::Bulk(None) | Resp::Array(None) => Reply::Nil,
        Resp::Array(Some(items)) => Reply::Array(
            items
                .into_iter()
                .map(to_reply)
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Resp::Error(message) => return Err(message),
    })
}

/// Loads every fairlock script, so `EVALSHA` finds them.
pub fn load_scripts(server: &RedisServer) {
    for script in ALL_SCRIPTS {
        let sha = server.cmd(&["SCRIPT", "LOAD", script.source()]).unwrap();
        assert_eq!(sha.as_str(), Some(script.sha1()), "{}", script.name());
    }
}

/// Runs `script` with EVALSHA (loading it on NOSCRIPT, as the client does)
/// and returns its reply, or the Redis error it raised.
pub fn run_script(
    server: &RedisServer,
    script: &Script,
    keys: &[&str],
    args: &[String],
) -> Result<Reply, String> {
    let numkeys = keys.len().to_string();
    let mut command: Vec<&str> = vec!["EVALSHA", script.sha1(), &numkeys];
    command.extend(keys.iter().copied());
    command.extend(args.iter().map(String::as_str));
    let resp = server.cmd(&command).map_err(|e| e.to_string())?;
    if matches!(&resp, Resp::Error(message) if message.starts_with("NOSCRIPT")) {
        server
            .cmd(&["SCRIPT", "LOAD", script.source()])
            .map_err(|e| e.to_string())?;
        return to_reply(server.cmd(&command).map_err(|e| e.to_string())?);
    }
    to_reply(resp)
}

/// A waiting acquire of the lock `keys` by `owner_id`, with the default
/// timings: the script's reply, or the error it raised.
pub fn acquire_wait(
    server: &RedisServer,
    keys: &LockKeys,
    owner_id: &str,
    channel_prefix: &str,
) -> Result<Reply, String> {
    let timings = Timings::default();
    let call = Acquire {
        owner_id,
        mode: AcquireMode::Wait,
        timings: &timings,
        channel_prefix,
        rejoin: None,
    };
    let all: Vec<&str> = keys.all().iter().map(String::as_str).collect();
    run_script(server, Acquire::SCRIPT, &all, &call.args())
}

/// Runs a test's own read-only Lua with EVAL.
pub fn eval(server: &RedisServer, source: &str, keys: &[&str], args: &[&str]) -> Reply {
    let numkeys = keys.len().to_string();
    let mut command: Vec<&str> = vec!["EVAL", source, &numkeys];
    command.extend(keys.iter().copied());
    command.extend(args.iter().copied());
    to_reply(server.cmd(&command).unwrap()).unwrap()
}

/// One line of `INFO commandstats`: how often a command ran and its total
/// server time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandStat {
    /// Number of calls, including calls from inside scripts (Redis 7).
    pub calls: u64,
    /// Total microseconds spent in the command.
    pub usec: u64,
}

/// `INFO commandstats`, with the time Redis spent per command.
pub fn commandstats(server: &RedisServer) -> BTreeMap<String, CommandStat> {
    let info = server.cmd(&["INFO", "commandstats"]).unwrap();
    let text = info.as_str().unwrap().to_owned();
    let mut stats = BTreeMap::new();
    for line in text.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|rest| rest.split_once(':'))
        else {
            continue;
        };
        let mut stat = CommandStat::default();
        for field in fields.split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => stat.calls = v.parse().unwrap(),
                Some(("usec", v)) => stat.usec = v.parse().unwrap(),
                _ => {}
            }
        }
        stats.insert(name.to_owned(), stat);
    }
    stats
}

/// The commands run since the last `CONFIG RESETSTAT`, by name and count,
/// without the script calls themselves (`eval`, `evalsha`) and the test's
/// own `SCRIPT`, `CONFIG` and `INFO` commands: what the scripts ran inside.
pub fn commands_run_inside(server: &RedisServer) -> BTreeMap<String, u64> {
    commandstats(server)
        .into_iter()
        .filter(|(name, _)| {
            !["eval", "script|", "config|", "info"]
                .iter()
                .any(|wrapper| name.starts_with(wrapper))
        })
        .map(|(name, stat)| (name, stat.calls))
        .collect()
}

/// A pub/sub connection that sees every message published on channels
/// matching one pattern, in order. Blocking, with a 5 s read timeout, so a
/// missing reply fails the test instead of hanging it.
pub struct Subscriber {
    reader: BufReader<TcpStream>,
}

impl Subscriber {
    /// Connects to `addr` (`host:port`) and subscribes to `pattern`.
    pub fn psubscribe(addr: &str, pattern: &str) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut subscriber = Self {
            reader: BufReader::new(stream),
        };
        subscriber.send(&["PSUBSCRIBE", pattern]);
        let confirmation = subscriber.read_array();
        assert_eq!(confirmation[0], "psubscribe", "{confirmation:?}");
        subscriber
    }

    /// Every `(channel, message)` published since the last call. A PING
    /// closes the batch: Redis answers it after every message queued
    /// before it, so nothing published earlier can arrive later.
    pub fn drain(&mut self) -> Vec<(String, String)> {
        self.send(&["PING"]);
        let mut messages = Vec::new();
        loop {
            let mut item = self.read_array().into_iter();
            match item.next().as_deref() {
                Some("pmessage") => {
                    let (_pattern, channel, message) = (item.next(), item.next(), item.next());
                    messages.push((channel.unwrap(), message.unwrap()));
                }
                Some("pong") => return messages,
                other => panic!("unexpected pub/sub reply {other:?}"),
            }
        }
    }

    fn send(&mut self, args: &[&str]) {
        let mut command = format!("*{}\r\n", args.len());
        for arg in args {
            command.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        self.reader.get_mut().write_all(command.as_bytes()).unwrap();
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        line.trim_end_matches("\r\n").to_owned()
    }

    /// One array reply of bulk strings and integers, as strings.
    fn read_array(&mut self) -> Vec<String> {
        let header = self.line();
        let len: usize = header
            .strip_prefix('*')
            .unwrap_or_else(|| panic!("expected an array, got {header:?}"))
            .parse()
            .unwrap();
        (0..len)
            .map(|_| {
                let item = self.line();
                if let Some(len) = item.strip_prefix('$') {
                    let mut bytes = vec![0; len.parse::<usize>().unwrap() + 2];
                    self.reader.read_exact(&mut bytes).unwrap();
                    bytes.truncate(bytes.len() - 2);
                    String::from_utf8(bytes).unwrap()
                } else {
                    item[1..].to_owned()
                }
            })
            .collect()
    }
}
