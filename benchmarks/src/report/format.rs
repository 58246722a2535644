//! Number formatting shared by the console summary and results.md.

/// A duration in ms as people read it: "-" (not measured), "1.23 s",
/// "12.3 ms", "1.23 ms" or "456 µs".
pub fn fmt_ms(value: Option<f64>) -> String {
    match value {
        None => "-".to_owned(),
        Some(v) if v >= 1000.0 => format!("{:.2} s", v / 1000.0),
        Some(v) if v >= 10.0 => format!("{v:.1} ms"),
        Some(v) if v >= 1.0 => format!("{v:.2} ms"),
        Some(v) => format!("{:.0} µs", v * 1000.0),
    }
}

/// The cycles/s of a cell's rounds as the reports list them, in the order
/// they ran: "700 / 650"; "-" if it ran once.
pub fn fmt_rounds(rounds: &[f64]) -> String {
    if rounds.is_empty() {
        return "-".to_owned();
    }
    let rounds: Vec<String> = rounds.iter().map(|r| format!("{r:.0}")).collect();
    rounds.join(" / ")
}
