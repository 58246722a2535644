//! `fairlock-bench --topologies`: the 1,000-lock run on each topology the
//! README's table lists, so every row has a measured figure, and one lock
//! with one contender on each (but with `replica_acks`), in rounds, beside
//! fairlock with every call through fred, so a topology's per-call cost
//! and the script sockets' share of it show.
//!
//! Each topology is started by the test kit on 127.0.0.1: one server, a
//! Redis Cluster of 3 primaries with a replica each, and a Sentinel group
//! (a primary, 1 replica, 3 sentinels) used without and with
//! `replica_acks(1)`; then the same three over TLS (`rediss://...`, every
//! server also listening for TLS with a throwaway certificate authority
//! that the process trusts through `SSL_CERT_FILE`; always Redis, as the
//! Valkey build the kit installs has no TLS). fairlock runs beside the spin lock (`SET NX PX`,
//! 10 ms retry) in the same harness as the main benchmark: 1,000 locks,
//! 2,000 contenders on 4 simulated client processes, hold 1 ms, a
//! non-atomic GET + SET under each lock (a lost update is a violation).
//! Redis CPU is summed over the primaries. The tables are written by
//! `report/topologies.rs`. RedLock has its own example
//! (`cargo run --release -p fairlock-examples --example redlock`): its API
//! is not a drop-in for this harness's connection model.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use fairlock_testkit::{RedisCluster, RedisServer, SentinelGroup, ServerKind, TlsFiles};

use crate::admin::{Admin, OverTls};
use crate::cell::CellPlan;
use crate::impls::fairlock::{FairlockAcksImpl, FairlockImpl};
use crate::impls::spin::SpinImpl;
use crate::impls::{Implementation, Result};
use crate::measure_cell;
use crate::progress::Progress;
use crate::report::topologies::{render, TopologyRow, TopologyRun};
use crate::rounds::in_rounds;
use crate::with_impl;

/// The one-lock cell's implementations: fairlock as a user gets it, with
/// every call through fred, and the spin lock.
const ONE_LOCK: [Implementation; 3] = [
    Implementation::Fairlock,
    Implementation::FairlockFred,
    Implementation::Spin10,
];

fn plan(quick: bool) -> CellPlan {
    let ms = Duration::from_millis;
    CellPlan {
        contenders: 2_000,
        hold: ms(1),
        locks: 1_000,
        clients: 4,
        warmup_min: ms(if quick { 300 } else { 1_000 }),
        warmup_max: ms(if quick { 2_000 } else { 5_000 }),
        measure: ms(if quick { 1_500 } else { 6_000 }),
    }
}

/// One lock, one contender, no hold: a single lock's cycle.
fn one_lock_plan(quick: bool) -> CellPlan {
    let ms = Duration::from_millis;
    CellPlan {
        contenders: 1,
        hold: Duration::ZERO,
        locks: 1,
        clients: 1,
        warmup_min: ms(300),
        warmup_max: ms(2_000),
        measure: ms(if quick { 1_000 } else { 3_000 }),
    }
}

