//! Throwaway `redis-server` (or `valkey-server`) processes and topologies on
//! 127.0.0.1 for fairlock's integration tests, examples and benchmarks.
//!
//! One module per job, each topology a type that owns its processes and
//! tears them down on drop:
//!
//! * [`install`]: locates (and, as root on Debian/Ubuntu, installs) the
//!   server binaries: [`ensure_redis_server`], [`ensure_valkey_server`];
//!   the tools some tests drive ([`ensure_debian_binaries`]); libfaketime
//!   ([`ensure_libfaketime`]).
//! * [`version`]: Redis or Valkey ([`ServerKind`], chosen with
//!   `FAIRLOCK_TEST_SERVER=valkey`) and which features a version has
//!   ([`ServerVersion`]).
//! * [`RedisServer`]: one child server on a free port with its own temp dir
//!   and no persistence. It is SIGKILLed and cleaned up on drop (also when a
//!   test panics), and it dies with the test process (`PR_SET_PDEATHSIG`).
//!   Its ports are reserved for its whole life, killed or not, across test
//!   processes (a lock file per port in `/tmp/fairlock-ports`), from a
//!   range outside the kernel's ephemeral ports.
//! * [`RedisServerBuilder::clock_offset`]: a server whose wall clock runs
//!   ahead of (or behind) the test's, under libfaketime, so a test can tell
//!   the server's clock from its own.
//! * [`RedisServer::cmd`] / [`cmd_at`]: a minimal blocking RESP2 client for
//!   admin commands, so tests can inspect Redis without the library under
//!   test; [`RedisServer::commandstats`] and [`RedisServer::info`] read stats.
//! * [`RedisCluster`]: 3 primaries with a replica each, slot migration and
//!   fail-over helpers.
//! * [`key_slot`]: a key's hash slot, computed as the server does.
//! * [`SentinelGroup`]: a primary, replicas and 3 sentinels.
//! * [`TlsFiles`]: a throwaway CA and server certificate, for a server
//!   ([`RedisServerBuilder::tls`]), a cluster ([`RedisCluster::start_tls`])
//!   or a sentinel group ([`SentinelGroup::start_tls`]) that also listens
//!   for TLS (always Redis: the Valkey build the suite installs has no TLS).
//! * [`IndependentPrimaries`]: N unrelated primaries for a RedLock mode.
//! * [`RedisTarget::from_env_or_start`]: uses `REDIS_URL` when set, and
//!   otherwise starts a throwaway server (for examples and benchmarks).
//!
//! ```no_run
//! use fairlock_testkit::{RedisServer, Resp};
//!
//! let server = RedisServer::builder().arg("--maxclients").arg("100").start()?;
//! assert_eq!(server.cmd(&["PING"])?, Resp::Simple("PONG".into()));
//! println!("connect the library under test to {}", server.url());
//! # Ok::<(), fairlock_testkit::TestkitError>(())
//! ```

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod clock;
mod cluster;
mod cluster_view;
mod error;
pub mod install;
mod nodes;
mod ports;
mod primaries;
mod process;
mod prometheus;
mod resp;
mod sentinel;
mod server;
mod slots;
mod stats;
mod target;
mod tls;
pub mod version;

pub use cluster::RedisCluster;
pub use error::TestkitError;
pub use install::{
    ensure_debian_binaries, ensure_libfaketime, ensure_redis_server, ensure_valkey_server,
};
pub use primaries::IndependentPrimaries;
pub use prometheus::{
    ensure_prometheus, PromSample, PrometheusBins, PrometheusError, PrometheusServer,
    PrometheusServerBuilder, SCRAPE_JOB,
};
pub use resp::{cmd_at, Resp};
pub use sentinel::SentinelGroup;
pub use server::{RedisServer, RedisServerBuilder};
pub use slots::key_slot;
pub use stats::parse_fields;
pub use target::RedisTarget;
pub use tls::TlsFiles;
pub use version::{ServerKind, ServerVersion};
