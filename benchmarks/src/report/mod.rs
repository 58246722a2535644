//! The results of a run, written to the output directory:
//!
//! | file | what |
//! |---|---|
//! | `records.rs` | the serialisable records, one per line of `results.jsonl` |
//! | `markdown.rs` | `results.md`: the tables |
//! | `targets.rs` | the targets: measured value, pass or miss, margin |
//! | `topologies.rs` | `topologies.md`, the tables of a `--topologies` run |
//! | `charts.rs` | which charts are drawn, from which cells |
//! | `svg.rs` | drawing one SVG line chart (plotters) |
//! | `format.rs` | number formatting shared by the above |
//!
//! Dependencies run one way: `records` is read by the others, `markdown`
//! uses `targets`, nothing uses `markdown` but [`write_all`].

mod charts;
mod format;
mod markdown;
mod records;
mod svg;
mod targets;
pub mod topologies;

use std::path::Path;

use crate::impls::Result;

pub use records::{CellRecord, Results, RunInfo, UncontendedRecord, WaitersRecord};

/// Writes results.jsonl, results.md and the charts into `dir`; returns
/// the markdown.
pub fn write_all(results: &Results, dir: &Path) -> Result<String> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("results.jsonl"), results.to_jsonl()?)?;
    let charts = charts::write_charts(results, dir)?;
    let markdown = markdown::document(results, &charts);
    std::fs::write(dir.join("results.md"), &markdown)?;
    Ok(markdown)
}
