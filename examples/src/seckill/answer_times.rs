//! How long the service took to answer, per status code, measured inside
//! the service: from the handler's start (the request is read) to the
//! answer. `ab` measures from its connect, so at ten thousand connections
//! its figures include the time a request waited to be accepted and read;
//! this one shows what the sale itself cost, and how fast a 429 goes out.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

use super::stats::percentile;

/// Samples kept per way of selling; later answers are counted, not timed.
const MAX_SAMPLES: usize = 1_000_000;

/// Answer times of one way of selling, by status code.
#[derive(Debug, Default)]
pub struct AnswerTimes {
    by_status: Mutex<BTreeMap<u16, Vec<Duration>>>,
}

impl AnswerTimes {
    /// One answer with `status` took `took`.
    pub fn record(&self, status: u16, took: Duration) {
        let mut table = self.by_status.lock().unwrap_or_else(|p| p.into_inner());
        let kept: usize = table.values().map(Vec::len).sum();
        if kept < MAX_SAMPLES {
            table.entry(status).or_default().push(took);
        }
    }

    /// `{"200": {"n": .., "p50": .., "p99": .., "max": ..}, ...}` in
    /// milliseconds with two decimals.
    pub fn summary(&self) -> Value {
        let table = self.by_status.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = serde_json::Map::new();
        for (status, times) in table.iter() {
            let mut sorted = times.clone();
            sorted.sort_unstable();
            let ms = |d: Duration| (d.as_secs_f64() * 100_000.0).round() / 100.0;
            out.insert(
                status.to_string(),
                json!({
                    "n": sorted.len(),
                    "p50": ms(percentile(&sorted, 0.50)),
                    "p99": ms(percentile(&sorted, 0.99)),
                    "max": ms(percentile(&sorted, 1.0)),
                }),
            );
        }
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_summarised_per_status() {
        let times = AnswerTimes::default();
        for ms in 1..=100 {
            times.record(200, Duration::from_millis(ms));
        }
        times.record(429, Duration::from_micros(250));
        let summary = times.summary();
        assert_eq!(summary["200"]["n"], 100);
        assert_eq!(summary["200"]["p50"], 51.0);
        assert_eq!(summary["200"]["max"], 100.0);
        assert_eq!(summary["429"]["p50"], 0.25);
    }
}
