//! Lanes for the rounds of the waiter heartbeat and the lease watchdog:
//! a round's calls are grouped by lane (on a Redis Cluster, the slot they
//! touch; on a single server, one lane), and a lane runs one round's work
//! at a time, independently of the others.
//!
//! A round used to wait for all of its calls before the next could start,
//! so one node that stopped answering (a stall, a paused or overloaded
//! primary) held every slot's next round back until its calls timed out:
//! with the default command timeout (5 s) equal to the waiter timeout,
//! the waiters and held leases on the healthy nodes went unrefreshed long
//! enough to be taken for dead or lost. Now a round starts the lanes that
//! are idle; a lane still busy with an earlier round is passed by and runs
//! again as soon as its work ends, so a round asked for meanwhile (a tick,
//! a heartbeat asked for at once) is never lost, only late on that lane.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::Hash;

use tokio::task::{self, JoinSet};

/// The work of a task's rounds, by lane.
pub(crate) struct Lanes<K> {
    running: JoinSet<()>,
    /// The lane each running task belongs to; work started with
    /// [`Lanes::spawn_free`] has none.
    lane_of: HashMap<task::Id, K>,
    busy: HashSet<K>,
    /// Lanes a round passed by while they were busy.
    missed: HashSet<K>,
}

impl<K: Copy + Eq + Hash> Lanes<K> {
    pub(crate) fn new() -> Self {
        Self {
            running: JoinSet::new(),
            lane_of: HashMap::new(),
            busy: HashSet::new(),
            missed: HashSet::new(),
        }
    }

    /// Starts `work` on `lane`, unless the lane's earlier work still runs:
    /// then the lane is marked to run again once that ends, and `work` is
    /// dropped (the caller builds it again from the state of that moment).
    pub(crate) fn start(&mut self, lane: K, work: impl Future<Output = ()> + Send + 'static) {
        if !self.busy.insert(lane) {
            self.missed.insert(lane);
            return;
        }
        let id = self.running.spawn(work).id();
        self.lane_of.insert(id, lane);
    }

    /// Whether `lane` has work running.
    #[cfg(test)]
    fn is_busy(&self, lane: K) -> bool {
        self.busy.contains(&lane)
    }

    /// Starts `work` outside every lane (each such piece is run once,
    /// whatever runs beside it).
    pub(crate) fn spawn_free(&mut self, work: impl Future<Output = ()> + Send + 'static) {
        self.running.spawn(work);
    }

    /// Waits until a piece of work ends; returns its lane if a round passed
    /// that lane by meanwhile, to be run again now. Pending while nothing
    /// runs (made for a `select!` beside the task's ticker).
    pub(crate) async fn ended(&mut self) -> Option<K> {
        let id = match self.running.join_next_with_id().await {
            Some(Ok((id, ()))) => id,
            Some(Err(error)) => {
                tracing::warn!(%error, "a fairlock background call failed");
                error.id()
            }
            None => return std::future::pending().await,
        };
        let lane = self.lane_of.remove(&id)?;
        self.busy.remove(&lane);
        self.missed.remove(&lane).then_some(lane)
    }

    /// Waits for all work running (each piece is bounded by the command
    /// timeout): the task's last act before it stops.
    pub(crate) async fn finish(&mut self) {
        while self.running.join_next().await.is_some() {}
        self.lane_of.clear();
        self.busy.clear();
        self.missed.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::sync::oneshot;

    use super::Lanes;

    /// A busy lane does not hold up another lane; a round that passed it
    /// by is handed back once its work ends, once however many rounds
    /// passed.
    #[tokio::test]
    async fn a_busy_lane_is_passed_by_and_run_again_when_free() {
        let mut lanes = Lanes::new();
        let (unblock, blocked) = oneshot::channel::<()>();
        lanes.start(1u16, async move {
            let _ = blocked.await;
        });
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let ran = Arc::clone(&ran);
            lanes.start(1, async move {
                ran.fetch_add(1, Ordering::SeqCst);
            });
        }
        let other = Arc::clone(&ran);
        lanes.start(2, async move {
            other.fetch_add(10, Ordering::SeqCst);
        });
        assert_eq!(lanes.ended().await, None, "lane 2 ended, nothing missed");
        assert_eq!(
            ran.load(Ordering::SeqCst),
            10,
            "lane 1's later work dropped"
        );
        assert!(lanes.is_busy(1) && !lanes.is_busy(2));
        let _ = unblock.send(());
        assert_eq!(lanes.ended().await, Some(1), "lane 1 missed rounds");
        assert!(!lanes.is_busy(1));
        lanes.start(1, async {});
        assert_eq!(lanes.ended().await, None);
        lanes.finish().await;
    }
}
