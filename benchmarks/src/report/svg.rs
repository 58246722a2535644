//! Drawing one SVG line chart (plotters, SVG backend only), with linear
//! or log axes; `charts.rs` decides which charts a run gets.

use std::path::Path;

use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;

use crate::impls::Result;

/// One line on a chart: its label and its points.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];
const SIZE: (u32, u32) = (900, 540);

fn plot_error(e: impl std::fmt::Display) -> crate::impls::BenchError {
    format!("chart: {e}").into()
}

/// How an axis is scaled.
#[derive(Clone, Copy)]
pub enum Axis {
    /// Linear from 0.
    Linear,
    /// Logarithmic.
    Log,
}

/// What a chart shows and how its axes are scaled.
pub struct Chart<'a> {
    /// Caption.
    pub title: &'a str,
    /// X axis description.
    pub x_desc: &'a str,
    /// Y axis description.
    pub y_desc: &'a str,
    /// X axis scale.
    pub x_axis: Axis,
    /// Y axis scale.
    pub y_axis: Axis,
    /// Whether to mark each point (off for dense lines such as a CDF).
    pub markers: bool,
    /// Where the legend goes (somewhere the lines are not).
    pub legend: SeriesLabelPosition,
}

/// Tick labels without needless decimals: 1, 10, 250, 0.1, 0.05.
fn tick(value: &f64) -> String {
    let v = *value;
    if v == 0.0 || v.abs() >= 1.0 {
        format!("{v:.0}")
    } else {
        let text = format!("{v:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// A line chart of `series` written to `path`.
pub fn line_chart(path: &Path, spec: &Chart<'_>, series: &[Series]) -> Result<()> {
    let (title, x_axis, y_axis) = (spec.title, spec.x_axis, spec.y_axis);
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        if x.is_finite() && y.is_finite() {
            x_min = x_min.min(x);
            x_max = x_max.max(x);
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
    }
    if x_min > x_max {
        return Ok(()); // nothing to draw
    }
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(70);
    let range = |axis: Axis, lo: f64, hi: f64| match axis {
        Axis::Linear => (0.0, (hi * 1.08).max(1e-9)),
        Axis::Log => {
            let lo = lo.max(1e-3);
            (lo / 1.5, (hi * 1.5).max(lo * 2.0))
        }
    };
    let (x0, x1) = range(x_axis, x_min, x_max);
    let (y0, y1) = range(y_axis, y_min, y_max);
    // plotters needs one concrete coordinate type per chart: four cases.
    match (x_axis, y_axis) {
        (Axis::Linear, Axis::Linear) => {
            let chart = builder
                .build_cartesian_2d(x0..x1, y0..y1)
                .map_err(plot_error)?;
            draw(chart, spec, series, (x0, y0))
        }
        (Axis::Log, Axis::Linear) => {
            let chart = builder
                .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
                .map_err(plot_error)?;
            draw(chart, spec, series, (x0, y0))
        }
        (Axis::Linear, Axis::Log) => {
            let chart = builder
                .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
                .map_err(plot_error)?;
            draw(chart, spec, series, (x0, y0))
        }
        (Axis::Log, Axis::Log) => {
            let chart = builder
                .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
                .map_err(plot_error)?;
            draw(chart, spec, series, (x0, y0))
        }
    }?;
    root.present().map_err(plot_error)?;
    Ok(())
}

fn draw<'a, X, Y>(
    mut chart: ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    spec: &Chart<'_>,
    series: &[Series],
    floor: (f64, f64),
) -> Result<()>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(spec.x_desc)
        .y_desc(spec.y_desc)
        .label_style(("sans-serif", 14))
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()
        .map_err(plot_error)?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| (x.max(floor.0), y.max(floor.1)))
            .collect();
        chart
            .draw_series(
                LineSeries::new(points, color.stroke_width(2)).point_size(if spec.markers {
                    3
                } else {
                    0
                }),
            )
            .map_err(plot_error)?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(spec.legend.clone())
        .draw()
        .map_err(plot_error)?;
    Ok(())
}
