//! A node's view of the cluster: its `CLUSTER NODES` answer, parsed, and
//! the slot map it implies (what the kit compares across nodes to know the
//! cluster has settled).

use std::collections::BTreeMap;

use crate::{Resp, TestkitError};

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub(crate) struct NodeEntry {
    pub(crate) id: String,
    pub(crate) addr: String,
    pub(crate) flags: Vec<String>,
    pub(crate) primary_id: Option<String>,
    pub(crate) slots: Vec<(u16, u16)>,
}

impl NodeEntry {
    /// Whether the node has `flag` (`master`, `slave`, `myself`, ...).
    pub(crate) fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// Whether the node is failed or suspected failed.
    pub(crate) fn is_failed(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?")
    }

    /// Whether the node serves `slot`.
    pub(crate) fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// The entries of a `CLUSTER NODES` answer.
pub(crate) fn parse_nodes(reply: &Resp) -> Result<Vec<NodeEntry>, TestkitError> {
    let text = reply.as_str().ok_or_else(|| {
        TestkitError::Protocol(format!("unexpected CLUSTER NODES reply {reply:?}"))
    })?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(TestkitError::Protocol(format!(
                "short CLUSTER NODES line {line:?}"
            )));
        }
        // `ip:port@cport[,hostname]`.
        let addr = fields[1].split('@').next().unwrap_or(fields[1]).to_string();
        let slots = fields[8..]
            .iter()
            // Skip `[slot->-id]` / `[slot-<-id]` migration markers.
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|n| (n, n)),
            })
            .collect();
        out.push(NodeEntry {
            id: fields[0].to_string(),
            addr,
            flags: fields[2].split(',').map(str::to_string).collect(),
            primary_id: Some(fields[3]).filter(|m| *m != "-").map(str::to_string),
            slots,
        });
    }
    Ok(out)
}

/// `{first slot: (last slot, owner addr)}` of the live primaries in a view,
/// for comparing the views of different nodes.
pub(crate) fn slot_map(view: &[NodeEntry]) -> BTreeMap<u16, (u16, String)> {
    view.iter()
        .filter(|e| e.has_flag("master") && !e.is_failed())
        .flat_map(|e| e.slots.iter().map(move |&(a, b)| (a, (b, e.addr.clone()))))
        .collect()
}
