//! `fairlock-bench --topologies`: the 1,000-lock run on each topology the
//! README's table lists, so every row has a measured figure.
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
//! Redis CPU is summed over the primaries. RedLock has its own example
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
use crate::report::CellRecord;

/// One topology's measured cell for one implementation.
struct Row {
    topology: &'static str,
    implementation: &'static str,
    record: CellRecord,
}

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

/// Runs every topology; writes `topologies.md` and `topologies.jsonl` into
/// `out`. `Ok(false)` if any cell had violations.
pub async fn run(out: &Path, quick: bool) -> Result<bool> {
    let plan = plan(quick);
    let per_cell = plan.warmup_min.as_secs_f64() + plan.measure.as_secs_f64() + 3.0;
    let progress = Progress::new(per_cell * 14.0 + 60.0);
    let spin = SpinImpl::new(Duration::from_millis(10));
    let mut rows = Vec::new();

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
        rows.push(Row {
            topology,
            implementation: "fairlock",
            record,
        });
        if !topology.ends_with("replica_acks(1)") {
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
            rows.push(Row {
                topology,
                implementation: "spin-10ms",
                record,
            });
        }
    }
    progress.finish();

    let markdown = render(&rows, &plan, quick);
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("topologies.md"), &markdown)?;
    let mut jsonl = String::new();
    for row in &rows {
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

fn render(rows: &[Row], plan: &CellPlan, quick: bool) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# fairlock per topology\n");
    let _ = writeln!(
        md,
        "`cargo run --release -p fairlock-bench -- --topologies{}`: {} locks, {} contenders on {} \
         simulated client processes, hold {} ms (a GET, the hold, a SET), {:.1} s window. \
         Every server on 127.0.0.1, started by the test kit; Redis CPU summed over the primaries.\n",
        if quick { " --quick" } else { "" },
        plan.locks,
        plan.contenders,
        plan.clients,
        plan.hold.as_millis(),
        plan.measure.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "| topology | implementation | cycles/s | vs spin-10ms | wait p50 | wait p99 | Redis CPU per cycle | violations | errors |"
    );
    let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|");
    for row in rows {
        let spin = rows
            .iter()
            .find(|r| r.topology == row.topology && r.implementation == "spin-10ms")
            .or_else(|| {
                // Sentinel with acks is compared with Sentinel's spin lock.
                // (The TLS rows each have their own.)
                rows.iter()
                    .find(|r| r.topology == "Sentinel" && r.implementation == "spin-10ms")
            });
        let ratio = spin
            .filter(|s| s.record.cycles_per_s > 0.0)
            .map(|s| format!("{:.2}×", row.record.cycles_per_s / s.record.cycles_per_s))
            .unwrap_or_else(|| "-".to_owned());
        let c = &row.record;
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {} | {} | {:.1} µs | {} | {} |",
            row.topology,
            row.implementation,
            c.cycles_per_s,
            ratio,
            fmt_ms(c.wait_p50_ms),
            fmt_ms(c.wait_p99_ms),
            c.redis_cpu_us_per_cycle,
            c.violations,
            c.errors
        );
    }
    md
}

fn fmt_ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.2} ms"))
}
