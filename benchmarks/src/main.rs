//! fairlock-bench: one hot Redis lock, fairlock side by side with the locks
//! users would otherwise pick (a hand-written spin-poll lock, rslock), all
//! in one run against a throwaway redis-server on 127.0.0.1.
//!
//! ```text
//! cargo run --release -p fairlock-bench -- --quick   # 2-3 minutes
//! cargo run --release -p fairlock-bench              # the full matrix
//! ```
//!
//! Results go to `benchmarks/results/` (results.jsonl, results.md, SVG
//! charts); the markdown is also printed. See benchmarks/README.md for
//! what every column means.

mod admin;
mod busy_cpus;
mod cell;
mod hold;
mod impls;
mod probes;
mod processes;
mod progress;
mod report;
mod rounds;
mod stats;
mod topologies;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use admin::Admin;
use cell::{run_cell, CellPlan};
use impls::{Implementation, LockImpl, Result};
use progress::Progress;
use report::{CellRecord, Results, RunInfo, UncontendedRecord, WaitersRecord};
use rounds::in_rounds;

/// Simulated client processes per cell, unless `--clients` says otherwise:
/// 8, as issue 11's independent harness spread its contenders over 8
/// `LockClient`s of one process.
const CLIENTS: usize = 8;

const USAGE: &str = "\
usage: fairlock-bench [--quick] [--out DIR] [--impl NAME]... [--cell C:H]... [--many-locks] [--waiters] [--clients N] [--rounds N] [--busy-cpus]
       fairlock-bench --topologies [--quick] [--out DIR]

  --quick      fewer cells and shorter windows (2-3 minutes)
  --topologies only the 1,000-lock run, on one server, a 3+3 Redis Cluster,
               Sentinel (1 replica) and Sentinel with replica_acks(1), and
               the first three again over TLS: fairlock beside
               fairlock-fred (not with replica_acks) and spin-10ms;
               then one lock with one contender on each (but with
               replica_acks), 3 rounds of fairlock, fairlock-fred and
               spin-10ms; written to topologies.md (about 8 minutes)
  --out DIR    where to write results (default: benchmarks/results)
  --impl NAME  only this implementation (repeatable): fairlock, spin-10ms,
               spin-100ms, rslock, rslock-10ms; or fairlock-fred (fairlock
               with direct_calls(false), only when named)
  --cell C:H   only this one-hot-lock cell, C contenders holding H ms
               (repeatable; e.g. --cell 1:0 --cell 64:1), for a look at
               one spot; the report then covers these cells only
  --processes N  with --cell: run those cells with the contenders in N
               separate OS processes instead of simulated clients of one
               (every run without --cell has one such cell: C=1024,
               H=1 ms in 4 processes; C=256 with --quick)
  --many-locks only the 1,000-lock cell (1,000 locks x 64 contenders;
               16 per lock with --quick), for a look at that one target
  --waiters    only the fairlock waiter-memory probes (10,000 waiters on
               one lock; 100,000 over 1,000 locks, 20,000 over 200 with
               --quick), for a look at the memory targets
  --clients N  simulated client processes (LockClients) per cell, 1 to 64
               (default 8)
  --rounds N   measure each cell (one hot lock, across processes, 1,000
               locks) in N rounds, 1 to 9, the implementations' order
               rotating from round to round; each row is its
               implementation's median round (default 3 in the full run
               and with --many-locks, 1 with --quick or --cell)
  --busy-cpus  a diagnostic, not a measure (needs --out): one spinner per
               CPU at the lowest priority (SCHED_IDLE) for the whole run,
               so no CPU goes idle between messages; compared with a run
               without it, shows how much of a gap is the machine waking
               idle CPUs (see src/busy_cpus.rs)
";

/// What the command line asked for.
struct Options {
    quick: bool,
    topologies: bool,
    out: PathBuf,
    impls: Vec<Implementation>,
    /// Cells asked for with `--cell` (empty: the mode's matrix).
    cells: Vec<(usize, Duration)>,
    /// `--processes`: run the `--cell` cells in this many OS processes.
    processes: Option<usize>,
    /// `--many-locks`: only the many-locks cell.
    many_locks_only: bool,
    /// `--waiters`: only the waiter-memory probes.
    waiters_only: bool,
    /// `--clients`: simulated client processes per cell.
    clients: usize,
    /// `--rounds`: rounds of each cell (`None`: the mode's).
    rounds: Option<usize>,
    /// `--busy-cpus`: spinners keep every CPU busy (`busy_cpus.rs`).
    busy_cpus: bool,
    /// Whether `--out` was given.
    out_given: bool,
}