/// Runs every topology; writes `topologies.md` and `topologies.jsonl` into
/// `out`. `Ok(false)` if any cell had violations.
pub async fn run(out: &Path, quick: bool) -> Result<bool> {
    let plan = plan(quick);
    let one_plan = one_lock_plan(quick);
    let rounds = if quick { 1 } else { 3 };
    let per_cell = plan.warmup_min.as_secs_f64() + plan.measure.as_secs_f64() + 3.0;
    let per_one = one_plan.warmup_min.as_secs_f64() + one_plan.measure.as_secs_f64() + 1.0;
    let progress =
        Progress::new(per_cell * 19.0 + per_one * (6 * ONE_LOCK.len() * rounds) as f64 + 60.0);
    let spin = SpinImpl::new(Duration::from_millis(10));
    let mut rows = Vec::new();
    let mut one_rows = Vec::new();

    let topologies: [&'static str; 7] = [
        "one primary",
        "Redis Cluster 3+3",
        "Sentinel",
        "Sentinel + replica_acks(1)",
        "one primary, TLS",
        "Redis Cluster 3+3, TLS",
        "Sentinel, TLS",
    ];
    for topology in topologies {
        progress.step(&format!("starting {topology}"), 5.0);
        let admin = match topology {
            "one primary" => Admin::start()?,
            "Redis Cluster 3+3" => Admin::over(RedisCluster::start()?),
            "one primary, TLS" => {
                let files = trusted_tls_files()?;
                let server = RedisServer::builder().kind(ServerKind::Redis).tls(&files);
                Admin::over(OverTls::new(server.start()?, files)?)
            }
            "Redis Cluster 3+3, TLS" => {
                let files = trusted_tls_files()?;
                Admin::over(OverTls::new(RedisCluster::start_tls(&files)?, files)?)
            }
            "Sentinel, TLS" => {
                let files = trusted_tls_files()?;
                Admin::over(OverTls::new(SentinelGroup::start_tls(1, &files)?, files)?)
            }
            _ => Admin::over(SentinelGroup::start(1)?),
        };
        progress.step(&format!("{topology}: fairlock"), per_cell);
        let record = if topology.ends_with("replica_acks(1)") {
            measure_cell(
                &FairlockAcksImpl { replicas: 1 },
                Implementation::Fairlock,
                "topology",
                &admin,
                &plan,
                &progress,
            )
            .await?
        } else {
            measure_cell(
                &FairlockImpl,
                Implementation::Fairlock,
                "topology",
                &admin,
                &plan,
                &progress,
            )
            .await?
        };
        progress.println(&format!("{topology}: {}", record.summary()));
        rows.push(TopologyRow { topology, record });
        if !topology.ends_with("replica_acks(1)") {
            // Every call through fred: the script sockets' share of a
            // burst on this topology.
            progress.step(&format!("{topology}: fairlock-fred"), per_cell);
            let fred = Implementation::FairlockFred;
            let record = with_impl!(fred, lock => measure_cell(&lock, fred, "topology", &admin, &plan, &progress).await)?;
            progress.println(&format!("{topology}: {}", record.summary()));
            rows.push(TopologyRow { topology, record });
            progress.step(&format!("{topology}: spin-10ms"), per_cell);
            let record = measure_cell(
                &spin,
                Implementation::Spin10,
                "topology",
                &admin,
                &plan,
                &progress,
            )
            .await?;
            progress.println(&format!("{topology}: {}", record.summary()));
            rows.push(TopologyRow { topology, record });
            let what = format!("one lock on {topology}");
            let medians = in_rounds(&ONE_LOCK, rounds, &progress, &what, per_one, async |imp| {
                with_impl!(imp, lock => measure_cell(&lock, imp, "topology_one_lock", &admin, &one_plan, &progress).await)
            })
            .await?;
            one_rows.extend(
                medians
                    .into_iter()
                    .map(|record| TopologyRow { topology, record }),
            );
        }
    }
    progress.finish();

    let markdown = render(&TopologyRun {
        many: &rows,
        many_plan: &plan,
        one: &one_rows,
        one_plan: &one_plan,
        rounds,
        quick,
    });
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("topologies.md"), &markdown)?;
    let mut jsonl = String::new();
    for row in rows.iter().chain(&one_rows) {
        let mut value = serde_json::to_value(&row.record)?;
        if let Some(object) = value.as_object_mut() {
            object.insert("topology".to_owned(), row.topology.into());
        }
        let _ = writeln!(jsonl, "{value}");
    }
    std::fs::write(out.join("topologies.jsonl"), jsonl)?;
    println!("{markdown}");
    eprintln!("results written to {}", out.join("topologies.md").display());
    Ok(rows.iter().all(|r| r.record.violations == 0))
}

/// A new certificate authority and server certificate, trusted by this
/// process from now on: `SSL_CERT_FILE` names the authority, and the TLS
/// setup of every client made afterwards reads it (only the TLS rows' are).
fn trusted_tls_files() -> Result<TlsFiles> {
    let files = TlsFiles::generate()?;
    // The benchmark runs one topology at a time and nothing else sets it.
    files.trust();
    Ok(files)
}
