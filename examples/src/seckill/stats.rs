//! The numbers a run reports: percentiles and Jain's fairness index.

use std::time::Duration;

/// The `p` quantile (0.0..=1.0) of `sorted` by nearest rank; zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Jain's fairness index of `shares`: 1.0 when everyone got the same,
/// down to `1/n` when one got everything; 0.0 when nobody got anything.
pub fn jain_index(shares: &[u64]) -> f64 {
    let sum: f64 = shares.iter().map(|&s| s as f64).sum();
    let squares: f64 = shares.iter().map(|&s| (s as f64).powi(2)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (shares.len() as f64 * squares)
}

/// `p50 1.2ms  p99 3.4ms  max 5.6ms` of `sorted`.
pub fn summary(sorted: &[Duration]) -> String {
    format!(
        "p50 {}  p99 {}  max {}",
        millis(percentile(sorted, 0.50)),
        millis(percentile(sorted, 0.99)),
        millis(percentile(sorted, 1.0))
    )
}

/// A duration in milliseconds with one decimal, e.g. `12.3ms`.
pub fn millis(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index_bounds() {
        assert!((jain_index(&[5, 5, 5, 5]) - 1.0).abs() < 1e-9);
        assert!((jain_index(&[8, 0, 0, 0]) - 0.25).abs() < 1e-9);
        assert_eq!(jain_index(&[0, 0]), 0.0);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&d, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