/// `C:H` of `--cell`: contenders and hold in milliseconds.
fn parse_cell(text: &str) -> std::result::Result<(usize, Duration), String> {
    let bad = || format!("--cell wants C:H (contenders:hold ms), not {text:?}");
    let (c, h) = text.split_once(':').ok_or_else(bad)?;
    let contenders: usize = c.parse().map_err(|_| bad())?;
    let hold: u64 = h.parse().map_err(|_| bad())?;
    if contenders == 0 || contenders > 100_000 || hold > 10_000 {
        return Err(bad());
    }
    Ok((contenders, Duration::from_millis(hold)))
}

fn parse_args() -> std::result::Result<Options, String> {
    let mut options = Options {
        quick: false,
        topologies: false,
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results"),
        impls: Vec::new(),
        cells: Vec::new(),
        processes: None,
        many_locks_only: false,
        waiters_only: false,
        clients: CLIENTS,
        rounds: None,
        busy_cpus: false,
        out_given: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--topologies" => options.topologies = true,
            "--out" => {
                options.out = PathBuf::from(args.next().ok_or("--out needs a directory")?);
                options.out_given = true;
            }
            "--busy-cpus" => options.busy_cpus = true,
            "--impl" => {
                let name = args.next().ok_or("--impl needs a name")?;
                options.impls.push(
                    Implementation::from_label(&name)
                        .ok_or_else(|| format!("unknown implementation {name:?}"))?,
                );
            }
            "--cell" => {
                let cell = args.next().ok_or("--cell needs C:H")?;
                options.cells.push(parse_cell(&cell)?);
            }
            "--processes" => {
                let n = args.next().ok_or("--processes needs a count")?;
                match n.parse::<usize>() {
                    Ok(n) if (1..=64).contains(&n) => options.processes = Some(n),
                    _ => return Err(format!("--processes wants 1 to 64, not {n:?}")),
                }
            }
            "--many-locks" => options.many_locks_only = true,
            "--waiters" => options.waiters_only = true,
            "--clients" => {
                let n = args.next().ok_or("--clients needs a count")?;
                match n.parse::<usize>() {
                    Ok(n) if (1..=64).contains(&n) => options.clients = n,
                    _ => return Err(format!("--clients wants 1 to 64, not {n:?}")),
                }
            }
            "--rounds" => {
                let n = args.next().ok_or("--rounds needs a count")?;
                match n.parse::<usize>() {
                    Ok(n) if (1..=9).contains(&n) => options.rounds = Some(n),
                    _ => return Err(format!("--rounds wants 1 to 9, not {n:?}")),
                }
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if options.waiters_only && !options.impls.is_empty() {
        return Err("--waiters measures fairlock only; drop --impl".to_owned());
    }
    if options.impls.is_empty() {
        options.impls = Implementation::ALL.to_vec();
    }
    if options.busy_cpus && options.topologies {
        return Err("--busy-cpus is for the one-hot-lock cells, not --topologies".to_owned());
    }
    if options.busy_cpus && !options.out_given {
        return Err(
            "--busy-cpus needs --out: its figures are a diagnostic and must not replace the benchmark's results"
                .to_owned(),
        );
    }
    if options.processes.is_some() && options.cells.is_empty() {
        return Err("--processes needs at least one --cell".to_owned());
    }
    let pickers = [
        options.many_locks_only,
        options.waiters_only,
        !options.cells.is_empty(),
    ];
    if pickers.iter().filter(|picked| **picked).count() > 1 {
        return Err("--many-locks, --waiters and --cell each pick what to run; use one".to_owned());
    }
    Ok(options)
}

/// The measurements of one run and their durations.
struct Plan {
    mode: &'static str,
    impls: Vec<Implementation>,
    /// (contenders, hold) of the one-hot-lock cells.
    cells: Vec<(usize, Duration)>,
    warmup_min: Duration,
    warmup_max: Duration,
    measure: Duration,
    latency_iterations: usize,
    /// The waiter probes (fairlock): (waiters, locks) of each.
    waiters: Vec<(usize, usize)>,
    /// The many-locks cell: this many distinct locks...
    many_locks: usize,
    /// ...with this many contenders each...
    many_per_lock: usize,
    /// ...measured this long, after a warm-up of at most this long (every
    /// contender's first cycle takes longer than on one lock).
    many_measure: Duration,
    many_warmup_max: Duration,
    /// Whether the waiter probes run (not with `--cell`, `--many-locks`).
    waiter_probes: bool,
    /// Whether the many-locks cell runs (not with `--cell`).
    many_locks_cell: bool,
    /// One-hot-lock cells whose contenders run in separate OS processes,
    /// and how many processes.
    process_cells: Vec<(usize, Duration)>,
    processes: usize,
    /// Simulated client processes of each in-process cell.
    clients: usize,
    /// Rounds of each cell: one hot lock, across processes, 1,000 locks
    /// (`rounds.rs`).
    rounds: usize,
    /// `--busy-cpus`: spinners run beside the measurements, one per CPU
    /// (0: none).
    busy_cpus: usize,
}

impl Plan {
    fn new(options: &Options) -> Plan {
        let mut plan = Plan::for_mode(options);
        if options.many_locks_only {
            plan.cells = Vec::new();
            plan.process_cells = Vec::new();
            plan.waiter_probes = false;
        }
        if options.waiters_only {
            plan.cells = Vec::new();
            plan.process_cells = Vec::new();
            plan.many_locks_cell = false;
            plan.impls = vec![Implementation::Fairlock];
        }
        if !options.cells.is_empty() {
            plan.waiter_probes = false;
            plan.many_locks_cell = false;
            plan.process_cells = Vec::new();
            match options.processes {
                Some(n) => {
                    plan.cells = Vec::new();
                    plan.process_cells = options.cells.clone();
                    plan.processes = n;
                }
                None => plan.cells = options.cells.clone(),
            }
            // A look at one spot: once, unless asked.
            plan.rounds = 1;
        }
        if let Some(rounds) = options.rounds {
            plan.rounds = rounds;
        }
        if options.busy_cpus {
            plan.busy_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        }
        plan
    }

    fn for_mode(options: &Options) -> Plan {
        let ms = Duration::from_millis;
        if options.quick {
            Plan {
                mode: "quick",
                impls: options.impls.clone(),
                cells: vec![(1, ms(1)), (64, ms(1)), (256, ms(1)), (64, ms(0))],
                warmup_min: ms(300),
                warmup_max: ms(2000),
                measure: ms(1500),
                latency_iterations: 300,
                // The second probe shrunk: 100 waiters per lock, as in full.
                waiters: vec![(10_000, 1), (20_000, 200)],
                many_locks: 1000,
                many_per_lock: 16,
                many_measure: ms(1000),
                many_warmup_max: ms(5000),
                waiter_probes: true,
                many_locks_cell: true,
                process_cells: vec![(256, ms(1))],
                processes: 4,
                clients: options.clients,
                rounds: 1,
                busy_cpus: 0,
            }
        } else {
            let mut cells = Vec::new();
            for hold in [ms(0), ms(1)] {
                for contenders in [1, 8, 64, 256, 1024] {
                    cells.push((contenders, hold));
                }
            }
            Plan {
                mode: "full",
                impls: options.impls.clone(),
                cells,
                warmup_min: ms(1000),
                warmup_max: ms(5000),
                measure: ms(8000),
                latency_iterations: 2000,
                waiters: vec![(10_000, 1), (100_000, 1_000)],
                many_locks: 1000,
                many_per_lock: 64,
                many_measure: ms(6000),
                many_warmup_max: ms(15000),
                waiter_probes: true,
                many_locks_cell: true,
                process_cells: vec![(1024, ms(1))],
                processes: 4,
                clients: options.clients,
                // The ratio targets are read from these cells, and the
                // 1,000-lock figure swings as much: see rounds.rs.
                rounds: 3,
                busy_cpus: 0,
            }
        }
    }

    fn cell_plan(&self, contenders: usize, hold: Duration) -> CellPlan {
        CellPlan {
            contenders,
            hold,
            locks: 1,
            clients: self.clients,
            warmup_min: self.warmup_min,
            warmup_max: self.warmup_max,
            measure: self.measure,
        }
    }

    fn many_locks_plan(&self) -> CellPlan {
        CellPlan {
            contenders: self.many_locks * self.many_per_lock,
            hold: Duration::from_millis(1),
            locks: self.many_locks,
            clients: self.clients,
            warmup_min: self.warmup_min,
            warmup_max: self.many_warmup_max,
            measure: self.many_measure,
        }
    }

    /// Rough seconds of a cell, for the progress bar.
    fn cell_seconds(plan: &CellPlan) -> f64 {
        let warmup = plan.warmup_min.as_secs_f64()
            + (plan.contenders as f64 * 0.002).min(plan.warmup_max.as_secs_f64());
        warmup + plan.measure.as_secs_f64() + 0.5
    }

    /// Rough seconds of a waiter probe, for the progress bar.
    fn waiters_seconds(waiters: usize) -> f64 {
        2.0 + waiters as f64 * 0.000_2
    }

    fn estimated_seconds(&self) -> f64 {
        let n = self.impls.len() as f64;
        let cells: f64 = self
            .cells
            .iter()
            .map(|&(c, h)| Plan::cell_seconds(&self.cell_plan(c, h)))
            .sum::<f64>()
            * n
            * self.rounds as f64;
        let latency = self.latency_iterations as f64 * 0.0004 * n + n;
        let processes: f64 = self
            .process_cells
            .iter()
            .map(|&(c, h)| Plan::cell_seconds(&self.cell_plan(c, h)) + 4.0)
            .sum::<f64>()
            * n
            * self.rounds as f64;
        let many = if self.many_locks_cell {
            Plan::cell_seconds(&self.many_locks_plan()) * n * self.rounds as f64
        } else {
            0.0
        };
        let waiters = if self.waiter_probes && self.impls.contains(&Implementation::Fairlock) {
            self.waiters
                .iter()
                .map(|&(waiters, _)| Plan::waiters_seconds(waiters))
                .sum()
        } else {
            0.0
        };
        cells + processes + latency + waiters + many
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let first = args.next();
    if first.as_deref() == Some(busy_cpus::SPINNER_FLAG) {
        let error = busy_cpus::spinner_main();
        eprintln!("fairlock-bench spinner: {error}");
        return ExitCode::FAILURE;
    }
    if first.as_deref() == Some(processes::WORKER_FLAG) {
        let spec = args.next().unwrap_or_default();
        return match processes::worker_main(&spec) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("fairlock-bench worker: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let options = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("fairlock-bench: {message}");
            }
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("fairlock-bench: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = if options.topologies {
        runtime.block_on(topologies::run(&options.out, options.quick))
    } else {
        runtime.block_on(run(&options))
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("fairlock-bench: some cell had violations (lost updates); see the report");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("fairlock-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs everything; `Ok(false)` if any cell had violations.
async fn run(options: &Options) -> Result<bool> {
    let started = Instant::now();
    let plan = Plan::new(options);
    let admin = Admin::start()?;
    // Stopped when dropped, at the end of the run or on an error.
    let _busy = match plan.busy_cpus {
        0 => None,
        count => Some(busy_cpus::BusyCpus::start(count)?),
    };
    let progress = Progress::new(plan.estimated_seconds());
    let mut results = Results::new(run_info(&plan, &admin).await?);

    for &imp in &plan.impls {
        progress.step(&format!("uncontended: {}", imp.label()), 1.0);
        let (latency, ping) = with_impl!(imp, lock => probes::uncontended(&lock, &admin, plan.latency_iterations).await)?;
        // The reference round trip: the PINGs interleaved with fairlock's
        // (or the first implementation's) uncontended calls.
        if results.ping.is_none() || imp == Implementation::Fairlock {
            results.ping = Some(ping);
        }
        results
            .uncontended
            .push(UncontendedRecord::new(imp, latency, ping));
        let queued = imp == Implementation::Fairlock;
        let costs = with_impl!(imp, lock => probes::operation_costs(&lock, &admin, queued).await)?;
        results.costs.push((imp.label().to_owned(), costs));
    }

    if plan.impls.contains(&Implementation::Fairlock) && plan.waiter_probes {
        for &(waiters, locks) in &plan.waiters {
            progress.step(
                &format!("{waiters} waiters on {locks} lock(s)"),
                Plan::waiters_seconds(waiters),
            );
            let cost = probes::fairlock_waiters(&admin, waiters, locks, &progress).await?;
            results.waiters.push(WaitersRecord::from(&cost));
        }
    }

    for &(contenders, hold) in &plan.cells {
        let cell = plan.cell_plan(contenders, hold);
        let what = format!("C={contenders} H={}ms", hold.as_millis());
        let medians = in_rounds(&plan.impls, plan.rounds, &progress, &what, Plan::cell_seconds(&cell), async |imp| {
            with_impl!(imp, lock => measure_cell(&lock, imp, "cell", &admin, &cell, &progress).await)
        })
        .await?;
        results.cells.extend(medians);
    }

    // In rounds too: across processes the drift is the same machine's.
    for &(contenders, hold) in &plan.process_cells {
        let cell = plan.cell_plan(contenders, hold);
        let what = format!(
            "C={contenders} H={}ms in {} processes",
            hold.as_millis(),
            plan.processes
        );
        let seconds = Plan::cell_seconds(&cell) + 4.0;
        let medians = in_rounds(
            &plan.impls,
            plan.rounds,
            &progress,
            &what,
            seconds,
            async |imp| {
                let run =
                    processes::run_cell_in_processes(imp, &admin, &cell, plan.processes, &progress)
                        .await?;
                let top_level = with_impl!(imp, lock => lock.top_level_commands());
                let metrics = stats::summarize(&run, top_level);
                Ok(CellRecord::new("processes", imp, &run, &metrics))
            },
        )
        .await?;
        results.processes.extend(medians);
    }

    // In rounds too: its figure swung from 9,000 to 14,000 cycles/s between
    // runs of one window each.
    if plan.many_locks_cell {
        let many = plan.many_locks_plan();
        let what = format!("{} locks", many.locks);
        let medians = in_rounds(&plan.impls, plan.rounds, &progress, &what, Plan::cell_seconds(&many), async |imp| {
            with_impl!(imp, lock => measure_cell(&lock, imp, "many_locks", &admin, &many, &progress).await)
        })
        .await?;
        results.many_locks.extend(medians);
    }
    progress.finish();

    results.info.duration_s = started.elapsed().as_secs_f64();
    let markdown = report::write_all(&results, &options.out)?;
    println!("{markdown}");
    eprintln!("results written to {}", options.out.display());
    let clean = results
        .cells
        .iter()
        .chain(&results.processes)
        .chain(&results.many_locks)
        .all(|c| c.violations == 0);
    Ok(clean)
}

/// Runs one cell and summarizes it as a report record of `kind`.
pub(crate) async fn measure_cell<L: LockImpl>(
    lock: &L,
    imp: Implementation,
    kind: &'static str,
    admin: &Admin,
    plan: &CellPlan,
    progress: &Progress,
) -> Result<CellRecord> {
    let run = run_cell(lock, admin, plan, progress).await?;
    let metrics = stats::summarize(&run, lock.top_level_commands());
    Ok(CellRecord::new(kind, imp, &run, &metrics))
}

async fn run_info(plan: &Plan, admin: &Admin) -> Result<RunInfo> {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    // The command as given, so that a run of some cells (`--cell`) or a
    // diagnostic (`--busy-cpus`) is never taken for the full matrix.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = if args.is_empty() {
        "cargo run --release -p fairlock-bench".to_owned()
    } else {
        format!(
            "cargo run --release -p fairlock-bench -- {}",
            args.join(" ")
        )
    };
    Ok(RunInfo {
        kind: "run",
        mode: plan.mode,
        command,
        date_utc: utc_now(),
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        redis_version: admin.version().await?,
        clients: plan.clients,
        window_s: plan.measure.as_secs_f64(),
        rounds: plan.rounds,
        busy_cpus: plan.busy_cpus,
        duration_s: 0.0,
    })
}

/// The current UTC time as `YYYY-MM-DD HH:MM`.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60
    )
}
