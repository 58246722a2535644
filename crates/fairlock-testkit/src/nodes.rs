//! The server processes of one topology, addressed by `127.0.0.1:<port>`
//! (the plain or, for a node that also listens for TLS, the TLS port), with
//! the ones a test killed set aside: [`NodeSet`]. Cluster and sentinel
//! helpers wait only on live nodes, and killing or restarting a node is the
//! same in both.

use crate::{RedisServer, TestkitError};

/// A topology's server processes; each is SIGKILLed when the set is dropped.
#[derive(Debug)]
pub(crate) struct NodeSet {
    /// What the topology calls its owner ids, for error messages.
    what: &'static str,
    nodes: Vec<RedisServer>,
    /// Ports of nodes killed by [`kill`](Self::kill) and not restarted.
    down: Vec<u16>,
}

impl NodeSet {
    pub(crate) fn new(what: &'static str, nodes: Vec<RedisServer>) -> NodeSet {
        NodeSet {
            what,
            nodes,
            down: Vec::new(),
        }
    }

    /// Every node, killed ones too, in start order.
    pub(crate) fn all(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes that are not killed.
    pub(crate) fn live(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| !self.down.contains(&n.port()))
    }

    fn unknown(&self, addr: &str) -> TestkitError {
        TestkitError::Protocol(format!("{addr} is not a {} of this topology", self.what))
    }

    /// The node listening on `addr`, by its plain or its TLS address.
    pub(crate) fn get(&self, addr: &str) -> Result<&RedisServer, TestkitError> {
        self.nodes
            .iter()
            .find(|n| n.listens_at(addr))
            .ok_or_else(|| self.unknown(addr))
    }

    /// The plain address of the node listening on `addr` (plain or TLS);
    /// `addr` itself when no node has it.
    pub(crate) fn plain_addr(&self, addr: &str) -> String {
        self.get(addr)
            .map_or_else(|_| addr.to_string(), RedisServer::addr)
    }

    fn get_mut(&mut self, addr: &str) -> Result<&mut RedisServer, TestkitError> {
        match self.nodes.iter().position(|n| n.listens_at(addr)) {
            Some(i) => Ok(&mut self.nodes[i]),
            None => Err(self.unknown(addr)),
        }
    }

    /// SIGKILLs the node at `addr` (plain or TLS) and leaves it out of
    /// [`live`](Self::live).
    pub(crate) fn kill(&mut self, addr: &str) -> Result<(), TestkitError> {
        let node = self.get_mut(addr)?;
        node.kill();
        let port = node.port();
        if !self.down.contains(&port) {
            self.down.push(port);
        }
        Ok(())
    }

    /// Restarts the node at `addr` (plain or TLS) on its ports and counts it
    /// live again.
    pub(crate) fn restart(&mut self, addr: &str) -> Result<(), TestkitError> {
        let node = self.get_mut(addr)?;
        node.restart()?;
        let port = node.port();
        self.down.retain(|p| *p != port);
        Ok(())
    }
}
