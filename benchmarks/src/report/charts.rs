//! Which charts a run gets: the wait-time CDF at C=64, H=1 ms, and
//! throughput and commands per cycle against C for each hold time that has
//! at least two values of C. The drawing itself is in `svg.rs`.

use std::path::Path;

use plotters::prelude::SeriesLabelPosition;

use super::records::{CellRecord, Results};
use super::svg::{line_chart, Axis, Chart, Series};
use crate::impls::{Implementation, Result};

fn hold_tag(hold_ms: f64) -> String {
    format!("h{}ms", hold_ms.round() as u64)
}

/// Draws the run's charts into `dir`; returns (title, file name) of each
/// chart written, for results.md.
pub fn write_charts(results: &Results, dir: &Path) -> Result<Vec<(String, String)>> {
    let mut written = Vec::new();
    let cdf_cells: Vec<&CellRecord> = results
        .cells
        .iter()
        .filter(|c| c.contenders == 64 && (c.hold_ms - 1.0).abs() < 1e-9)
        .collect();
    if !cdf_cells.is_empty() {
        let series: Vec<Series> = cdf_cells
            .iter()
            .map(|c| Series {
                label: c.implementation.to_owned(),
                points: c.wait_cdf.clone(),
            })
            .collect();
        let file = "wait_cdf_c64_h1ms.svg";
        line_chart(
            &dir.join(file),
            &Chart {
                title: "Wait time CDF, one hot lock, C=64, H=1 ms",
                x_desc: "wait (ms, log scale)",
                y_desc: "fraction of acquisitions",
                x_axis: Axis::Log,
                y_axis: Axis::Linear,
                markers: false,
                legend: SeriesLabelPosition::LowerRight,
            },
            &series,
        )?;
        written.push(("Wait-time CDF at C=64, H=1 ms".to_owned(), file.to_owned()));
    }

    let mut holds: Vec<f64> = results.cells.iter().map(|c| c.hold_ms).collect();
    holds.sort_by(f64::total_cmp);
    holds.dedup();
    for hold in holds {
        let cells: Vec<&CellRecord> = results.cells.iter().filter(|c| c.hold_ms == hold).collect();
        let mut cs: Vec<usize> = cells.iter().map(|c| c.contenders).collect();
        cs.sort_unstable();
        cs.dedup();
        if cs.len() < 2 {
            continue;
        }
        let per_impl = |value: fn(&CellRecord) -> f64| -> Vec<Series> {
            Implementation::ALL
                .iter()
                .map(|imp| Series {
                    label: imp.label().to_owned(),
                    points: cells
                        .iter()
                        .filter(|c| c.implementation == imp.label())
                        .map(|c| (c.contenders as f64, value(c)))
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect()
        };
        let tag = hold_tag(hold);
        let file = format!("throughput_{tag}.svg");
        line_chart(
            &dir.join(&file),
            &Chart {
                title: &format!("Throughput vs contenders, one hot lock, H={hold} ms"),
                x_desc: "contenders C (log scale)",
                y_desc: "cycles/s",
                x_axis: Axis::Log,
                y_axis: Axis::Linear,
                markers: true,
                legend: SeriesLabelPosition::LowerLeft,
            },
            &per_impl(|c| c.cycles_per_s),
        )?;
        written.push((format!("Throughput vs C, H={hold} ms"), file));
        let file = format!("commands_per_cycle_{tag}.svg");
        line_chart(
            &dir.join(&file),
            &Chart {
                title: &format!("Redis commands sent per cycle (lock part), H={hold} ms"),
                x_desc: "contenders C (log scale)",
                y_desc: "top-level commands per cycle (log scale)",
                x_axis: Axis::Log,
                y_axis: Axis::Log,
                markers: true,
                legend: SeriesLabelPosition::UpperLeft,
            },
            &per_impl(|c| c.cmds_top_level_per_cycle),
        )?;
        written.push((format!("Redis commands per cycle vs C, H={hold} ms"), file));
    }
    Ok(written)
}
