//! Reading server statistics: `INFO commandstats` (tests assert how many
//! Redis commands a waiter costs) and the `field:value` text that `INFO` and
//! `CLUSTER INFO` answer with (topologies wait on replication and cluster
//! state through it).

use std::collections::BTreeMap;

use crate::{RedisServer, Resp, TestkitError};

impl RedisServer {
    /// Parses `INFO commandstats` into `{command name: calls}`, e.g.
    /// `{"evalsha": 12, "set": 1}`. Subcommands keep Redis' spelling
    /// (`"client|setname"`). Includes this crate's own admin commands and
    /// the `ping`/`info` of the startup probe; compare before/after values or
    /// call [`reset_stats`](Self::reset_stats) first.
    ///
    /// # Errors
    ///
    /// As [`cmd`](Self::cmd), plus [`TestkitError::Protocol`] for an
    /// unexpected reply.
    pub fn commandstats(&self) -> Result<BTreeMap<String, u64>, TestkitError> {
        parse_commandstats(&self.cmd(&["INFO", "commandstats"])?)
    }

    /// Sum of all `calls` in [`commandstats`](Self::commandstats).
    ///
    /// # Errors
    ///
    /// As [`commandstats`](Self::commandstats).
    pub fn total_commands(&self) -> Result<u64, TestkitError> {
        Ok(self.commandstats()?.values().sum())
    }

    /// Resets the server's statistics (`CONFIG RESETSTAT`). The reset command
    /// itself is then counted as `config|resetstat`.
    ///
    /// # Errors
    ///
    /// As [`cmd`](Self::cmd), plus [`TestkitError::Protocol`] for an error reply.
    pub fn reset_stats(&self) -> Result<(), TestkitError> {
        match self.cmd(&["CONFIG", "RESETSTAT"])? {
            Resp::Simple(_) => Ok(()),
            other => Err(TestkitError::Protocol(format!(
                "unexpected reply to CONFIG RESETSTAT: {other:?}"
            ))),
        }
    }

    /// `true` when this replica's link to `primary` is up and it has applied
    /// at least every write `primary` had when asked. Reading the primary
    /// first makes this hold under a steady stream of writes (e.g. waiters'
    /// heartbeats), where the two offsets are rarely equal at one instant.
    /// The link may go to either of `primary`'s ports (a replica with
    /// `tls-replication yes` replicates from the TLS one).
    ///
    /// # Errors
    ///
    /// As [`info`](Self::info), on either server.
    pub fn caught_up_with(&self, primary: &RedisServer) -> Result<bool, TestkitError> {
        let offset = |info: &BTreeMap<String, String>, field: &str| {
            info.get(field).and_then(|v| v.parse::<u64>().ok())
        };
        let target = offset(&primary.info("replication")?, "master_repl_offset");
        let info = self.info("replication")?;
        let field = |name: &str| info.get(name).map(String::as_str);
        let linked = field("master_link_status") == Some("up")
            && field("master_sync_in_progress") == Some("0")
            && field("master_port")
                .and_then(|port| port.parse().ok())
                .is_some_and(|port| primary.listens_on(port));
        Ok(linked
            && matches!(
                (offset(&info, "slave_repl_offset"), target),
                (Some(applied), Some(target)) if applied >= target
            ))
    }

    /// `INFO <section>` as `{field: value}`, e.g. `info("replication")?["role"]`.
    ///
    /// # Errors
    ///
    /// As [`cmd`](Self::cmd), plus [`TestkitError::Protocol`] for an
    /// unexpected reply.
    pub fn info(&self, section: &str) -> Result<BTreeMap<String, String>, TestkitError> {
        parse_fields(&self.cmd(&["INFO", section])?)
    }
}

/// Parses the `field:value` lines of an `INFO` or `CLUSTER INFO` reply;
/// `# Section` headers and blank lines are skipped.
///
/// # Errors
///
/// [`TestkitError::Protocol`] when the reply is not a string (e.g. an error).
pub fn parse_fields(reply: &Resp) -> Result<BTreeMap<String, String>, TestkitError> {
    let text = reply
        .as_str()
        .ok_or_else(|| TestkitError::Protocol(format!("expected INFO text, got {reply:?}")))?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn parse_commandstats(reply: &Resp) -> Result<BTreeMap<String, u64>, TestkitError> {
    let text = reply.as_str().ok_or_else(|| {
        TestkitError::Protocol(format!("unexpected reply to INFO commandstats: {reply:?}"))
    })?;
    let mut stats = BTreeMap::new();
    for line in text.lines() {
        let Some((name, fields)) = line
            .trim()
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|c| c.parse::<u64>().ok())
            .ok_or_else(|| {
                TestkitError::Protocol(format!("malformed commandstats line {line:?}"))
            })?;
        stats.insert(name.to_string(), calls);
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_counts_set() {
        let server = RedisServer::start().unwrap();
        let before = server.commandstats().unwrap();
        assert!(before.contains_key("ping"), "{before:?}");
        server.cmd(&["SET", "a", "1"]).unwrap();
        server.cmd(&["SET", "b", "2"]).unwrap();
        let after = server.commandstats().unwrap();
        assert_eq!(
            after.get("set").copied().unwrap_or(0),
            before.get("set").copied().unwrap_or(0) + 2
        );
        // The first INFO commandstats is counted by the second one.
        assert!(after.get("info").copied().unwrap_or(0) >= 1);
        assert_eq!(
            server.total_commands().unwrap(),
            after.values().sum::<u64>() + 1
        );

        server.reset_stats().unwrap();
        let reset = server.commandstats().unwrap();
        assert_eq!(reset.get("set"), None);
        assert_eq!(reset.get("config|resetstat"), Some(&1));
    }

    #[test]
    fn parses_commandstats_text() {
        let text = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\ncmdstat_client|setname:calls=1,usec=1,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n";
        let stats = parse_commandstats(&Resp::Bulk(Some(text.as_bytes().to_vec()))).unwrap();
        assert_eq!(stats.len(), 2);
        assert_eq!(stats["evalsha"], 12);
        assert_eq!(stats["client|setname"], 1);
        assert!(parse_commandstats(&Resp::Error("ERR".into())).is_err());
    }
}
