//! Which script socket a call goes on (`script_socket/` is the socket
//! itself): on a single server and behind Sentinel one pair, a socket per
//! command lane; on a cluster one pair per node, opened when a call first
//! goes to that node, at the node fred's slot map names for the call's
//! slot.
//!
//! On a cluster a call that meets a slot elsewhere (`MOVED`, `ASK`: a
//! migration, a fail-over fred's map has not caught up with) or a cluster
//! that cannot serve it yet (`TRYAGAIN`, `CLUSTERDOWN`) ran nothing there,
//! and goes through fred, which follows the redirection, reads its map
//! again and resends (`calls.rs`). A pair is kept for each node a call
//! went to while fred's map names that node as a primary: when a call
//! first goes to a node, the pairs of nodes the map no longer names (a
//! node removed, or one that became a replica) are dropped, their
//! connections closed once the calls on them end.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::script_socket::ScriptSocket;

/// A socket per command lane, `[waiters, holders]`.
pub(super) type Pair = [ScriptSocket; 2];

/// The script sockets of a client (see the module docs).
pub(super) struct Sockets {
    place: Place,
    /// The URL's database (none on a cluster).
    pub(super) database: Option<u8>,
    /// Limit for connecting and logging in.
    pub(super) connect_timeout: Duration,
}

/// Where the sockets connect.
enum Place {
    /// The single server, or the primary fred follows behind Sentinel.
    One(Arc<Pair>),
    /// One pair per cluster node, by `host:port`, in the order first used.
    PerNode(Mutex<Vec<(String, Arc<Pair>)>>),
}

fn new_pair() -> Arc<Pair> {
    Arc::new([ScriptSocket::new(), ScriptSocket::new()])
}

impl Sockets {
    /// One pair, for a single server or behind Sentinel.
    pub(super) fn one(database: Option<u8>, connect_timeout: Duration) -> Self {
        Self {
            place: Place::One(new_pair()),
            database,
            connect_timeout,
        }
    }

    /// A pair per node, for a cluster.
    pub(super) fn per_node(connect_timeout: Duration) -> Self {
        Self {
            place: Place::PerNode(Mutex::new(Vec::new())),
            database: None,
            connect_timeout,
        }
    }

    /// Whether there is a pair per cluster node.
    pub(super) fn per_node_of_slot(&self) -> bool {
        matches!(self.place, Place::PerNode(_))
    }

    /// The pair for a call: the one pair, or on a cluster the pair of
    /// `node` (the node serving the call's slot), made on first use.
    /// `None` on a cluster without a node (fred's map names none yet).
    /// When a pair is made, the pairs of nodes not among `primaries` (the
    /// primaries fred's map names now, asked for only then) are dropped.
    pub(super) fn pair(
        &self,
        node: Option<&str>,
        primaries: impl FnOnce() -> Vec<String>,
    ) -> Option<Arc<Pair>> {
        match &self.place {
            Place::One(pair) => Some(pair.clone()),
            Place::PerNode(nodes) => {
                let node = node?;
                let mut nodes = nodes.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((_, pair)) = nodes.iter().find(|(at, _)| at == node) {
                    return Some(pair.clone());
                }
                let primaries = primaries();
                // A map not read yet (or being read again) names none.
                if !primaries.is_empty() {
                    nodes.retain(|(at, _)| primaries.contains(at));
                }
                let pair = new_pair();
                nodes.push((node.to_owned(), pair.clone()));
                Some(pair)
            }
        }
    }

    /// Every pair made so far, with its node on a cluster.
    pub(super) fn all(&self) -> Vec<(Option<String>, Arc<Pair>)> {
        match &self.place {
            Place::One(pair) => vec![(None, pair.clone())],
            Place::PerNode(nodes) => nodes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(node, pair)| (Some(node.clone()), pair.clone()))
                .collect(),
        }
    }
}

/// Whether an error a cluster node answered on a socket means the call ran
/// nothing there and fred is to send it (see the module docs).
pub(super) fn elsewhere_in_the_cluster(error: &str) -> bool {
    ["MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN"]
        .iter()
        .any(|prefix| error.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::{elsewhere_in_the_cluster, Sockets};
    use std::sync::Arc;
    use std::time::Duration;

    /// On a cluster each node gets its own pair, the same one on every
    /// call; elsewhere there is one pair whatever the node.
    #[test]
    fn a_pair_per_node_on_a_cluster_and_one_elsewhere() {
        let both = || vec!["127.0.0.1:7000".to_owned(), "127.0.0.1:7001".to_owned()];
        let cluster = Sockets::per_node(Duration::from_secs(1));
        let a = cluster.pair(Some("127.0.0.1:7000"), both).expect("a");
        let b = cluster.pair(Some("127.0.0.1:7001"), both).expect("b");
        assert!(!Arc::ptr_eq(&a, &b));
        let again = cluster.pair(Some("127.0.0.1:7000"), both).expect("a again");
        assert!(Arc::ptr_eq(&a, &again));
        assert!(cluster.pair(None, both).is_none(), "no node known: fred");
        assert_eq!(cluster.all().len(), 2);

        let one = Sockets::one(None, Duration::from_secs(1));
        let x = one.pair(Some("127.0.0.1:7000"), both).expect("x");
        let y = one.pair(None, both).expect("y");
        assert!(Arc::ptr_eq(&x, &y));
    }

    /// A node fred's map no longer names as a primary loses its pair when
    /// a call first goes to another node; a pair in use is not asked to
    /// check, and the map is read only when a pair is made.
    #[test]
    fn a_pair_goes_when_its_node_leaves_the_map() {
        let cluster = Sockets::per_node(Duration::from_secs(1));
        let named = |nodes: &[&str]| nodes.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let a = cluster
            .pair(Some("127.0.0.1:7000"), || named(&["127.0.0.1:7000"]))
            .expect("a");
        cluster
            .pair(Some("127.0.0.1:7001"), || {
                named(&["127.0.0.1:7000", "127.0.0.1:7001"])
            })
            .expect("b");
        let again = cluster
            .pair(Some("127.0.0.1:7000"), || {
                panic!("not read for a pair that exists")
            })
            .expect("a again");
        assert!(Arc::ptr_eq(&a, &again));
        // 7000 left the map: its slots moved to 7001 and the new 7002.
        cluster
            .pair(Some("127.0.0.1:7002"), || {
                named(&["127.0.0.1:7001", "127.0.0.1:7002"])
            })
            .expect("c");
        let nodes: Vec<_> = cluster
            .all()
            .into_iter()
            .filter_map(|(node, _)| node)
            .collect();
        assert_eq!(nodes, named(&["127.0.0.1:7001", "127.0.0.1:7002"]));
        assert_eq!(
            Arc::strong_count(&a),
            2,
            "dropped by the sockets: held here only"
        );
        // A map that names no primary (not read yet) drops nothing.
        cluster.pair(Some("127.0.0.1:7003"), Vec::new).expect("d");
        assert_eq!(cluster.all().len(), 3);
    }

    /// Redirections and a cluster not ready send the call to fred; a
    /// script's own error does not.
    #[test]
    fn redirections_go_to_fred_and_script_errors_do_not() {
        for error in [
            "MOVED 3999 127.0.0.1:7001",
            "ASK 3999 127.0.0.1:7001",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
        ] {
            assert!(elsewhere_in_the_cluster(error), "{error}");
        }
        for error in [
            "ERR fairlock acquire: bad",
            "WRONGTYPE Operation",
            "READONLY",
        ] {
            assert!(!elsewhere_in_the_cluster(error), "{error}");
        }
    }
}
