//! Shared helpers of fairlock's integration tests: a fresh redis-server per
//! test (from fairlock-testkit), clients with short protocol timings so
//! fault tests finish quickly, and raw script calls for setting up states
//! that a well-behaved client never produces (a dead waiter, an expired
//! holder).
//!
//! One module per job: [`setup`] (servers and clients), [`raw_calls`]
//! (scripts straight on the server), [`redis_state`] (reading it),
//! [`waits`] (bounded waits), [`metrics`], [`lost_grants`] (faults made by
//! hand), [`verdicts`] shared by several test files, [`cluster_waiters`]
//! (waiters across a cluster disturbance), and the two proxies.

pub mod cluster_waiters;
pub mod local_metrics;
pub mod lost_grants;
pub mod metrics;
pub mod raw_calls;
pub mod redis_state;
pub mod setup;
pub mod silent_proxy;
pub mod switch_proxy;
pub mod verdicts;
pub mod waits;

pub use cluster_waiters::*;
pub use fairlock_testkit::{RedisServer, Resp};
pub use lost_grants::*;
pub use metrics::*;
pub use raw_calls::*;
pub use redis_state::*;
pub use setup::*;
pub use verdicts::*;
pub use waits::*;
